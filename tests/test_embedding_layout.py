"""Migration 0015: embedding rows lose their queue columns and five 384-d rows fit a page."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from memory_app.models import Context, Embedding, EmbeddingRetry
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append

from .test_foundation import run_on_a_new_database

# Run in its own process on its own database: it migrates back and forth, which the test
# database shared by the other tests must never see.
ROUND_TRIP_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import django
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentmemory_site.settings"
    django.setup()
    from datetime import timedelta
    import numpy as np
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    BEFORE = ("memory_app", "0014_append_only_pkeys")
    call_command("migrate", "memory_app", BEFORE[1], verbosity=0)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    Context, Message, Embedding = (
        old.get_model("memory_app", name) for name in ("Context", "Message", "Embedding")
    )
    context = Context.objects.create(keys={"test": "layout"}, keys_digest="0" * 64)
    vectors = np.random.default_rng(7).normal(size=(60, 384)).astype(np.float32)
    for seq, vector in enumerate(vectors, start=1):
        message = Message.objects.create(context=context, seq=seq, role="user", text=f"m{seq}")
        Embedding.objects.create(
            message=message, context=context, model="layout-384", dimensions=384,
            vector=vector.tolist(), attempts=1, embedded_at=timezone.now(),
        )
    waiting = Message.objects.create(context=context, seq=61, role="user", text="waiting")
    due = timezone.now() + timedelta(minutes=5)
    pending = Embedding.objects.create(
        message=waiting, context=context, model="layout-384", attempts=3, next_attempt_at=due,
        last_error="HTTP 503 from the provider",
    )

    from memory_app.embeddings import indexer
    # The index as `ensure_model_index` builds it; at 0014 there is no model registry to ask yet.
    with connection.cursor() as cursor:
        cursor.execute(
            indexer.index_sql(model="layout-384", dimensions=384, concurrently=False)
            .as_string(connection.connection)
        )

    def per_page():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT max(n) FROM (SELECT count(*) AS n FROM memory_app_embedding"
                " WHERE vector IS NOT NULL GROUP BY (ctid::text::point)[0]) pages"
            )
            return cursor.fetchone()[0]

    def rows():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, message_id, context_id, model, dimensions, indexed,"
                " md5(vector::text)"
                " FROM memory_app_embedding ORDER BY id"
            )
            return cursor.fetchall()

    def shape():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_attribute WHERE attrelid = 'memory_app_embedding'::regclass"
                " AND attnum > 0 AND NOT attisdropped"
            )
            columns = cursor.fetchone()[0]
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes"
                " WHERE tablename = 'memory_app_embedding' ORDER BY 1"
            )
            indexes = dict(cursor.fetchall())
            cursor.execute(
                "SELECT count(*) FROM pg_constraint"
                " WHERE conrelid = 'memory_app_embedding'::regclass AND contype = 'f'"
            )
            foreign_keys = cursor.fetchone()[0]
        return {"columns": columns, "indexes": indexes, "foreign_keys": foreign_keys}

    out = {"before": {"per_page": per_page(), "rows": rows(), **shape()}}
    call_command("migrate", "memory_app", verbosity=0)
    from memory_app.models import Embedding as Lean, EmbeddingRetry
    retry = EmbeddingRetry.objects.get(embedding_id=pending.pk)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT confdeltype, condeferrable, condeferred, confrelid::regclass::text"
            " FROM pg_constraint WHERE conrelid = 'memory_app_embeddingretry'::regclass"
            " AND contype = 'f'"
        )
        retry_fk = cursor.fetchall()
    out["after"] = {
        "per_page": per_page(), "rows": rows(), **shape(), "retry_fk": retry_fk,
        "retry": [retry.attempts, retry.next_attempt_at == due, retry.last_error],
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'memory_app_memoryembedding'"
            " AND indexname LIKE 'memoryembedding%%hnswi%%'"
        )
        out["after"]["memory_hnsw"] = [row[0] for row in cursor.fetchall()]
    added = Lean.objects.create(message_id=waiting.pk, context_id=context.pk, model="other-3")
    out["after"]["added_id"] = added.pk
    added.delete()
    call_command("migrate", "memory_app", BEFORE[1], verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attempts, next_attempt_at = %s, last_error FROM memory_app_embedding"
            " WHERE id = %s", [due, pending.pk]
        )
        back = list(cursor.fetchone())
    out["back"] = {"rows": rows(), "pending": back, **shape()}
    call_command("migrate", "memory_app", verbosity=0)
    out["again"] = {"rows": rows(), "per_page": per_page()}
    print(json.dumps(out, default=str))
    """  # noqa: E501 - the child process runs this text as written
)


