"""Index review after 0013: the message and embedding primary keys only grow at
their right end (ids from a sequence), so leaf pages split there keep 100 % of their entries
instead of 90 %.

`message_live_recent_idx` stays, though it looks like a copy of the unique (context, seq) index
that PostgreSQL walks backwards as well: on a context whose history is pruned (AgentScope's
`clear()` and `load_state_dict` prune the whole history) the unique index would walk every
pruned row to find the live ones, where the partial index skips them.
"""

from django.db import migrations

FILLFACTOR = """
ALTER INDEX memory_app_message_pkey SET (fillfactor = 100);
ALTER INDEX memory_app_embedding_pkey SET (fillfactor = 100);
"""
FILLFACTOR_RESET = """
ALTER INDEX memory_app_message_pkey RESET (fillfactor);
ALTER INDEX memory_app_embedding_pkey RESET (fillfactor);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0013_message_search_table"),
    ]

    operations = [
        migrations.RunSQL(FILLFACTOR, FILLFACTOR_RESET),
    ]
