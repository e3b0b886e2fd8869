"""Rows of one context carry `context_id` in their keys: the shape Citus distributes by context.

Steps, tool calls and embedding retries get a `context_id` column, copied from their run, step
and embedding. The primary keys of runs, steps, tool calls, messages and trace spans become
`(id, context_id)`, their unique constraints take `context_id` in, and the foreign keys between
them become composite, `(run_id, context_id) REFERENCES run (id, context_id)`, so a row can only
point at a row of its own context. Citus asks only that the distribution column be in every key;
`id` stays first so that what Django follows by `id` alone (a save, a cascade by `run_id`) reads
the same index as before.

Django keeps `id` as the primary key it follows and its foreign keys with `db_constraint=False`
(it cannot point a ForeignKey at a composite key): the database's keys are written here, the
models' state is changed beside them.

Left keyed by `id` alone, for what still has rows without a context: memory records, embeddings
and their retries (a key-subset memory has no context) and audit events. Messages and steps keep
a `UNIQUE (id)` besides their new key, for the memory records' and embeddings' foreign keys to
them.

Frozen: the SQL is written out here. Locks: the first statement takes the ACCESS EXCLUSIVE lock
of steps, and the others follow, each held to the end of the migration (docs/scale-out.md says
how long that is per million rows).
"""

import django.db.models.deletion
from django.db import migrations, models

# Every foreign key to runs, steps and messages goes first (they hang on the primary keys about to
# be replaced), whatever its name.
DROP_FKS_TO_REKEYED = """
DO $$
DECLARE fk record;
BEGIN
    FOR fk IN
        SELECT conrelid::regclass AS tbl, conname FROM pg_constraint
        WHERE contype = 'f' AND confrelid IN (
            'memory_app_run'::regclass, 'memory_app_step'::regclass,
            'memory_app_message'::regclass)
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', fk.tbl, fk.conname);
    END LOOP;
END $$;
"""

FORWARD_SQL = (
    """
ALTER TABLE memory_app_step ADD COLUMN context_id bigint;
UPDATE memory_app_step s SET context_id = r.context_id
    FROM memory_app_run r WHERE r.id = s.run_id;
ALTER TABLE memory_app_step ALTER COLUMN context_id SET NOT NULL;

ALTER TABLE memory_app_toolcall ADD COLUMN context_id bigint;
UPDATE memory_app_toolcall t SET context_id = s.context_id
    FROM memory_app_step s WHERE s.id = t.step_id;
ALTER TABLE memory_app_toolcall ALTER COLUMN context_id SET NOT NULL;

-- NULL where the embedding is a key-subset memory's, which has no context.
ALTER TABLE memory_app_embeddingretry ADD COLUMN context_id bigint;
UPDATE memory_app_embeddingretry t SET context_id = e.context_id
    FROM memory_app_embedding e WHERE e.id = t.embedding_id;
"""
    + DROP_FKS_TO_REKEYED
    + """
ALTER TABLE memory_app_run DROP CONSTRAINT memory_app_run_pkey,
    ADD CONSTRAINT memory_app_run_pkey PRIMARY KEY (id, context_id);

ALTER TABLE memory_app_step DROP CONSTRAINT memory_app_step_pkey,
    ADD CONSTRAINT memory_app_step_pkey PRIMARY KEY (id, context_id),
    ADD CONSTRAINT step_id_unique UNIQUE (id),
    DROP CONSTRAINT step_run_position_unique,
    ADD CONSTRAINT step_run_position_unique UNIQUE (run_id, position, context_id);
DROP INDEX step_client_id_unique;
CREATE UNIQUE INDEX step_client_id_unique ON memory_app_step (run_id, client_id, context_id)
    WHERE client_id IS NOT NULL;

ALTER TABLE memory_app_toolcall DROP CONSTRAINT memory_app_toolcall_pkey,
    ADD CONSTRAINT memory_app_toolcall_pkey PRIMARY KEY (id, context_id),
    DROP CONSTRAINT toolcall_step_position_unique,
    ADD CONSTRAINT toolcall_step_position_unique UNIQUE (step_id, position, context_id);

-- Ids only grow: leaf pages split at the right end keep all their entries (as in 0014).
ALTER TABLE memory_app_message DROP CONSTRAINT memory_app_message_pkey,
    ADD CONSTRAINT memory_app_message_pkey PRIMARY KEY (id, context_id) WITH (fillfactor = 100),
    ADD CONSTRAINT message_id_unique UNIQUE (id) WITH (fillfactor = 100);

ALTER TABLE memory_app_tracespan DROP CONSTRAINT memory_app_tracespan_pkey,
    ADD CONSTRAINT memory_app_tracespan_pkey PRIMARY KEY (id, context_id);

ALTER TABLE memory_app_step ADD CONSTRAINT step_run_fk FOREIGN KEY (run_id, context_id)
    REFERENCES memory_app_run (id, context_id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_toolcall ADD CONSTRAINT toolcall_step_fk FOREIGN KEY (step_id, context_id)
    REFERENCES memory_app_step (id, context_id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_message ADD CONSTRAINT message_run_fk FOREIGN KEY (run_id, context_id)
    REFERENCES memory_app_run (id, context_id) DEFERRABLE INITIALLY DEFERRED,
    ADD CONSTRAINT message_step_fk FOREIGN KEY (step_id, context_id)
    REFERENCES memory_app_step (id, context_id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_tracespan ADD CONSTRAINT tracespan_run_fk FOREIGN KEY (run_id, context_id)
    REFERENCES memory_app_run (id, context_id) DEFERRABLE INITIALLY DEFERRED;
"""
    + """
-- From tables whose rows may have no context: by id alone, as Django named them.
ALTER TABLE memory_app_embedding
    ADD CONSTRAINT memory_app_embedding_message_id_03b490df_fk_memory_ap
    FOREIGN KEY (message_id) REFERENCES memory_app_message (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_memoryrecord
    ADD CONSTRAINT memory_app_memoryrec_source_message_id_0335bde1_fk_memory_ap
    FOREIGN KEY (source_message_id) REFERENCES memory_app_message (id)
    DEFERRABLE INITIALLY DEFERRED,
    ADD CONSTRAINT memory_app_memoryrec_source_step_id_09aeca46_fk_memory_ap
    FOREIGN KEY (source_step_id) REFERENCES memory_app_step (id) DEFERRABLE INITIALLY DEFERRED;
"""
)

