"""Message vectors and memory vectors in tables of their own.

`memory_app_embedding` held both: a message's vector (with its context) and a memory record's
(with none for a key-subset memory), which cannot share one distribution on Citus. Memory
vectors move to `memory_app_memoryembedding` (keyed by memory, with the memories), their
retries to `memory_app_memoryembeddingretry`; `memory_app_embedding` keeps the messages'
vectors, now keyed by context: primary key `(id, context_id)`, unique
`(message_id, model, context_id)`, foreign key `(message_id, context_id)` into the messages,
and its retries keyed `(embedding_id, context_id)` with the foreign key into it.

Carrying a store over: one transaction (docs/scale-out.md, "Migration 0025"). Memory vectors
are copied with their ids, then deleted from the message table (their retries cascade); each
model's HNSW index is built again on the memory table (same model, dimensions, m and
ef_construction); then the keys of the message table are replaced, an index build over it.

Reversible: back to 0024 the memory vectors return to the shared table (new ids; retries
follow by memory and model) and the keys of 0024 are put back.
Frozen: the SQL is written out here.
"""

import django.db.models.deletion
import pgvector.django.vector
from django.db import migrations, models

MOVE_MEMORY_VECTORS = r"""
INSERT INTO memory_app_memoryembedding (id, memory_record_id, model, dimensions, vector, indexed)
    SELECT id, memory_record_id, model, dimensions, vector, indexed
    FROM memory_app_embedding WHERE memory_record_id IS NOT NULL;
SELECT setval(pg_get_serial_sequence('memory_app_memoryembedding', 'id'),
              coalesce(max(id), 0) + 1, false) FROM memory_app_memoryembedding;
INSERT INTO memory_app_memoryembeddingretry (embedding_id, attempts, next_attempt_at, last_error)
    SELECT r.embedding_id, r.attempts, r.next_attempt_at, r.last_error
    FROM memory_app_embeddingretry r JOIN memory_app_embedding e ON e.id = r.embedding_id
    WHERE e.memory_record_id IS NOT NULL;
ALTER TABLE memory_app_memoryembeddingretry ADD CONSTRAINT memoryembeddingretry_embedding_fk
    FOREIGN KEY (embedding_id) REFERENCES memory_app_memoryembedding (id)
    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
SET CONSTRAINTS ALL IMMEDIATE;
DELETE FROM memory_app_embedding WHERE memory_record_id IS NOT NULL;
-- Every message vector and retry carries its context (the columns become NOT NULL).
UPDATE memory_app_embedding e SET context_id = m.context_id FROM memory_app_message m
    WHERE e.context_id IS NULL AND m.id = e.message_id;
UPDATE memory_app_embeddingretry r SET context_id = e.context_id FROM memory_app_embedding e
    WHERE r.context_id IS NULL AND e.id = r.embedding_id;
SET CONSTRAINTS ALL DEFERRED;
-- Each model's HNSW index, as built on the message table, on the memory table too.
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid = 'memory_app_embedding'::regclass AND i.indisvalid
            AND c.relname LIKE 'embedding\_hnswi\_%' AND c.relname NOT LIKE '%\_rebuild'
    LOOP
        EXECUTE replace(replace(r.def, 'ON public.memory_app_embedding ',
                                'ON public.memory_app_memoryembedding '),
                        'INDEX ' || r.relname || ' ', 'INDEX memory' || r.relname || ' ');
    END LOOP;
END $$;
"""

MEMORY_VECTORS_BACK = """
SET CONSTRAINTS ALL IMMEDIATE;
INSERT INTO memory_app_embedding (memory_record_id, context_id, model, dimensions, vector, indexed)
    SELECT e.memory_record_id, r.context_id, e.model, e.dimensions, e.vector, e.indexed
    FROM memory_app_memoryembedding e JOIN memory_app_memoryrecord r ON r.id = e.memory_record_id;
INSERT INTO memory_app_embeddingretry
        (embedding_id, context_id, attempts, next_attempt_at, last_error)
    SELECT n.id, n.context_id, t.attempts, t.next_attempt_at, t.last_error
    FROM memory_app_memoryembeddingretry t
    JOIN memory_app_memoryembedding o ON o.id = t.embedding_id
    JOIN memory_app_embedding n ON n.memory_record_id = o.memory_record_id AND n.model = o.model;
SET CONSTRAINTS ALL DEFERRED;
"""

