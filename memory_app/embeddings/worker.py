"""The embed worker: claims due pending rows (FOR UPDATE SKIP LOCKED, so several workers on
several machines never embed an item twice), fills them from the provider, and postpones a
failed batch with exponential backoff (an `EmbeddingRetry` row beside each failed item).
Messages' vectors (`Embedding`) and memories' (`MemoryEmbedding`) are separate tables: a batch
takes the messages' first, then the memories' up to its size."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from memory_app.embeddings.indexer import ensure_model_index
from memory_app.embeddings.providers import EmbeddingProvider
from memory_app.embeddings.registry import register_provider_model, registered_dimensions
from memory_app.errors import ProviderError
from memory_app.models import (
    Embedding,
    EmbeddingRetry,
    MemoryEmbedding,
    MemoryEmbeddingRetry,
    MemoryRecord,
    Message,
)

log = logging.getLogger(__name__)
BACKOFF_BASE_SECONDS = 2.0
BACKOFF_MAX_SECONDS = 600.0


@dataclass
class BatchResult:
    claimed: int = 0
    embedded: int = 0
    failed: int = 0
    error: str = ""
    indexed: int = 0
    parsed: int = 0  # messages whose full-text vectors were written


def backoff(attempts: int, *, base: float = BACKOFF_BASE_SECONDS) -> timedelta:
    return timedelta(seconds=min(base * (2 ** max(attempts - 1, 0)), BACKOFF_MAX_SECONDS))


def embed_batch(
    *,
    provider: EmbeddingProvider,
    batch_size: int | None = None,
    now: datetime | None = None,
    backoff_base: float = BACKOFF_BASE_SECONDS,
) -> BatchResult:
    """Claim up to `batch_size` due pending rows of the provider's model and fill them in.

    The rows stay locked (FOR UPDATE SKIP LOCKED) until their vectors are written, so another
    worker skips them: every item is embedded once. On a provider failure each row's
    `EmbeddingRetry` gets `attempts + 1` and a `next_attempt_at` that doubles each time; a row
    is not claimed again before then. Oldest first (`_claim`).
    """
    batch_size = batch_size or settings.AGENTMEMORY_EMBEDDING_BATCH_SIZE
    now = now or timezone.now()
    result = BatchResult()
    with transaction.atomic():
        rows = _claim(model=provider.model, batch_size=batch_size, now=now)
        rows += _claim_memories(model=provider.model, batch_size=batch_size - len(rows), now=now)
        # Read once the rows are locked, in a statement of its own: a failure another worker
        # committed after this claim's snapshot (a new retry row; the embedding row unchanged,
        # so the claim did not look at it again) shows here, and that item waits its turn.
        tried = {
            (retry, pk): (attempts, due)
            for retry in (EmbeddingRetry, MemoryEmbeddingRetry)
            for pk, attempts, due in _of_rows(retry, rows).values_list(
                "embedding_id", "attempts", "next_attempt_at"
            )
        }
        rows = [r for r in rows if _key(r) not in tried or tried[_key(r)][1] <= now]
        result.claimed = len(rows)
        if not rows:
            return result
        texts = _texts(rows)
        try:
            vectors = provider.embed(texts)
            # The provider's model registers itself with its first answer's dimensions: the
            # operator chose it in the settings (or on `reembed`'s command line).
            expected = registered_dimensions(provider.model) or register_provider_model(
                provider.model, len(vectors[0])
            )
            if any(len(v) != expected for v in vectors):
                raise ProviderError(
                    f"provider answered vectors of other than {expected} dimensions"
                )
        except ProviderError as exc:
            _postpone(
                rows,
                tried={key: attempts for key, (attempts, _) in tried.items()},
                error=str(exc),
                now=now,
                backoff_base=backoff_base,
            )
            result.failed, result.error = len(rows), str(exc)
            return result
        for r, v in zip(rows, vectors, strict=True):
            r.vector, r.dimensions = v, len(v)
        for table, retry in RETRY.items():
            mine = [r for r in rows if type(r) is table]
            # One UPDATE per context for the messages' vectors (on Citus each goes to the
            # context's shard, where one for the whole batch would reach every shard).
            for group in _per_context(mine):
                _of_rows(table, group).bulk_update(group, ["vector", "dimensions"])
            if done_retrying := [r for r in mine if (retry, r.pk) in tried]:
                _of_rows(retry, done_retrying).delete()
        result.embedded = len(rows)
    ensure_model_index(model=provider.model, dimensions=len(vectors[0]))
    return result


RETRY = {Embedding: EmbeddingRetry, MemoryEmbedding: MemoryEmbeddingRetry}


def _per_context(rows: list[Embedding | MemoryEmbedding]) -> list[list]:
    """The rows grouped by context (memory vectors, which have none, in one group)."""
    groups: dict[int | None, list] = {}
    for r in rows:
        groups.setdefault(getattr(r, "context_id", None), []).append(r)
    return list(groups.values())


def _of_rows(model: type, rows: list[Embedding | MemoryEmbedding]):
    """`model`'s rows for these claimed vectors (the vectors themselves, or their retries), by
    id and, for the messages' vectors, by their contexts too: on Citus the contexts prune the
    statement to their shards."""
    if model in (Embedding, EmbeddingRetry):
        mine = [r for r in rows if isinstance(r, Embedding)]
        contexts = {r.context_id for r in mine}
        field = "pk" if model is Embedding else "embedding_id"
        return model.objects.filter(
            **{f"{field}__in": [r.pk for r in mine]}, context_id__in=contexts
        )
    mine = [r for r in rows if isinstance(r, MemoryEmbedding)]
    field = "pk" if model is MemoryEmbedding else "embedding_id"
    return model.objects.filter(**{f"{field}__in": [r.pk for r in mine]})


def _key(row: Embedding | MemoryEmbedding) -> tuple[type, int]:
    """A claimed row's key among both tables' (their ids are separate sequences)."""
    return RETRY[type(row)], row.pk


# Step 1 of the claim: the oldest due pending message vectors (`embedding_pending_idx`); the
# retry is joined by its whole key, context included (on Citus a join within one shard). The
# model is one value: ordering by it too is the index's order, which no other index gives.
PENDING_SQL = """
    SELECT e.id, e.context_id FROM memory_app_embedding e
    WHERE e.vector IS NULL AND e.model = %s AND e.id > %s AND NOT EXISTS (
        SELECT 1 FROM memory_app_embeddingretry r
        WHERE r.embedding_id = e.id AND r.context_id = e.context_id AND r.next_attempt_at > %s
    )
    ORDER BY e.model, e.id LIMIT %s
