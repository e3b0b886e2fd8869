"""The queue of items waiting for vectors: pending rows (vector NULL) of `Embedding` (messages)
and `MemoryEmbedding` (memory records) that the worker fills in, and the counts of what waits
(for a provider, or, in `EmbeddingWaiting` and `MemoryEmbeddingWaiting`, for its HNSW graph)."""

from __future__ import annotations

from django.db import connection

from memory_app.embeddings.providers import active_model_name
from memory_app.models import (
    Embedding,
    EmbeddingRetry,
    EmbeddingWaiting,
    MemoryEmbedding,
    MemoryEmbeddingRetry,
    MemoryEmbeddingWaiting,
    MemoryRecord,
    Message,
)


def enqueue_messages(messages: list[Message], *, model: str | None = None) -> None:
    model = model or active_model_name()
    if model is None or not messages:
        return
    Embedding.objects.bulk_create(
        [Embedding(message=m, context_id=m.context_id, model=model) for m in messages if m.text],
        ignore_conflicts=True,
    )


def enqueue_memory_records(records: list[MemoryRecord], *, model: str | None = None) -> None:
    model = model or active_model_name()
    if model is None or not records:
        return
    MemoryEmbedding.objects.bulk_create(
        [MemoryEmbedding(memory_record=r, model=model) for r in records if r.content],
        ignore_conflicts=True,
    )


def _stale(qs, retries, **of) -> None:
    # The embedding rows first, then their retries: the worker's order (no deadlock with it).
    # A message's retries are read in its context (`of`), as its vectors are.
    qs.update(vector=None)
    retries.objects.filter(embedding__in=qs, **of).delete()


def requeue_message(message: Message) -> None:
    """The text changed: every stored vector of this message is stale, those waiting for the
    graph too (each becomes a pending row, as the others do)."""
    of = {"context_id": message.context_id, "message": message}
    waiting = EmbeddingWaiting.objects.filter(**of)
    Embedding.objects.bulk_create(
        [Embedding(**of, model=model) for model in waiting.values_list("model", flat=True)],
        ignore_conflicts=True,
    )
    waiting.delete()
    _stale(Embedding.objects.filter(**of), EmbeddingRetry, context_id=message.context_id)
    enqueue_messages([message])


def requeue_memory_record(record: MemoryRecord) -> None:
    waiting = MemoryEmbeddingWaiting.objects.filter(memory_record=record)
    MemoryEmbedding.objects.bulk_create(
        [
            MemoryEmbedding(memory_record=record, model=model)
            for model in waiting.values_list("model", flat=True)
        ],
        ignore_conflicts=True,
    )
    waiting.delete()
    _stale(MemoryEmbedding.objects.filter(memory_record=record), MemoryEmbeddingRetry)
    enqueue_memory_records([record])


def pending_count(*, model: str | None = None, context_id: int | None = None) -> int:
    return _count({"vector__isnull": True}, model=model, context_id=context_id)


# The vectors of messages and of memories: those in their HNSW graphs and those waiting for them.
_IN_GRAPH = ((Embedding, "context_id"), (MemoryEmbedding, "memory_record__context_id"))
_WAITING = (
    (EmbeddingWaiting, "context_id"),
    (MemoryEmbeddingWaiting, "memory_record__context_id"),
)


def _count(condition: dict, *, model: str | None, context_id: int | None, tables=_IN_GRAPH) -> int:
    """Rows of both tables (one context's: its messages' and its memories' vectors)."""
    total = 0
    for table, context_field in tables:
        qs = table.objects.filter(**condition)
        if model:
            qs = qs.filter(model=model)
        if context_id:
            qs = qs.filter(**{context_field: context_id})
        total += qs.count()
    return total


def unindexed_count(*, model: str | None = None, context_id: int | None = None) -> int:
    """Vectors stored but not yet in their model's HNSW graph (searches scan them exactly)."""
    return _count({}, model=model, context_id=context_id, tables=_WAITING)


def reembed_enqueue(*, model: str, context_id: int | None = None) -> int:
    """Queue every live item (or one context's) for `model`, keeping the other models' rows: they
    keep serving searches until the new model's rows are complete. Returns rows queued."""
    # Items whose vector under `model` waits for its graph keep it: read first (the backlog, a
    # plain read Citus fans out), then left out of the insert, which joins no other table.
    waiting = EmbeddingWaiting.objects.filter(model=model)
    if context_id:
        waiting = waiting.filter(context_id=context_id)
    skip = list(waiting.values_list("message_id", flat=True))
    with connection.cursor() as cursor:
        context_filter = "AND m.context_id = %s" if context_id else ""
        cursor.execute(
            f"""
            INSERT INTO memory_app_embedding (message_id, context_id, model)
            SELECT m.id, m.context_id, %s FROM memory_app_message m
            WHERE m.text <> '' {context_filter} AND NOT (m.id = ANY(%s))
            ON CONFLICT DO NOTHING
            RETURNING 1
            """,  # noqa: S608 - the only interpolation is a constant filter
            [model, *([context_id] if context_id else []), skip],
        )
        # Counted from what the insert returns: Citus reports an INSERT … SELECT's row count
        # as the rows selected, those ON CONFLICT passed over included.
        queued = sum(1 for _ in cursor)
        params = [model] + ([context_id] if context_id else [])
        context_filter = "AND r.context_id = %s" if context_id else ""
        cursor.execute(
            f"""
            INSERT INTO memory_app_memoryembedding (memory_record_id, model)
            SELECT r.id, %s FROM memory_app_memoryrecord r
            WHERE r.content <> '' {context_filter} AND NOT EXISTS (
                SELECT 1 FROM memory_app_memoryembeddingwaiting w
                WHERE w.memory_record_id = r.id AND w.model = %s)
            ON CONFLICT DO NOTHING
            """,  # noqa: S608
            [*params, model],
        )
        queued += cursor.rowcount
    return queued


def model_coverage(*, model: str, context_id: int | None = None) -> tuple[int, int]:
    """(embedded, total) rows of `model`, store-wide or for one context (a vector waiting for
    its graph is embedded)."""
    total = _count({}, model=model, context_id=context_id) + unindexed_count(
        model=model, context_id=context_id
    )
    return total - _count({"vector__isnull": True}, model=model, context_id=context_id), total
