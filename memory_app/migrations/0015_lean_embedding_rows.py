"""Five 384-d embedding rows to a page instead of four(storage per 100,000 messages).

A row held thirteen columns: the queue's bookkeeping (`attempts`, `next_attempt_at`,
`last_error`) and two timestamps beside the vector. With more than eight columns the tuple header
is 32 bytes, and the row (1,649 bytes) left four to a page. The bookkeeping moves to
`EmbeddingRetry`, which holds a row only for an item whose provider call failed; the timestamps
go (nothing read them). Eight columns make the row 1,617 bytes with a 24-byte header: five to a
page, about 41 MB less per 100,000 vectors.

Dropping the columns in place would not do it: PostgreSQL keeps a dropped column in every
tuple's column count, so the header would stay 32 bytes. The table is rebuilt instead: the old
one is renamed, the new one created from the model, the rows copied in id order, the pending
failures copied into `EmbeddingRetry`, and every model's HNSW index built again on the new
table (with the configured m and ef_construction). It takes its locks first, in one order:
writes of messages, memories and contexts wait while it runs, searches of vectors too (the
HNSW build is most of it: 11 min for 1,200,000 384-d vectors on 2 cores with
`maintenance_work_mem` 4GB); stop the workers, or let them wait. Reversible: going back adds
the columns again (a failed item gets its attempts back) without rewriting the rows.
"""

import hashlib

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from psycopg import sql

COLUMNS = "id, message_id, memory_record_id, context_id, model, dimensions, vector, indexed"

# What this migration builds, as the code built it when the migration was written (from
# memory_app/embeddings/indexer.py, kept here so that a later change there never changes this step): each
# model's partial HNSW index, cosine on `vector::halfvec(D)`, of the model's `indexed` rows; m and
# ef_construction are the configured ones.
HNSW_MAX_DIMENSIONS = 2000


def index_name(model, dimensions, prefix):
    return f"{prefix}{hashlib.sha1(model.encode()).hexdigest()[:12]}_{dimensions}"  # noqa: S324


def replace_model_indexes(db, *, prefix, retired):
    """Build every model's index (named with `prefix`), then drop the indexes named with a
    `retired` prefix once the new ones serve; CONCURRENTLY outside a transaction, so the store
    stays readable and writable meanwhile."""
    concurrently = not db.in_atomic_block
    drop = "DROP INDEX CONCURRENTLY" if concurrently else "DROP INDEX"
    with db.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT model, dimensions FROM memory_app_embedding"
            " WHERE vector IS NOT NULL AND dimensions BETWEEN 1 AND %s",
            [HNSW_MAX_DIMENSIONS],
        )
        for model, dims in cursor.fetchall():
            statement = sql.SQL(
                "CREATE INDEX {concurrently} IF NOT EXISTS {name} ON memory_app_embedding "
                "USING hnsw ((vector::halfvec({dims})) halfvec_cosine_ops) "
                "WITH (m = {m}, ef_construction = {efc}) "
                "WHERE model = {model} AND dimensions = {dims} AND indexed"
            ).format(
                concurrently=sql.SQL("CONCURRENTLY" if concurrently else ""),
                name=sql.Identifier(index_name(model, dims, prefix)),
                dims=sql.Literal(int(dims)),
                m=sql.Literal(int(settings.AGENTMEMORY_HNSW_M)),
                efc=sql.Literal(int(settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION)),
                model=sql.Literal(model),
            )
            cursor.execute(statement.as_string(db.connection))
        for old in retired:
            cursor.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'memory_app_embedding'"
                " AND indexname LIKE %s",
                [old.replace("_", r"\_") + "%"],
            )
            for (name,) in cursor.fetchall():
                cursor.execute(f'{drop} IF EXISTS "{name}"')


def rebuild_table(apps, schema_editor):
    embedding = apps.get_model("memory_app", "Embedding")
    with schema_editor.connection.cursor() as cursor:
        # The foreign keys made at the end lock the tables they reference: locked here first,
        # before the embeddings, so an appender queueing an embedding waits instead of holding
        # one of them while it waits for the embeddings (a deadlock after the whole build).
        cursor.execute(
            "LOCK TABLE memory_app_message, memory_app_memoryrecord, memory_app_context"
            " IN SHARE ROW EXCLUSIVE MODE"
        )
        cursor.execute("LOCK TABLE memory_app_embedding IN ACCESS EXCLUSIVE MODE")
        # Index and sequence names are schema-wide: the old table's are renamed or dropped
        # before the new table takes them (its secondary indexes are rebuilt below).
        cursor.execute(
            "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
            " WHERE x.indrelid = 'memory_app_embedding'::regclass AND NOT x.indisprimary"
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f'DROP INDEX "{name}"')
        cursor.execute("SELECT pg_get_serial_sequence('memory_app_embedding', 'id')")
        (sequence,) = cursor.fetchone()
        cursor.execute("ALTER TABLE memory_app_embedding RENAME TO memory_app_embedding_old")
        cursor.execute(
            "ALTER TABLE memory_app_embedding_old"
            " RENAME CONSTRAINT memory_app_embedding_pkey TO memory_app_embedding_old_pkey"
        )
        cursor.execute(f"ALTER SEQUENCE {sequence} RENAME TO memory_app_embedding_old_id_seq")
    # The new table with its primary key; its foreign keys and other indexes are created at the
    # end of the migration (Django defers them), after the copy.
    schema_editor.create_model(embedding)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("ALTER INDEX memory_app_embedding_pkey SET (fillfactor = 100)")  # as 0014
        cursor.execute(
            f"INSERT INTO memory_app_embedding ({COLUMNS})"  # noqa: S608 - constants
            f" SELECT {COLUMNS} FROM memory_app_embedding_old ORDER BY id"
        )
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('memory_app_embedding', 'id'),"
            " coalesce((SELECT max(id) FROM memory_app_embedding), 0) + 1, false)"
        )
        cursor.execute("ANALYZE memory_app_embedding")
    replace_model_indexes(schema_editor.connection, prefix="embedding_hnswi_", retired=[])


