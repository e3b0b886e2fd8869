"""The full-text GIN indexes keep a pending list of 1 MB instead of PostgreSQL's 4 MB
(`memory_app.models.shared.PENDING_LIST_KB`): every search reads the list whole.

The setting is changed in place (`ALTER INDEX ... SET`), which rebuilds nothing: it holds each
index's ACCESS EXCLUSIVE lock for an instant, so it waits for the searches and writes running
on its table, and those that come meanwhile wait for it. On a distributed store Citus passes it
on to the shards' indexes. Django would drop and build the indexes again for a changed option:
only its record of them changes so."""

import django.contrib.postgres.indexes
from django.db import migrations

INDEXES = {"memoryrecord": "memory_fts_gin", "messagesearch": "message_search_gin"}
PENDING_LIST_KB = 1024


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0046_statement_on_a_context_shards")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f"ALTER INDEX {name} SET (gin_pending_list_limit = {PENDING_LIST_KB})",
                    f"ALTER INDEX {name} RESET (gin_pending_list_limit)",
                )
                for name in INDEXES.values()
            ],
            state_operations=[
                operation
                for model, name in INDEXES.items()
                for operation in (
                    migrations.RemoveIndex(model_name=model, name=name),
                    migrations.AddIndex(
                        model_name=model,
                        index=django.contrib.postgres.indexes.GinIndex(
                            fields=["search_vector"],
                            name=name,
                            gin_pending_list_limit=PENDING_LIST_KB,
                        ),
                    ),
                )
            ],
        )
    ]