MESSAGE_KEYS = """
ALTER TABLE memory_app_embeddingretry DROP CONSTRAINT embeddingretry_embedding_fk;
ALTER TABLE memory_app_embedding DROP CONSTRAINT memory_app_embedding_pkey,
    ADD CONSTRAINT memory_app_embedding_pkey PRIMARY KEY (id, context_id) WITH (fillfactor = 100),
    ADD CONSTRAINT embedding_message_fk FOREIGN KEY (message_id, context_id)
    REFERENCES memory_app_message (id, context_id) DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE memory_app_embeddingretry DROP CONSTRAINT memory_app_embeddingretry_pkey,
    ADD CONSTRAINT memory_app_embeddingretry_pkey PRIMARY KEY (embedding_id, context_id),
    ADD CONSTRAINT embeddingretry_embedding_fk FOREIGN KEY (embedding_id, context_id)
    REFERENCES memory_app_embedding (id, context_id) ON DELETE CASCADE
    DEFERRABLE INITIALLY DEFERRED;
"""

MESSAGE_KEYS_BACK = """
ALTER TABLE memory_app_embeddingretry DROP CONSTRAINT embeddingretry_embedding_fk,
    DROP CONSTRAINT memory_app_embeddingretry_pkey,
    ADD CONSTRAINT memory_app_embeddingretry_pkey PRIMARY KEY (embedding_id);
ALTER TABLE memory_app_embedding DROP CONSTRAINT embedding_message_fk,
    DROP CONSTRAINT memory_app_embedding_pkey,
    ADD CONSTRAINT memory_app_embedding_pkey PRIMARY KEY (id) WITH (fillfactor = 100);
ALTER TABLE memory_app_embeddingretry ADD CONSTRAINT embeddingretry_embedding_fk
    FOREIGN KEY (embedding_id) REFERENCES memory_app_embedding (id)
    ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
"""


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0030_context_key_digests")]

    operations = [
        migrations.CreateModel(
            name="MemoryEmbedding",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("model", models.CharField(max_length=200)),
                ("dimensions", models.IntegerField(blank=True, null=True)),
                ("vector", pgvector.django.vector.VectorField(blank=True, null=True)),
                ("indexed", models.BooleanField(db_default=True, default=True)),
                (
                    "memory_record",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="embeddings",
                        to="memory_app.memoryrecord",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("vector__isnull", True)),
                        fields=["model", "id"],
                        name="memoryembedding_pending_idx",
                    ),
                    models.Index(
                        condition=models.Q(("indexed", False)),
                        fields=["model"],
                        name="memoryembedding_unindexed",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("memory_record", "model"),
                        name="memoryembedding_memory_model_unique",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="MemoryEmbeddingRetry",
            fields=[
                (
                    "embedding",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="retry",
                        serialize=False,
                        to="memory_app.memoryembedding",
                    ),
                ),
                ("attempts", models.IntegerField()),
                ("next_attempt_at", models.DateTimeField()),
                ("last_error", models.TextField(blank=True, default="")),
            ],
            options={"verbose_name_plural": "memory embedding retries"},
        ),
        migrations.RunSQL(MOVE_MEMORY_VECTORS, reverse_sql=MEMORY_VECTORS_BACK),
        migrations.RemoveConstraint(model_name="embedding", name="embedding_one_item"),
        migrations.RemoveConstraint(model_name="embedding", name="embedding_message_model_unique"),
        migrations.RemoveConstraint(model_name="embedding", name="embedding_memory_model_unique"),
        migrations.RemoveField(model_name="embedding", name="memory_record"),
        migrations.AlterField(
            model_name="embedding",
            name="context",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="memory_app.context",
            ),
        ),
        migrations.AlterField(
            model_name="embedding",
            name="message",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="embeddings",
                to="memory_app.message",
            ),
        ),
        migrations.AlterField(
            model_name="embeddingretry",
            name="context",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="memory_app.context",
            ),
        ),
        migrations.AddConstraint(
            model_name="embedding",
            constraint=models.UniqueConstraint(
                fields=("message", "model", "context"), name="embedding_message_model_unique"
            ),
        ),
        migrations.RunSQL(MESSAGE_KEYS, reverse_sql=MESSAGE_KEYS_BACK),
    ]