def pending_index_back(apps, schema_editor):
    """Back to 0014's pending index (the columns come back in the step after this one)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("DROP INDEX embedding_pending_idx")
        cursor.execute(
            "CREATE INDEX embedding_pending_idx ON memory_app_embedding (next_attempt_at, id)"
            " WHERE vector IS NULL"
        )


COPY_RETRIES = """
-- Cascades in the database, not in Django (see EmbeddingRetry): deletes of embeddings stay fast.
ALTER TABLE memory_app_embeddingretry ADD CONSTRAINT embeddingretry_embedding_fk
    FOREIGN KEY (embedding_id) REFERENCES memory_app_embedding (id)
    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
INSERT INTO memory_app_embeddingretry (embedding_id, attempts, next_attempt_at, last_error)
    SELECT id, attempts, coalesce(next_attempt_at, now()), last_error
    FROM memory_app_embedding_old WHERE vector IS NULL AND attempts > 0;
DROP TABLE memory_app_embedding_old;
"""
# Backwards: the columns again, at the end of the row (going back gives up the space saved).
# Constant defaults are stored once in the catalogue, not written into each row: only the
# pending rows are updated, once each (a second update of a row this transaction wrote would
# queue deferred foreign-key checks, and PostgreSQL refuses the ALTER TABLE after it).
COLUMNS_BACK = """
ALTER TABLE memory_app_embedding
    ADD COLUMN attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN next_attempt_at timestamp with time zone NULL,
    ADD COLUMN last_error text NOT NULL DEFAULT '',
    ADD COLUMN created_at timestamp with time zone NOT NULL DEFAULT now(),
    ADD COLUMN embedded_at timestamp with time zone NULL DEFAULT now();
UPDATE memory_app_embedding e SET
    embedded_at = NULL,
    attempts = coalesce(r.attempts, 0),
    next_attempt_at = r.next_attempt_at,
    last_error = coalesce(r.last_error, '')
    FROM memory_app_embedding p LEFT JOIN memory_app_embeddingretry r ON r.embedding_id = p.id
    WHERE e.vector IS NULL AND p.id = e.id;
ALTER TABLE memory_app_embedding
    ALTER COLUMN attempts DROP DEFAULT,
    ALTER COLUMN last_error DROP DEFAULT,
    ALTER COLUMN created_at DROP DEFAULT,
    ALTER COLUMN embedded_at DROP DEFAULT;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0014_append_only_pkeys"),
    ]

    operations = [
        # The model loses the columns here; the table itself is rebuilt by the next operation.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="embedding", name="embedding_pending_idx"),
                migrations.RemoveField(model_name="embedding", name="attempts"),
                migrations.RemoveField(model_name="embedding", name="created_at"),
                migrations.RemoveField(model_name="embedding", name="embedded_at"),
                migrations.RemoveField(model_name="embedding", name="last_error"),
                migrations.RemoveField(model_name="embedding", name="next_attempt_at"),
                migrations.AddIndex(
                    model_name="embedding",
                    index=models.Index(
                        condition=models.Q(("vector__isnull", True)),
                        fields=["model", "id"],
                        name="embedding_pending_idx",
                    ),
                ),
            ],
        ),
        migrations.RunPython(rebuild_table, pending_index_back),
        migrations.CreateModel(
            name="EmbeddingRetry",
            fields=[
                (
                    "embedding",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="retry",
                        serialize=False,
                        to="memory_app.embedding",
                    ),
                ),
                ("attempts", models.IntegerField()),
                ("next_attempt_at", models.DateTimeField()),
                ("last_error", models.TextField(blank=True, default="")),
            ],
            options={"verbose_name_plural": "embedding retries"},
        ),
        migrations.RunSQL(COPY_RETRIES, COLUMNS_BACK),
    ]