# Back to the keys and constraints of migration 0019, with Django's names.
REVERSE_SQL = (
    DROP_FKS_TO_REKEYED
    + """
ALTER TABLE memory_app_run DROP CONSTRAINT memory_app_run_pkey,
    ADD CONSTRAINT memory_app_run_pkey PRIMARY KEY (id);
ALTER TABLE memory_app_step DROP CONSTRAINT memory_app_step_pkey,
    DROP CONSTRAINT step_id_unique,
    ADD CONSTRAINT memory_app_step_pkey PRIMARY KEY (id),
    DROP CONSTRAINT step_run_position_unique,
    ADD CONSTRAINT step_run_position_unique UNIQUE (run_id, position);
DROP INDEX step_client_id_unique;
CREATE UNIQUE INDEX step_client_id_unique ON memory_app_step (run_id, client_id)
    WHERE client_id IS NOT NULL;
ALTER TABLE memory_app_toolcall DROP CONSTRAINT memory_app_toolcall_pkey,
    ADD CONSTRAINT memory_app_toolcall_pkey PRIMARY KEY (id),
    DROP CONSTRAINT toolcall_step_position_unique,
    ADD CONSTRAINT toolcall_step_position_unique UNIQUE (step_id, position);
ALTER TABLE memory_app_message DROP CONSTRAINT memory_app_message_pkey,
    DROP CONSTRAINT message_id_unique,
    ADD CONSTRAINT memory_app_message_pkey PRIMARY KEY (id) WITH (fillfactor = 100);
ALTER TABLE memory_app_tracespan DROP CONSTRAINT memory_app_tracespan_pkey,
    ADD CONSTRAINT memory_app_tracespan_pkey PRIMARY KEY (id);

ALTER TABLE memory_app_step DROP COLUMN context_id;
ALTER TABLE memory_app_toolcall DROP COLUMN context_id;
ALTER TABLE memory_app_embeddingretry DROP COLUMN context_id;

ALTER TABLE memory_app_message
    ADD CONSTRAINT memory_app_message_run_id_68df5b49_fk_memory_app_run_id
    FOREIGN KEY (run_id) REFERENCES memory_app_run (id) DEFERRABLE INITIALLY DEFERRED,
    ADD CONSTRAINT memory_app_message_step_id_c8a3c91d_fk_memory_app_step_id
    FOREIGN KEY (step_id) REFERENCES memory_app_step (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_step
    ADD CONSTRAINT memory_app_step_run_id_4496a486_fk_memory_app_run_id
    FOREIGN KEY (run_id) REFERENCES memory_app_run (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_toolcall
    ADD CONSTRAINT memory_app_toolcall_step_id_1fd4ea87_fk_memory_app_step_id
    FOREIGN KEY (step_id) REFERENCES memory_app_step (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_tracespan
    ADD CONSTRAINT memory_app_tracespan_run_id_0cb7f2e4_fk_memory_app_run_id
    FOREIGN KEY (run_id) REFERENCES memory_app_run (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_embedding
    ADD CONSTRAINT memory_app_embedding_message_id_03b490df_fk_memory_ap
    FOREIGN KEY (message_id) REFERENCES memory_app_message (id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_memoryrecord
    ADD CONSTRAINT memory_app_memoryrec_source_message_id_0335bde1_fk_memory_ap
    FOREIGN KEY (source_message_id) REFERENCES memory_app_message (id)
    DEFERRABLE INITIALLY DEFERRED,
    ADD CONSTRAINT memory_app_memoryrec_source_step_id_09aeca46_fk_memory_ap
    FOREIGN KEY (source_step_id) REFERENCES memory_app_step (id) DEFERRABLE INITIALLY DEFERRED;
"""
)


