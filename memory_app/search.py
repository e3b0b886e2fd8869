"""Search inside one context: PostgreSQL full-text, pgvector cosine, and their fusion.

Within one context every mode returns min(k, n) results ranked as an exact scan would, whatever
share of the table that context holds. Full-text search finds every match (the GIN index answers
`@@` without loss) but ranks the newest `AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES` of them only
(see `keyword_ranking`), so that its cost does not grow with the context. Vector search needs
care: pgvector 0.6 has no iterative index scans and applies a WHERE filter *after* the HNSW
scan, which yields at most `hnsw.ef_search` candidates store-wide, so a small context could get
fewer than k hits, or none. Hence:

- a context with fewer than `AGENTMEMORY_SEARCH_EXACT_THRESHOLD` vectors of the model (counted
  on the (context, model) btree index) is scanned exactly: its rows are fetched first (a
  MATERIALIZED CTE keeps the planner from switching to the HNSW index) and sorted by distance;
- a larger context uses the model's HNSW index with `hnsw.ef_search` raised for the query and an
  over-fetch, then keeps its own rows; if that leaves fewer than k, it falls back to the exact scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from django.conf import settings
from django.db import connection, transaction

from memory_app import embeddings
from memory_app.logbook import DomainError, Invalid
from memory_app.models import FTS_CONFIG, Context, Message

Mode = Literal["auto", "keyword", "semantic", "hybrid"]
MAX_QUERY_CHARS = 10_000
# Reciprocal rank fusion constant (Cormack et al.): damps the weight of top ranks.
RRF_K = 60
# Keyword candidates are looked for in the latest KEYWORD_RECENT_SEQS seqs first, then in the
# older ones through the GIN index (see _keyword_candidates).
KEYWORD_RECENT_SEQS = 2_000


class SemanticUnavailable(Invalid):
    """Semantic search was asked for with no provider and no query vector."""


class ProviderDown(DomainError):
    """The configured provider could not embed the query right now (503 at the API)."""


@dataclass(frozen=True)
class Hit:
    message: Message
    rank: int
    score: float
    keyword_rank: int | None = None
    keyword_score: float | None = None
    semantic_rank: int | None = None
    distance: float | None = None

    @property
    def explain(self) -> str:
        parts = []
        if self.keyword_rank is not None:
            parts.append(f"keyword #{self.keyword_rank}, ts_rank {self.keyword_score:.4f}")
        if self.semantic_rank is not None:
            parts.append(f"semantic #{self.semantic_rank}, cosine distance {self.distance:.4f}")
        return "; ".join(parts)


@dataclass
class SearchResult:
    hits: list[Hit]
    mode: str
    model: str | None = None
    notes: list[str] = field(default_factory=list)


# --- keyword ----------------------------------------------------------------------------------


def _any_terms_tsquery(query: str) -> str:
    """A tsquery text OR-ing the query's stemmed lexemes (for natural-language prompts, where
    requiring every word would rarely match); empty when the query holds no lexeme."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tsvector_to_array(to_tsvector(%s::regconfig, %s))", [FTS_CONFIG, query]
        )
        lexemes = cursor.fetchone()[0] or []
    return " | ".join("'" + lx.replace("\\", "\\\\").replace("'", "''") + "'" for lx in lexemes)


def _tsquery_text(query: str, match: str) -> str:
    """The text of the tsquery for `query`: a web search (every word, "quoted phrases",
    -exclusions, or) for `match="all"`, any of its words for `match="any"`. Empty when the query
    holds no lexeme (only stop words or punctuation)."""
    if match == "any":
        return _any_terms_tsquery(query)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT q::text FROM websearch_to_tsquery(%s::regconfig, %s) q WHERE numnode(q) > 0",
            [FTS_CONFIG, query],
        )
        row = cursor.fetchone()
        return row[0] if row else ""


