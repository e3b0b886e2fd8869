"""Memory records and audit events hold no database foreign key into contexts, messages or steps.

On Citus those are distributed; memory records (a key-subset memory belongs to no context) and
audit events (the operator's trail, coordinator only) are reference or local tables, and Citus
refuses a foreign key from such a table into a distributed one. Django keeps following them
(`db_constraint=False`): it cascades a context's memories, nulls a deleted message's or step's
provenance and a deleted context's audit events, as every delete of those goes through it.

With nothing left pointing at a message or a step by `id` alone, their `message_id_unique` and
`step_id_unique` constraints (kept by migration 0020 for those keys) go: the primary keys
`(id, context_id)` remain, each led by `id`.

Carrying a store over: dropping constraints only, no row is read or written; each statement
takes its table's ACCESS EXCLUSIVE lock for an instant. Reversible: back to 0025 the unique
constraints are built again (an index build over messages and over steps), then the foreign
keys, each validated by reading its table.
Frozen: the SQL is written out here.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0031_split_vector_tables"),
    ]

    operations = [
        # The keys first (they depend on the unique constraints), then the constraints.
        migrations.AlterField(
            model_name="auditevent",
            name="context",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="audit_events",
                to="memory_app.context",
            ),
        ),
        migrations.AlterField(
            model_name="memoryrecord",
            name="context",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="memory_records",
                to="memory_app.context",
            ),
        ),
        migrations.AlterField(
            model_name="memoryrecord",
            name="source_message",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="memory_records",
                to="memory_app.message",
            ),
        ),
        migrations.AlterField(
            model_name="memoryrecord",
            name="source_step",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="memory_records",
                to="memory_app.step",
            ),
        ),
        migrations.RunSQL(
            "ALTER TABLE memory_app_message DROP CONSTRAINT message_id_unique;"
            " ALTER TABLE memory_app_step DROP CONSTRAINT step_id_unique;",
            reverse_sql="ALTER TABLE memory_app_message ADD CONSTRAINT message_id_unique UNIQUE (id)"
            " WITH (fillfactor = 100);"
            " ALTER TABLE memory_app_step ADD CONSTRAINT step_id_unique UNIQUE (id);",
        ),
    ]
