"""What review needs to read: a memory's live look-alikes in its scope (near-duplicates and likely
conflicts, the near-copy check of a record), the review inbox, and the status of an agent's
records.

Similarity is the cosine similarity of stored vectors when both sides have one under the same
model, else the share of stemmed words the two texts have in common (Jaccard over their
full-text lexemes). Either is computed over the live records of one scope (`scope_digest`, the
leading column of the scope's unique index): an exact scan of what one scope holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from django.conf import settings
from django.db import connection

from memory_app.errors import NotFound
from memory_app.models import FTS_CONFIG, ApiKey, MemoryRecord, MemoryStatus
from memory_app.queries.memories import SOURCES, memory_for_key
from memory_app.search.semantic import vector_literal

Measure = Literal["semantic", "words"]
INBOX_LIMIT = 200
# Look-alikes listed per proposal in the inbox.
SIMILAR_LIMIT = 5

_LIVE_OF_SCOPE = """
    r.scope_digest = %s AND r.status = 'live' AND r.archived_at IS NULL AND r.id <> %s
    AND (r.expires_at IS NULL OR r.pinned OR r.expires_at > statement_timestamp())
"""

# The memories' vectors, those waiting for their HNSW graph too (an exact scan reads both).
_MEMORY_VECTORS = """(
    SELECT memory_record_id, model, dimensions, vector FROM memory_app_memoryembedding
    UNION ALL
    SELECT memory_record_id, model, dimensions, vector FROM memory_app_memoryembeddingwaiting
)"""

_BY_VECTOR = f"""
    SELECT r.id, max(1 - (e.vector <=> %s::vector)) AS similarity
    FROM {_MEMORY_VECTORS} e
    JOIN memory_app_memoryrecord r ON r.id = e.memory_record_id
    WHERE e.model = %s AND e.dimensions = %s AND e.vector IS NOT NULL AND {_LIVE_OF_SCOPE}
    GROUP BY r.id ORDER BY similarity DESC, r.id LIMIT %s
"""  # noqa: S608 - a constant fragment

# The proposal's own stored vectors, under whichever models it has.
_BY_STORED_VECTOR = f"""
    SELECT r.id, max(1 - (e.vector <=> p.vector)) AS similarity
    FROM {_MEMORY_VECTORS} p
    JOIN {_MEMORY_VECTORS} e ON e.model = p.model AND e.dimensions = p.dimensions
    JOIN memory_app_memoryrecord r ON r.id = e.memory_record_id
    WHERE p.memory_record_id = %s AND p.vector IS NOT NULL AND e.vector IS NOT NULL
      AND {_LIVE_OF_SCOPE}
    GROUP BY r.id ORDER BY similarity DESC, r.id LIMIT %s
"""  # noqa: S608 - a constant fragment

# Both texts parsed with one configuration: `english` (stemmed, stopwords left out) relates
# memories about the same thing; `simple` keeps every word, "not" included, for near-copies.
_BY_WORDS = f"""
    WITH n AS (SELECT tsvector_to_array(to_tsvector(%s::regconfig, %s)) AS lex)
    SELECT id, similarity FROM (
        SELECT r.id,
            cardinality(ARRAY(
                SELECT unnest(tsvector_to_array(to_tsvector(%s::regconfig, r.content)))
                INTERSECT SELECT unnest(n.lex)
            ))::float / NULLIF(cardinality(ARRAY(
                SELECT unnest(tsvector_to_array(to_tsvector(%s::regconfig, r.content)))
                UNION SELECT unnest(n.lex)
            )), 0) AS similarity
        FROM memory_app_memoryrecord r, n WHERE {_LIVE_OF_SCOPE}
    ) s WHERE similarity > 0 ORDER BY similarity DESC, id LIMIT %s
"""  # noqa: S608 - a constant fragment


@dataclass(frozen=True)
class Similar:
    record: MemoryRecord
    similarity: float
    measure: Measure


def _rows(sql: str, params: Sequence[Any]) -> list[tuple[int, float]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(pk, float(sim)) for pk, sim in cursor.fetchall()]


def _records(rows: list[tuple[int, float]], measure: Measure) -> list[Similar]:
    records = MemoryRecord.objects.select_related("context").in_bulk([pk for pk, _ in rows])
    return [Similar(records[pk], sim, measure) for pk, sim in rows if pk in records]


def similar_live(
    *,
    scope_digest: str,
    content: str,
    vector: Sequence[float] | None = None,
    model: str | None = None,
    record_id: int | None = None,
    limit: int = SIMILAR_LIMIT,
    words: str = FTS_CONFIG,
) -> list[Similar]:
    """The live records of the scope most like `content`, most similar first, `record_id`
    left out. By `vector` (under `model`) when given, else by the stored vectors of `record_id`,
    when any live record of the scope has one to compare; otherwise by the words both texts
    hold as the text search configuration `words` parses them."""
    exclude = record_id or 0
    rows: list[tuple[int, float]] = []
    if vector is not None and model:
        rows = _rows(
            _BY_VECTOR,
            [vector_literal(vector), model, len(vector), scope_digest, exclude, limit],
        )
    elif record_id is not None:
        rows = _rows(_BY_STORED_VECTOR, [record_id, scope_digest, exclude, limit])
    if rows:
        return _records(rows, "semantic")
    rows = _rows(_BY_WORDS, [words, content, words, words, scope_digest, exclude, limit])
    return _records(rows, "words")


def thresholds(measure: Measure) -> tuple[float, float]:
    """(near-duplicate, likely conflict) lower bounds for `measure`."""
    if measure == "semantic":
        return (
            settings.AGENTMEMORY_MEMORY_DUPLICATE_SIMILARITY,
            settings.AGENTMEMORY_MEMORY_CONFLICT_SIMILARITY,
        )
    return (
        settings.AGENTMEMORY_MEMORY_DUPLICATE_OVERLAP,
        settings.AGENTMEMORY_MEMORY_CONFLICT_OVERLAP,
    )


@dataclass
class Proposal:
    """A proposed record with the live records of its scope it may repeat or contradict."""

    record: MemoryRecord
    duplicates: list[Similar] = field(default_factory=list)
    conflicts: list[Similar] = field(default_factory=list)


def proposal_with_similar(record: MemoryRecord) -> Proposal:
    proposal = Proposal(record)
    for similar in similar_live(
        scope_digest=record.scope_digest, content=record.content, record_id=record.pk
    ):
        duplicate, conflict = thresholds(similar.measure)
        if similar.similarity >= duplicate:
            proposal.duplicates.append(similar)
        elif similar.similarity >= conflict:
            proposal.conflicts.append(similar)
    return proposal


def memories_inbox(*, context_id: int | None = None, limit: int = INBOX_LIMIT) -> list[Proposal]:
    """The proposals waiting for review, oldest first, each with its look-alikes."""
    qs = MemoryRecord.objects.filter(status=MemoryStatus.PROPOSED).select_related(*SOURCES)
    if context_id is not None:
        qs = qs.filter(context_id=context_id)
    return [proposal_with_similar(r) for r in qs.order_by("created_at", "id")[:limit]]


def proposals_count() -> int:
    return MemoryRecord.objects.filter(status=MemoryStatus.PROPOSED).count()


def memories_status(key: ApiKey, ids: Sequence[int]) -> dict[str, Any]:
    """The records of `ids` that `key` may see (with their status), and the ids it may not."""
    found, missing = [], []
    for pk in dict.fromkeys(ids):
        try:
            found.append(memory_for_key(key, pk))
        except NotFound:
            missing.append(pk)
    return {"items": found, "missing": missing}
