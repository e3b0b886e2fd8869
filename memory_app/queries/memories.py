"""What a context recalls: the records of its own scope and of every key subset its keys
contain, by keywords (AgentScope: up to `limit` per keyword) or by a query (full-text, semantic
or both fused), an agent's list of the records its key may see, and the dashboard's memory
search."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.postgres.search import SearchQuery, SearchRank
from django.db.models import F, Q, QuerySet
from django.db.models.expressions import RawSQL

from memory_app import auth, errors
from memory_app.embeddings import indexer, providers
from memory_app.errors import Invalid, NotFound
from memory_app.memories import MAX_LIMIT, clean_keywords, unexpired
from memory_app.models import (
    FTS_CONFIG,
    ApiKey,
    Context,
    MemoryKind,
    MemoryRecord,
    MemoryStatus,
)
from memory_app.queries.lists import Page
from memory_app.search.fusion import rrf_scores
from memory_app.search.semantic import nearest_vectors

# What a record's provenance line on a dashboard page links to.
SOURCES = (
    "context",
    "source_message",
    "source_step",
    "source_run",
    "source_api_key",
    "source_user",
)


# A namespace item past its time to live is recalled nowhere, from the moment it expires.
def memories_visible(
    *, context: Context, include_archived: bool = False, confined_to: dict[str, Any] | None = None
) -> QuerySet[MemoryRecord]:
    """Live records a context sees: its own, and those of every non-empty key subset its keys
    contain.

    `confined_to` (an API key's context keys) also leaves out key subsets outside that
    confinement, as `GET /memories/{id}` does: a confined key never reads a record its tenant
    does not own, even when that record's subset happens to match the context.
    """
    subsets = Q(context__isnull=True, scope_keys__contained_by=context.keys) & ~Q(scope_keys={})
    if confined_to:
        subsets &= Q(scope_keys__contains=confined_to)
    # Proposals, and what review rejected or merged, are never recalled.
    qs = MemoryRecord.objects.filter(Q(context=context) | subsets, status=MemoryStatus.LIVE)
    # Nor is what is past its expiry date, removed or not yet.
    qs = qs.filter(unexpired())
    return qs if include_archived else qs.filter(archived_at__isnull=True)


@dataclass(frozen=True)
class Recalled:
    record: MemoryRecord
    score: float
    reason: str


def _keyword_hits(qs: QuerySet, keyword: str, limit: int) -> list[tuple[MemoryRecord, float]]:
    tsq = SearchQuery(keyword, config=FTS_CONFIG, search_type="websearch")
    # An exact keyword tag outweighs any text rank (ts_rank stays below 1).
    tagged = RawSQL(
        "CASE WHEN EXISTS (SELECT 1 FROM unnest(memory_app_memoryrecord.keywords) k "
        "WHERE lower(k) = lower(%s)) "
        "THEN 1.0::real ELSE 0.0::real END",
        [keyword],
    )
    rows = (
        qs.annotate(text_rank=SearchRank(F("search_vector"), tsq), tag_hit=tagged)
        .filter(Q(search_vector=tsq) | Q(tag_hit__gt=0))
        .order_by((F("text_rank") + F("tag_hit")).desc(), "-created_at", "-id")[:limit]
    )
    return [(r, float(r.text_rank) + float(r.tag_hit)) for r in rows]


def text_vectors(texts: Sequence[str]) -> tuple[list[list[float] | None], str | None]:
    """The provider's vectors for `texts` (one call) and its model; Nones when there is no
    provider or it is down (retrieval then stays full-text, as without vectors)."""
    provider = providers.get_provider()
    if provider is None or not texts:
        return [None] * len(texts), None
    try:
        return list(provider.embed(list(texts))), provider.model
    except errors.ProviderError:
        return [None] * len(texts), None


def _semantic_hits(
    qs: QuerySet, vector: Sequence[float], model: str, fetch: int
) -> list[tuple[int, float]]:
    """(record id, cosine distance) of the records of `qs` nearest to `vector` under `model`,
    through search's vector path: an exact scan while few records are visible, the HNSW index's
    iterative scan beyond."""
    threshold = settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD
    visible = qs.order_by().values("pk")
    share = visible[:threshold].count()
    if share == 0:
        return []
    subquery, params = visible.query.sql_with_params()
    hits, _ = nearest_vectors(
        model=model,
        vector=vector,
        limit=fetch,
        item_column="memory_record_id",
        join_sql="",
        where_sql=f"e.memory_record_id IN ({subquery})",
        params=params,
        approximate=share >= threshold and len(vector) <= indexer.HNSW_MAX_DIMENSIONS,
        share=share,
        table=indexer.MEMORY_VECTORS,
    )
    return hits


def _fused(
    text: list[tuple[int, float]],
    semantic: list[tuple[int, float]],
    limit: int,
    *,
    first=frozenset(),
) -> list[tuple[MemoryRecord, float, str]]:
    """Reciprocal rank fusion of both rankings, best `limit`; ids in `first` (exact keyword
    tags) lead and score one more, as an exact tag outweighs any rank."""
    fused = rrf_scores(text, semantic)
    why: dict[int, list[str]] = {}
    for label, ranking in (("text", text), ("semantic", semantic)):
        for rank, (pk, _) in enumerate(ranking, start=1):
            why.setdefault(pk, []).append(f"{label} #{rank}")
    order = sorted(fused.items(), key=lambda kv: (kv[0] not in first, -kv[1], -kv[0]))[:limit]
    records = MemoryRecord.objects.in_bulk([pk for pk, _ in order])
    return [
        (records[pk], score + (1.0 if pk in first else 0.0), ", ".join(why[pk]))
        for pk, score in order
    ]


def _query_hits(qs: QuerySet, query: str, limit: int) -> list[tuple[MemoryRecord, float, str]]:
    """Full-text (any word) fused with cosine similarity when the records have vectors."""
    from memory_app.search.keyword_query import any_terms_tsquery

    fetch = max(limit * 3, 20)
    text: list[tuple[int, float]] = []
    tsq_text = any_terms_tsquery(query)
    if tsq_text:
        tsq = SearchQuery(tsq_text, config="simple", search_type="raw")
        text = [
            (r.pk, float(r.rank))
            for r in qs.annotate(rank=SearchRank(F("search_vector"), tsq))
            .filter(search_vector=tsq)
            .order_by("-rank", "-id")[:fetch]
        ]
    [vector], model = text_vectors([query])
    semantic = _semantic_hits(qs, vector, model, fetch) if vector is not None else []
    return _fused(text, semantic, limit)


def _keyword_recall(
    qs: QuerySet, keyword: str, vector: Sequence[float] | None, model: str | None, limit: int
) -> list[tuple[MemoryRecord, float, str]]:
    """Up to `limit` records for one keyword: exact tag, then full-text rank; with a vector,
    fused with the records nearest to the keyword's meaning (as AgentScope's Mem0 memory
    retrieves each keyword), exact tags still first."""
    if vector is None:
        return [(r, score, "") for r, score in _keyword_hits(qs, keyword, limit)]
    fetch = max(limit * 3, 20)
    text = _keyword_hits(qs, keyword, fetch)
    tagged = frozenset(r.pk for r, score in text if score >= 1.0)
    return _fused(
        [(r.pk, score) for r, score in text],
        _semantic_hits(qs, vector, model, fetch),
        limit,
        first=tagged,
    )


def memories_retrieve(
    *,
    context: Context,
    keywords: Sequence[str] | None = None,
    query: str | None = None,
    limit: int = 5,
    kinds: Sequence[str] | None = None,
    include_archived: bool = False,
    confined_to: dict[str, Any] | None = None,
) -> list[Recalled]:
    """What `context` recalls. With `keywords`, up to `limit` records per keyword (AgentScope's
    `retrieve_from_memory`), best first: an exact keyword tag, then full-text rank, fused with
    semantic similarity to the keyword when the records have vectors. With `query`,
    up to `limit` records by full-text and, when vectors exist, semantic similarity. Both may be
    given: keyword hits come first; a record is listed once."""
    if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise Invalid(f"limit must be an integer between 1 and {MAX_LIMIT}")
    keywords = clean_keywords(keywords)
    if not keywords and not (query and query.strip()):
        raise Invalid("give keywords, a query, or both")
    qs = memories_visible(
        context=context, include_archived=include_archived, confined_to=confined_to
    )
    if kinds:
        bad = set(kinds) - set(MemoryKind.values)
        if bad:
            raise Invalid(f"unknown kind {sorted(bad)[0]!r}")
        qs = qs.filter(kind__in=list(kinds))
    seen: set[int] = set()
    out: list[Recalled] = []
    vectors, model = text_vectors(keywords)
    for kw, vector in zip(keywords, vectors, strict=True):
        for record, score, why in _keyword_recall(qs, kw, vector, model, limit):
            if record.pk not in seen:
                seen.add(record.pk)
                out.append(
                    Recalled(record, score, f"keyword {kw!r}" + (f" ({why})" if why else ""))
                )
    if query and query.strip():
        for record, score, why in _query_hits(qs, query, limit):
            if record.pk not in seen:
                seen.add(record.pk)
                out.append(Recalled(record, score, f"query ({why})"))
    return out


def memory_get(*, pk: int) -> MemoryRecord:
    record = MemoryRecord.objects.select_related("context").filter(pk=pk).first()
    if record is None:
        raise NotFound(f"memory {pk} not found")
    return record


def memory_for_key(key: ApiKey, memory_id: int) -> MemoryRecord:
    """The record if `key` may see its scope, else NotFound (unknown and foreign look alike, and
    so does a record past its expiry date)."""
    record = memory_get(pk=memory_id)
    if not MemoryRecord.objects.filter(unexpired(), pk=record.pk).exists():
        raise NotFound(f"memory {memory_id} not found")
    if record.context_id is not None:
        visible = auth.visible_contexts(key).filter(pk=record.context_id).exists()
    else:
        visible = auth.keys_allowed(key, record.scope_keys)
    if not visible:
        raise NotFound(f"memory {memory_id} not found")
    return record


def memories_listed(
    *,
    key: ApiKey,
    context: Context | None = None,
    scope_keys: dict[str, Any] | None = None,
    include_archived: bool = False,
    after: int | None = None,
    limit: int = 20,
) -> Page[MemoryRecord]:
    """An agent's list of the records `key` may see, by ascending id (a cursor page): those
    `context` sees, or those of contexts and key subsets whose keys contain `scope_keys`, or
    all of them. A confined key sees neither other contexts' records nor key subsets outside
    its confinement, exactly as `memory_for_key` answers one record. Live records only:
    proposals and what review rejected or merged are left out, as from recall."""
    if context is not None:
        qs = memories_visible(
            context=context, include_archived=include_archived, confined_to=key.context_keys
        )
    else:
        own = Q(context__in=auth.visible_contexts(key))
        shared = Q(context__isnull=True, scope_keys__contains=key.context_keys or {})
        # Live records only, as recall: a proposal's outcome is read by its id (status).
        qs = MemoryRecord.objects.filter(own | shared, unexpired(), status=MemoryStatus.LIVE)
        if scope_keys:
            qs = qs.filter(
                Q(scope_keys__contains=scope_keys) | Q(context__keys__contains=scope_keys)
            )
        if not include_archived:
            qs = qs.filter(archived_at__isnull=True)
    if after is not None:
        qs = qs.filter(pk__gt=after)
    rows = list(qs.order_by("pk")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(items=rows, has_more=more, next_cursor=rows[-1].pk if more else None)


def memories_search(
    *,
    query: str = "",
    context_id: int | None = None,
    scope: dict | None = None,
    archived: bool = False,
    status: str = MemoryStatus.LIVE,
    limit: int = 100,
) -> list[MemoryRecord]:
    """Records for the operator's list (not an agent's recall, see `memories_retrieve`): archived
    or not, of one review `status`, of one context and/or whose scope mentions `scope`'s keys,
    matching `query` by full-text, substring or exact keyword."""
    qs = MemoryRecord.objects.select_related(*SOURCES).defer("search_vector")
    qs = qs.filter(unexpired(), archived_at__isnull=not archived, status=status)
    if context_id is not None:
        qs = qs.filter(context_id=context_id)
    if scope:
        qs = qs.filter(Q(scope_keys__contains=scope) | Q(context__keys__contains=scope))
    query = (query or "").replace("\x00", "").strip()
    if query:
        sq = SearchQuery(query, config=FTS_CONFIG, search_type="websearch")
        qs = qs.filter(
            Q(search_vector=sq) | Q(content__icontains=query) | Q(keywords__contains=[query])
        )
        qs = qs.annotate(rank=SearchRank(F("search_vector"), sq)).order_by("-rank", "-id")
    else:
        qs = qs.order_by("-updated_at", "-id")
    return list(qs[:limit])