def keyword_ranking(
    *,
    context_id: int,
    query: str,
    limit: int,
    exclude_ids: Sequence[int] = (),
    match: str = "all",
    last_seq: int | None = None,
) -> list[tuple[int, float]]:
    """(message id, ts_rank) of live messages matching `query`, best first, ties newest first.

    `match="all"` reads the query as a web search (websearch_to_tsquery: every word, "quoted
    phrases", -exclusions, or); `match="any"` matches any of its words, ranked by how many.

    Only the newest `AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES` matches of the context are ranked
    (every match when fewer match, so small contexts are ranked exactly): ranking reads each
    candidate row, and an any-word query can match a fifth of a million-message context.
    `last_seq` is the context's counter (read when not given). See `_keyword_candidates`.
    """
    tsquery = _tsquery_text(query, match)
    if not tsquery:
        return []
    if last_seq is None:
        last_seq = (
            Context.objects.filter(pk=context_id).values_list("last_seq", flat=True).first() or 0
        )
    found = _keyword_candidates(
        context_id=context_id,
        tsquery=tsquery,
        last_seq=last_seq,
        candidates=max(settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES, limit),
        exclude_ids=list(exclude_ids),
    )
    found.sort(key=lambda row: (-row[2], -row[1]))
    return [(mid, score) for mid, _, score in found[:limit]]


def _keyword_candidates(
    *, context_id: int, tsquery: str, last_seq: int, candidates: int, exclude_ids: list[int]
) -> list[tuple[int, int, float]]:
    """(id, seq, ts_rank) of the newest `candidates` live matches, in two passes whose cost
    follows the candidates, not the context's size.

    1. The latest KEYWORD_RECENT_SEQS seqs, walked back on the recent-messages index until
       enough match: frequent words (the usual case for natural-language prompts) stop early.
       The match is written as a call of `ts_match_vq` (the function behind `@@`) so the planner
       does not take the GIN index here: on a frequent word its posting list is far longer than
       the walk.
    2. If too few matched there, the words are rare in the recent history: the older seqs,
       newest first, where the planner takes the GIN index for rare words (and walks on for
       words that are frequent further back, stopping at the candidates it still needs).
    """
    params = {"context": context_id, "q": tsquery, "exclude": exclude_ids}
    recent = """
        SELECT m.id, m.seq, ts_rank(m.search_vector, %(q)s::tsquery)
        FROM memory_app_message m
        WHERE m.context_id = %(context)s AND m.pruned_at IS NULL AND m.seq > %(after)s
          AND ts_match_vq(m.search_vector, %(q)s::tsquery) AND NOT (m.id = ANY(%(exclude)s))
        ORDER BY m.seq DESC LIMIT %(need)s
    """
    older = """
        SELECT m.id, m.seq, ts_rank(m.search_vector, %(q)s::tsquery)
        FROM memory_app_message m
        WHERE m.context_id = %(context)s AND m.pruned_at IS NULL AND m.seq <= %(upto)s
          AND m.search_vector @@ %(q)s::tsquery AND NOT (m.id = ANY(%(exclude)s))
        ORDER BY m.seq DESC LIMIT %(need)s
    """
    upto = max(last_seq - KEYWORD_RECENT_SEQS, 0)
    with connection.cursor() as cursor:
        cursor.execute(recent, {**params, "after": upto, "need": candidates})
        found = cursor.fetchall()
        if len(found) < candidates and upto > 0:
            cursor.execute(older, {**params, "upto": upto, "need": candidates - len(found)})
            found += cursor.fetchall()
    return [(mid, seq, float(score)) for mid, seq, score in found]


# --- semantic ---------------------------------------------------------------------------------