"""


def _claim(*, model: str, batch_size: int, now: datetime) -> list[Embedding]:
    """Lock up to `batch_size` due pending rows of `model`, oldest first, in two steps.

    The oldest due pending rows are read without a lock (`embedding_pending_idx`; a plain read
    may span every context, on Citus every shard); then each context's share of them is locked
    by a statement naming that context and the embedding table alone (FOR UPDATE SKIP LOCKED:
    a row lock on Citus names one distribution value). Rows another worker holds are passed
    over, and the lock re-reads each row, so one embedded meanwhile is too; when every row read
    was taken, the next older ones are read, as the single SKIP LOCKED scan did before."""
    claimed: list[Embedding] = []
    after = 0
    while len(claimed) < batch_size:
        with connection.cursor() as cursor:
            cursor.execute(PENDING_SQL, [model, after, now, batch_size - len(claimed)])
            candidates = cursor.fetchall()
        if not candidates:
            break
        per_context: dict[int | None, list[int]] = {}
        for pk, context_id in candidates:
            per_context.setdefault(context_id, []).append(pk)
        for context_id, ids in per_context.items():
            # Whether a row is due is read again once it is locked (embed_batch's `tried`).
            claimed += (
                Embedding.objects.select_for_update(skip_locked=True)
                .filter(context_id=context_id, pk__in=ids, vector__isnull=True, model=model)
                .order_by("id")
                .only("pk", "message_id", "context_id")
            )
        after = candidates[-1][0]
    return sorted(claimed, key=lambda r: r.pk)


def _claim_memories(*, model: str, batch_size: int, now: datetime) -> list[MemoryEmbedding]:
    """Lock up to `batch_size` due pending memory vectors of `model`, oldest first, in one
    statement: they go with the memories (no context to route by), not with a shard."""
    if batch_size <= 0:
        return []
    return list(
        MemoryEmbedding.objects.select_for_update(skip_locked=True)
        .filter(vector__isnull=True, model=model)
        .exclude(
            pk__in=MemoryEmbeddingRetry.objects.filter(next_attempt_at__gt=now).values(
                "embedding_id"
            )
        )
        .order_by("id")
        .only("pk", "memory_record_id")[:batch_size]
    )


def _texts(rows: list[Embedding | MemoryEmbedding]) -> list[str]:
    """The claimed items' texts, read after the claim (its lock statement reads one table)."""
    vectors = [r for r in rows if isinstance(r, Embedding)]
    messages = dict(
        Message.objects.filter(
            pk__in=[r.message_id for r in vectors], context_id__in={r.context_id for r in vectors}
        ).values_list("pk", "text")
    )
    records = dict(
        MemoryRecord.objects.filter(
            pk__in=[r.memory_record_id for r in rows if isinstance(r, MemoryEmbedding)]
        ).values_list("pk", "content")
    )
    return [
        messages[r.message_id] if isinstance(r, Embedding) else records[r.memory_record_id]
        for r in rows
    ]


def _postpone(
    rows: list[Embedding | MemoryEmbedding],
    *,
    tried: dict[tuple[type, int], int],
    error: str,
    now: datetime,
    backoff_base: float,
) -> None:
    """Count a failed attempt on each claimed row (`tried`: attempts so far, read under the
    rows' locks, which every writer of a retry holds) and set when it is due again."""
    for table, retry in RETRY.items():
        retries = []
        for r in rows:
            if type(r) is not table:
                continue
            attempts = tried.get((retry, r.pk), 0) + 1
            copied = {"context_id": r.context_id} if table is Embedding else {}
            retries.append(
                retry(
                    embedding=r,
                    attempts=attempts,
                    next_attempt_at=now + backoff(attempts, base=backoff_base),
                    last_error=error[:2000],
                    **copied,
                )
            )
        retry.objects.bulk_create(
            retries,
            update_conflicts=True,
            # The message retries' key is (embedding_id, context_id) in the database.
            unique_fields=["embedding", "context"] if table is Embedding else ["embedding"],
            update_fields=["attempts", "next_attempt_at", "last_error"],
        )
