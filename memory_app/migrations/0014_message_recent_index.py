"""Index review after 0013 (issue 11.4).

- `message_live_recent_idx` (context, seq DESC) WHERE pruned_at IS NULL duplicated the unique
  (context, seq) index, which PostgreSQL walks backwards as well: the latest live messages, the
  keyword search's unparsed messages and composite's last user message read the same pages
  through it (pruned rows are skipped at the heap; measured on the 100,000-message benchmark
  context: the same buffers, the same time). 3.0 MB per 100,000 messages.
- The message and embedding primary keys only grow at their right end (ids from a sequence):
  leaf pages split there keep 100 % of their entries instead of 90 %.
"""

from django.contrib.postgres.operations import RemoveIndexConcurrently
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
    atomic = False

    dependencies = [
        ("memory_app", "0013_message_search_table"),
    ]

    operations = [
        RemoveIndexConcurrently(model_name="message", name="message_live_recent_idx"),
        migrations.RunSQL(FILLFACTOR, FILLFACTOR_RESET),
    ]
