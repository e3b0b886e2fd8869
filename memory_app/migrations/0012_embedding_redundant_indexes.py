"""Drop the embedding table's single-column indexes on message, memory_record and context (issue
11.4): the unique (message_id, model) and (memory_record_id, model) indexes and
(context_id, model) lead with the same columns and serve the same lookups and cascades. At a
million vectors they were ~44 MB, 3.6 MB per 100,000 messages.

The names are Django's, the same on every installation (a hash of table and column)."""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = {
    "memory_app_embedding_context_id_453b4e8b": "context_id",
    "memory_app_embedding_memory_record_id_441adfe2": "memory_record_id",
    "memory_app_embedding_message_id_03b490df": "message_id",
}


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0011_deferred_hnsw"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f"DROP INDEX IF EXISTS {name}",
                    f"CREATE INDEX IF NOT EXISTS {name} ON memory_app_embedding ({column})",
                )
                for name, column in INDEXES.items()
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="embedding",
                    name="context",
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name="+", to="memory_app.context"),
                ),
                migrations.AlterField(
                    model_name="embedding",
                    name="memory_record",
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name="embeddings", to="memory_app.memoryrecord"),
                ),
                migrations.AlterField(
                    model_name="embedding",
                    name="message",
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name="embeddings", to="memory_app.message"),
                ),
            ],
        ),
    ]
