"""`/healthz`: 200 when the database answers, 503 when it does not. `vectors_unindexed` is the
indexer's backlog: vectors stored by a large batch, searchable (scanned exactly) but not yet in
their HNSW graph; `fulltext_pending` the messages of large batches whose full-text vectors the
indexer has not written yet (matched from their text meanwhile). Both should fall back to 0
within seconds of a batch. `spans_queued` is the OTLP mapping's backlog: spans of acknowledged
exports not yet mapped into runs and steps, the oldest received `spans_queued_oldest_seconds` ago
(null when none); `spans_set_aside` counts exports the mapping refused (kept, with the error, in
`memory_app_spanqueue`). `embedding_model` is the local model's state in the worker that
answered ("loading" from its start, then "ready"; null with another provider)."""

from django.db import DatabaseError, connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from memory_app import db
from memory_app.embeddings import providers
from memory_app.search import fulltext


@never_cache
@require_GET
def healthz(request):
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'vector'),"  # noqa: S608 - constants
                " (SELECT count(*) FROM memory_app_embeddingwaiting)"
                " + (SELECT count(*) FROM memory_app_memoryembeddingwaiting),"
                f" ({fulltext.PENDING_SQL}),"
                " (SELECT coalesce(sum(span_count), 0) FROM memory_app_spanqueue WHERE error = ''),"
                # The wall clock, not the transaction's start.
                " (SELECT extract(epoch FROM clock_timestamp() - min(received_at))"
                "  FROM memory_app_spanqueue"
                "  WHERE error = ''),"
                " (SELECT count(*) FROM memory_app_spanqueue WHERE error <> '')"
            )
            row = cursor.fetchone()
    except DatabaseError as exc:
        # A dead connection stays dead in this worker; drop it so the next probe reconnects.
        connection.close_if_unusable_or_obsolete()
        response = JsonResponse(
            {"status": "error", "database": "unavailable", "detail": str(exc).strip()[:200]},
            status=503,
        )
        response["Retry-After"] = str(db.RETRY_AFTER_SECONDS)
        return response
    return JsonResponse(
        {
            "status": "ok",
            "database": "ok",
            "pgvector": row[0],
            "vectors_unindexed": row[1],
            "fulltext_pending": int(row[2]),
            "spans_queued": int(row[3]),
            # Never below 0: the rows' times are the web process's clock.
            "spans_queued_oldest_seconds": (
                None if row[4] is None else max(0.0, round(float(row[4]), 3))
            ),
            "spans_set_aside": row[5],
            "embedding_model": providers.local_model_state(),
        }
    )