def context_of_row():
    """A row's context as the models see it: the database's composite foreign keys hold it to its
    run's (or step's), so Django neither constrains nor cascades it."""
    return models.ForeignKey(
        db_constraint=False,
        db_index=False,
        on_delete=django.db.models.deletion.DO_NOTHING,
        related_name="+",
        to="memory_app.context",
    )


def followed_by_id(to, *, on_delete, related_name, null=False):
    """A foreign key Django follows by `id`; the database's is composite (written above)."""
    return models.ForeignKey(
        blank=null,
        null=null,
        db_constraint=False,
        db_index=False,
        on_delete=on_delete,
        related_name=related_name,
        to=to,
    )


STATE_OPERATIONS = [
    migrations.AddField(model_name="step", name="context", field=context_of_row()),
    migrations.AddField(model_name="toolcall", name="context", field=context_of_row()),
    migrations.AddField(
        model_name="embeddingretry",
        name="context",
        field=models.ForeignKey(
            blank=True,
            null=True,
            db_constraint=False,
            db_index=False,
            on_delete=django.db.models.deletion.DO_NOTHING,
            related_name="+",
            to="memory_app.context",
        ),
    ),
    migrations.AlterField(
        model_name="step",
        name="run",
        field=followed_by_id(
            "memory_app.run", on_delete=django.db.models.deletion.CASCADE, related_name="steps"
        ),
    ),
    migrations.AlterField(
        model_name="toolcall",
        name="step",
        field=followed_by_id(
            "memory_app.step", on_delete=django.db.models.deletion.CASCADE, related_name="tool_calls"
        ),
    ),
    migrations.AlterField(
        model_name="message",
        name="run",
        field=followed_by_id(
            "memory_app.run",
            on_delete=django.db.models.deletion.SET_NULL,
            related_name="messages",
            null=True,
        ),
    ),
    migrations.AlterField(
        model_name="message",
        name="step",
        field=followed_by_id(
            "memory_app.step",
            on_delete=django.db.models.deletion.SET_NULL,
            related_name="messages",
            null=True,
        ),
    ),
    migrations.AlterField(
        model_name="tracespan",
        name="run",
        field=models.ForeignKey(
            blank=True,
            null=True,
            db_constraint=False,
            on_delete=django.db.models.deletion.CASCADE,
            related_name="+",
            to="memory_app.run",
        ),
    ),
    migrations.RemoveConstraint(model_name="step", name="step_run_position_unique"),
    migrations.RemoveConstraint(model_name="step", name="step_client_id_unique"),
    migrations.RemoveConstraint(model_name="toolcall", name="toolcall_step_position_unique"),
    migrations.AddConstraint(
        model_name="step",
        constraint=models.UniqueConstraint(
            fields=("run", "position", "context"), name="step_run_position_unique"
        ),
    ),
    migrations.AddConstraint(
        model_name="step",
        constraint=models.UniqueConstraint(
            condition=models.Q(("client_id__isnull", False)),
            fields=("run", "client_id", "context"),
            name="step_client_id_unique",
        ),
    ),
    migrations.AddConstraint(
        model_name="toolcall",
        constraint=models.UniqueConstraint(
            fields=("step", "position", "context"), name="toolcall_step_position_unique"
        ),
    ),
]


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0019_bounded_search_vectors"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD_SQL, REVERSE_SQL)],
            state_operations=STATE_OPERATIONS,
        ),
    ]