def rrf_scores(*rankings: Sequence[tuple[int, Any]]) -> dict[int, float]:
    """Reciprocal rank fusion: each id scores the sum of 1 / (RRF_K + rank) over the rankings
    (each a best-first list of (id, score)) it appears in."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, (item_id, _) in enumerate(ranking, start=1):
            fused[item_id] = fused.get(item_id, 0.0) + 1.0 / (RRF_K + rank)
    return fused


def vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def semantic_ranking(
    *,
    context_id: int,
    model: str,
    vector: Sequence[float],
    limit: int,
    exclude_ids: Sequence[int] = (),
    context_size: int | None = None,
) -> tuple[list[tuple[int, float]], str]:
    """(message id, cosine distance) of the context's live messages nearest to `vector` under
    `model`, nearest first, ties by id; and which path answered ("exact" or "hnsw").

    `context_size` (the context's message count, an upper bound on its vectors) spares the
    count of its vectors that otherwise decides between the exact scan and the index."""
    dims = len(vector)
    threshold = settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD
    if context_size is None:
        with connection.cursor() as cursor:
            # Counted up to the threshold only: the decision needs no more.
            cursor.execute(
                "SELECT count(*) FROM (SELECT 1 FROM memory_app_embedding WHERE context_id = %s AND model = %s LIMIT %s) s",
                [context_id, model, max(threshold, limit)],
            )
            context_size = cursor.fetchone()[0]
        if context_size == 0:
            return [], "exact"
    if context_size >= threshold and dims <= embeddings.HNSW_MAX_DIMENSIONS:
        hits = _hnsw_ranking(
            context_id=context_id, model=model, vector=vector, limit=limit, exclude_ids=exclude_ids
        )
        # Fewer than `limit` means the post-filter ate into the answer (or the context holds
        # fewer vectors than its size says): the exact scan below is right in both cases.
        if len(hits) >= limit:
            return hits, "hnsw"
    return _exact_ranking(
        context_id=context_id, model=model, vector=vector, limit=limit, exclude_ids=exclude_ids
    ), "exact"


def _exact_ranking(*, context_id, model, vector, limit, exclude_ids) -> list[tuple[int, float]]:
    dims = int(len(vector))
    sql = f"""
        WITH candidates AS MATERIALIZED (
            SELECT e.message_id, e.vector
            FROM memory_app_embedding e JOIN memory_app_message m ON m.id = e.message_id
            WHERE e.context_id = %s AND e.model = %s AND e.dimensions = {dims}
              AND e.vector IS NOT NULL AND m.pruned_at IS NULL AND NOT (m.id = ANY(%s))
        )
        SELECT message_id, vector::vector({dims}) <=> %s::vector({dims}) AS distance
        FROM candidates ORDER BY distance, message_id LIMIT %s
    """  # noqa: S608 - dims is an int
    with connection.cursor() as cursor:
        cursor.execute(sql, [context_id, model, list(exclude_ids), vector_literal(vector), limit])
        return [(row[0], float(row[1])) for row in cursor.fetchall()]


def _hnsw_ranking(*, context_id, model, vector, limit, exclude_ids) -> list[tuple[int, float]]:
    """Approximate top-k through the model's HNSW index: the index scan yields up to
    `hnsw.ef_search` store-wide candidates; the context's own are kept afterwards."""
    dims = int(len(vector))
    ef_search = max(settings.AGENTMEMORY_HNSW_EF_SEARCH, limit * 4)
    ef_search = min(ef_search, 1000)  # pgvector's ceiling
    sql = f"""
        SELECT c.message_id, c.distance FROM (
            SELECT e.message_id, e.context_id, e.vector::vector({dims}) <=> %s::vector({dims}) AS distance
            FROM memory_app_embedding e
            WHERE e.model = %s AND e.dimensions = {dims} AND e.vector IS NOT NULL
            ORDER BY e.vector::vector({dims}) <=> %s::vector({dims})
            LIMIT {ef_search}
        ) c JOIN memory_app_message m ON m.id = c.message_id
        WHERE c.context_id = %s AND m.pruned_at IS NULL AND NOT (m.id = ANY(%s))
        ORDER BY c.distance, c.message_id LIMIT %s
    """  # noqa: S608 - dims and ef_search are ints
    literal = vector_literal(vector)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL hnsw.ef_search = {ef_search}")
        cursor.execute(sql, [literal, model, literal, context_id, list(exclude_ids), limit])
        return [(row[0], float(row[1])) for row in cursor.fetchall()]


# --- the entry point --------------------------------------------------------------------------


def query_vector_for(
    *, query: str, model: str | None, query_vector: Sequence[float] | None
) -> tuple[list[float], str]:
    """The vector to search with and its model: the client's own, or the provider's."""
    if query_vector is not None:
        if not model:
            raise Invalid("a query_vector needs the name of the model it comes from")
        return embeddings.check_vector(model=model, vector=query_vector), model
    provider = embeddings.get_provider()
    if provider is None:
        raise SemanticUnavailable(
            "semantic search needs an embedding provider (AGENTMEMORY_EMBEDDING_PROVIDER is 'none') "
            "or a query_vector with its model; keyword search is available"
        )
    if model and model != provider.model:
        raise SemanticUnavailable(
            f"the server embeds queries with {provider.model!r}; send a query_vector to search {model!r}"
        )
    try:
        [vector] = provider.embed([query])
    except embeddings.ProviderError as exc:
        raise ProviderDown(f"the embedding provider is unavailable: {exc}") from exc
    return vector, provider.model


def search_messages(
    *,
    context: Context,
    query: str,
    k: int = 5,
    mode: Mode = "auto",
    model: str | None = None,
    query_vector: Sequence[float] | None = None,
    exclude_ids: Sequence[int] = (),
    match: str | None = None,
) -> SearchResult:
    """Top `k` live messages of `context` for `query`.

    `auto` is hybrid when vectors can be had (a provider, or a client query vector), keyword
    otherwise. Keyword search in hybrid/auto mode matches any word of the query (natural-language
    prompts); in keyword mode it reads the query as a web search unless `match="any"`.
    """
    if mode not in ("auto", "keyword", "semantic", "hybrid"):
        raise Invalid("mode must be one of auto, keyword, semantic, hybrid")
    if not isinstance(k, int) or not 1 <= k <= 1000:
        raise Invalid("k must be an integer between 1 and 1000")
    query = query or ""
    if len(query) > MAX_QUERY_CHARS:
        raise Invalid(f"the query is longer than {MAX_QUERY_CHARS} characters")
    if match not in (None, "all", "any"):
        raise Invalid("match must be 'all' or 'any'")
    notes: list[str] = []
    asked_auto = mode == "auto"
    if mode == "auto":
        available = query_vector is not None or embeddings.get_provider() is not None
        mode = "hybrid" if available else "keyword"
    if not query.strip() and query_vector is None:
        return SearchResult(hits=[], mode=mode, notes=["empty query"])

    keyword: list[tuple[int, float]] = []
    semantic: list[tuple[int, float]] = []
    used_model = None
    fetch = k if mode != "hybrid" else max(k * 3, 20)
    if mode in ("keyword", "hybrid") and query.strip():
        keyword = keyword_ranking(
            context_id=context.pk,
            query=query,
            limit=fetch,
            exclude_ids=exclude_ids,
            match=match or ("all" if mode == "keyword" and not asked_auto else "any"),
            last_seq=context.last_seq,
        )
    if mode in ("semantic", "hybrid"):
        try:
            vector, used_model = query_vector_for(
                query=query, model=model, query_vector=query_vector
            )
        except (SemanticUnavailable, ProviderDown) as exc:
            if mode == "semantic":
                raise
            notes.append(f"semantic part skipped: {exc}")
        else:
            semantic, path = semantic_ranking(
                context_id=context.pk,
                model=used_model,
                vector=vector,
                limit=fetch,
                exclude_ids=exclude_ids,
                context_size=context.message_count,
            )
            notes.append(f"vector scan: {path}")

    kw = {mid: (i, s) for i, (mid, s) in enumerate(keyword, start=1)}
    sem = {mid: (i, d) for i, (mid, d) in enumerate(semantic, start=1)}
    if mode == "keyword" or (mode == "hybrid" and not sem):
        order = [(mid, s) for mid, s in keyword]
    elif mode == "semantic" or not kw:
        order = [(mid, 1.0 - d) for mid, d in semantic]
    else:
        fused = rrf_scores(keyword, semantic)
        # Ties: better best rank first, then id (newer) for a stable order.
        order = sorted(
            fused.items(),
            key=lambda item: (
                -item[1],
                min(kw.get(item[0], (10**9,))[0], sem.get(item[0], (10**9,))[0]),
                -item[0],
            ),
        )
    order = order[:k]
    messages = Message.objects.in_bulk([mid for mid, _ in order])
    hits = []
    for rank, (mid, score) in enumerate(order, start=1):
        hits.append(
            Hit(
                message=messages[mid],
                rank=rank,
                score=score,
                keyword_rank=kw[mid][0] if mid in kw else None,
                keyword_score=kw[mid][1] if mid in kw else None,
                semantic_rank=sem[mid][0] if mid in sem else None,
                distance=sem[mid][1] if mid in sem else None,
            )
        )
    return SearchResult(hits=hits, mode=mode, model=used_model, notes=notes)