def test_the_rebuild_keeps_every_row_and_fits_five_rows_a_page():
    with run_on_a_new_database("am_layout", ["-c", ROUND_TRIP_SCRIPT], timeout=300) as (done, _):
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])

    before, after, back, again = out["before"], out["after"], out["back"], out["again"]
    # 8 columns at 0015; 7 since 0031 moved memory vectors to a table of their own.
    assert before["columns"] == 13 and after["columns"] == 7
    assert (before["per_page"], after["per_page"], again["per_page"]) == (4, 5, 5)
    # Every row, id, reference and vector is kept.
    assert after["rows"] == before["rows"] == back["rows"] == again["rows"]
    assert len(after["rows"]) == 61
    assert after["retry"] == [3, True, "HTTP 503 from the provider"]
    # Cascades in the database, deferrable like Django's keys, onto the new table.
    assert after["retry_fk"] == [["c", True, True, "memory_app_embedding"]]
    assert after["added_id"] > max(row[0] for row in before["rows"])  # the id sequence goes on
    # The memory record's key went with the memory vectors (0031).
    assert (before["foreign_keys"], after["foreign_keys"]) == (3, 2)
    # Same names, HNSW included, but the waiting rows' partial index: they wait in a side table
    # since 0037.
    assert set(after["indexes"]) == set(before["indexes"]) - {
        "embedding_memory_model_unique",
        "embedding_unindexed",
    }
    assert any("hnsw" in d and "layout-384" in d for d in after["indexes"].values())
    # The model's HNSW index, as the message table has it, on the memory vectors' table (0031).
    [memory_hnsw] = after["memory_hnsw"]
    assert "USING hnsw" in memory_hnsw and "layout-384" in memory_hnsw
    assert "(model, id) WHERE (vector IS NULL)" in after["indexes"]["embedding_pending_idx"]
    assert "(next_attempt_at, id)" in back["indexes"]["embedding_pending_idx"]
    assert back["pending"] == [3, True, "HTTP 503 from the provider"]
    assert back["columns"] == 13


@pytest.mark.django_db
def test_vectors_stored_today_fit_five_a_page():
    """A column added to Embedding later would quietly put the store back to four rows a page."""
    context, _ = context_get_or_create(keys={"test": "five-a-page"})
    messages = messages_append(
        context=context, items=[{"role": "user", "text": f"m{i}"} for i in range(20)]
    ).messages
    vectors = np.random.default_rng(3).normal(size=(20, 384)).astype(np.float32)
    Embedding.objects.bulk_create(
        Embedding(message=m, context=context, model="page-384", dimensions=384, vector=v)
        for m, v in zip(messages, vectors, strict=True)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM memory_app_embedding"
            " WHERE model = 'page-384' GROUP BY (ctid::text::point)[0]) pages"
        )
        assert cursor.fetchone()[0] == 5


@pytest.mark.django_db
def test_deleting_a_context_drops_its_retries_without_loading_its_vectors():
    context, _ = context_get_or_create(keys={"test": "retry-cascade"})
    [m] = messages_append(context=context, items=[{"role": "user", "text": "x"}]).messages
    row = Embedding.objects.create(message=m, context=context, model="cascade-3")
    EmbeddingRetry.objects.create(
        embedding=row,
        context=context,
        attempts=2,
        next_attempt_at=timezone.now(),
        last_error="HTTP 503",
    )
    with CaptureQueriesContext(connection) as queries:
        Context.objects.filter(pk=context.pk).delete()
    assert not EmbeddingRetry.objects.filter(embedding_id=row.pk).exists()
    reads = [
        q["sql"]
        for q in queries
        if q["sql"].startswith("SELECT") and "memory_app_embedding" in q["sql"]
    ]
    assert reads == []  # one DELETE of the embeddings, never a SELECT of their rows
