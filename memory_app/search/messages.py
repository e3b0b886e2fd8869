"""Search inside one context: PostgreSQL full-text, pgvector cosine, and their fusion.

Within one context every mode returns min(k, n) results, whatever share of the table that
context holds. Full-text search finds every match (the GIN index answers `@@` without loss) but
ranks the newest `AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES` of them only (see `keyword_ranking`),
so that its cost does not grow with the context. Vector search:

- a context with fewer than `AGENTMEMORY_SEARCH_EXACT_THRESHOLD` messages is scanned exactly
  (its rows through the (context, model) btree index, the k nearest kept by a top-N sort): for a
  few thousand rows that is faster than any index walk, and exactly ranked;
- a larger context walks the model's HNSW index with pgvector's iterative scan (0.8), which goes
  on until k of the context's rows are found however small its share of the store, with
  `hnsw.ef_search` grown with the store's size (`AGENTMEMORY_HNSW_EF_SEARCH[_STEPS]`). The walk
  itself returns k; only a context with far fewer vectors than messages (most not embedded)
  can come back short, and then holds few vectors: those are scanned exactly ("hnsw+exact").
  Vectors of a large batch that wait for the indexer (not yet in the graph) are scanned exactly
  beside the walk and merged by distance ("hnsw+pending"), so a stored vector is found at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from django.conf import settings
from django.db import connection, transaction

from memory_app import errors
from memory_app.embeddings import client_vectors, indexer, providers
from memory_app.errors import Invalid, ProviderDown, SemanticUnavailable
from memory_app.models import FTS_CONFIG, Context, Message
from memory_app.search import fulltext

Mode = Literal["auto", "keyword", "semantic", "hybrid"]
MAX_QUERY_CHARS = 10_000
# Reciprocal rank fusion constant (Cormack et al.): damps the weight of top ranks.
RRF_K = 60
# Keyword candidates are looked for in the latest KEYWORD_RECENT_SEQS seqs first, then in the
# older ones through the GIN index (see _keyword_candidates).
KEYWORD_RECENT_SEQS = 2_000


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
    search_seq: int | None = None,
) -> list[tuple[int, float]]:
    """(message id, ts_rank) of live messages matching `query`, best first, ties newest first.

    `match="all"` reads the query as a web search (websearch_to_tsquery: every word, "quoted
    phrases", -exclusions, or); `match="any"` matches any of its words, ranked by how many.

    Only the newest `AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES` matches of the context are ranked
    (every match when fewer match, so small contexts are ranked exactly): ranking reads each
    candidate row, and an any-word query can match a fifth of a million-message context.
    `last_seq` and `search_seq` are the context's counters (read when not given; an older
    `search_seq` is always safe). See `_keyword_candidates`.
    """
    tsquery = _tsquery_text(query, match)
    if not tsquery:
        return []
    if last_seq is None or search_seq is None:
        last_seq, search_seq = Context.objects.filter(pk=context_id).values_list(
            "last_seq", "search_seq"
        ).first() or (0, 0)
    found = _keyword_candidates(
        context_id=context_id,
        tsquery=tsquery,
        last_seq=last_seq,
        search_seq=search_seq,
        candidates=max(settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES, limit),
        exclude_ids=list(exclude_ids),
    )
    found.sort(key=lambda row: (-row[2], -row[1]))
    return [(mid, score) for mid, _, score in found[:limit]]


# The keyword passes of `_keyword_candidates` as SQL text: seq bounds are ints written into the
# text, the rest are parameters.
def _parsed_pass(after: int, upto: int) -> str:
    """A keyword pass over messages the indexer has not reached: their text is parsed (its first
    part, as the indexer parses it)."""
    return f"""
        SELECT m.id, m.seq,
               ts_rank(memory_app_search_vector(%(config)s::regconfig, m.text), %(q)s::tsquery)
        FROM memory_app_message m
        WHERE m.context_id = %(context)s AND m.pruned_at IS NULL
          AND m.seq > {int(after)} AND m.seq <= {int(upto)}
          AND memory_app_search_vector(%(config)s::regconfig, m.text) @@ %(q)s::tsquery
          AND NOT (m.id = ANY(%(exclude)s))
        ORDER BY m.seq DESC LIMIT %(need)s
    """  # noqa: S608 - constant SQL


def _stored_pass(after: int, upto: int, match: str) -> str:
    """A keyword pass over stored vectors, `match` being the condition on s.search_vector."""
    # The message's id is looked up for each candidate (a subplan on
    # message_context_seq_unique), never by joining the context's messages.
    return f"""
        SELECT c.id, c.seq, c.rank FROM (
            SELECT (SELECT m.id FROM memory_app_message m
                    WHERE m.context_id = %(context)s AND m.seq = s.seq) AS id,
                   s.seq, ts_rank(s.search_vector, %(q)s::tsquery) AS rank
            FROM {fulltext.TABLE} s
            WHERE s.context_id = %(context)s AND s.seq > {int(after)} AND s.seq <= {int(upto)}
              AND {match}
            ORDER BY s.seq DESC LIMIT %(need)s + cardinality(%(exclude)s::bigint[])
        ) c
        WHERE c.id IS NOT NULL AND NOT (c.id = ANY(%(exclude)s))
        ORDER BY c.seq DESC LIMIT %(need)s
    """  # noqa: S608 - constant SQL


def _keyword_candidates(
    *,
    context_id: int,
    tsquery: str,
    last_seq: int,
    search_seq: int,
    candidates: int,
    exclude_ids: list[int],
) -> list[tuple[int, int, float]]:
    """(id, seq, ts_rank) of the newest `candidates` live matches, newest seqs first, in passes
    whose cost follows the candidates, not the context's size.

    Up to the context's `search_seq` the vectors are read from MessageSearch (live messages
    only, keyed by (context, seq)); after it, where the indexer has not been yet, each message's
    text is parsed (a large batch just stored: its size is read until the indexer catches up,
    as deferred vectors are scanned). In seq order, newest first:

    1. Messages past `search_seq` in the latest KEYWORD_RECENT_SEQS seqs (none, usually: small
       appends write their vectors at once).
    2. The vectors of the latest KEYWORD_RECENT_SEQS seqs, walked back on the primary key until
       enough match: frequent words (the usual case for natural-language prompts) stop early.
       The match is written as a call of `ts_match_vq` (the function behind `@@`) so the
       planner does not take the GIN index here: on a frequent word its posting list is far
       longer than the walk.
    3. Older messages past `search_seq` (a backlog deeper than the recent seqs).
    4. The older vectors, newest first, where the planner takes the GIN index for rare words
       (and walks on for words that are frequent further back, stopping at the candidates it
       still needs).
    Each pass looks up the ids of the messages it found only (message_context_seq_unique).
    """
    older = max(last_seq - KEYWORD_RECENT_SEQS, 0)
    searched_older = min(search_seq, older)
    # No upper bound on the newest pass: messages appended since `last_seq` was read.
    newest = 2**63 - 1
    passes = [
        # 1 and 2 in one statement (every row of the first is newer than the second's).
        f"({_parsed_pass(max(search_seq, older), newest)}) UNION ALL"
        f" ({_stored_pass(older, search_seq, 'ts_match_vq(s.search_vector, %(q)s::tsquery)')})"
        " ORDER BY 2 DESC LIMIT %(need)s",
        _parsed_pass(searched_older, older) if search_seq < older else None,
        _stored_pass(0, searched_older, "s.search_vector @@ %(q)s::tsquery")
        if searched_older > 0
        else None,
    ]
    params = {"context": context_id, "q": tsquery, "exclude": exclude_ids, "config": FTS_CONFIG}
    found: list = []
    with connection.cursor() as cursor:
        for sql in passes:
            if len(found) >= candidates:
                break
            if sql:
                cursor.execute(sql, {**params, "need": candidates - len(found)})
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
    `model`, nearest first, ties by id; and which path answered ("exact", "hnsw", or
    "hnsw+exact" when the walk came back short, "hnsw+pending" when vectors waiting for the
    indexer were merged in).

    `context_size` (the context's message count, an upper bound on its vectors) spares the
    count of its vectors that otherwise decides between the exact scan and the index."""
    threshold = settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD
    if context_size is None:
        with connection.cursor() as cursor:
            # Counted up to the threshold only: the decision needs no more.
            cursor.execute(
                "SELECT count(*) FROM (SELECT 1 FROM memory_app_embedding WHERE context_id = "
                "%s AND model = %s LIMIT %s) s",
                [context_id, model, max(threshold, limit)],
            )
            context_size = cursor.fetchone()[0]
        if context_size == 0:
            return [], "exact"
    approximate = context_size >= threshold and len(vector) <= indexer.HNSW_MAX_DIMENSIONS
    return nearest_vectors(
        model=model,
        vector=vector,
        limit=limit,
        item_column="message_id",
        join_sql="JOIN memory_app_message m ON m.id = e.message_id",
        # The context on both sides: the planner reaches the messages through its index
        # rather than scanning the whole table for a hash join.
        where_sql="e.context_id = %s AND m.context_id = %s AND m.pruned_at IS NULL"
        " AND NOT (m.id = ANY(%s))",
        params=[context_id, context_id, list(exclude_ids)],
        approximate=approximate,
        share=context_size,
    )


def nearest_vectors(
    *,
    model: str,
    vector: Sequence[float],
    limit: int,
    item_column: str,
    join_sql: str,
    where_sql: str,
    params: Sequence[Any],
    approximate: bool,
    share: int | None = None,
) -> tuple[list[tuple[int, float]], str]:
    """(item id, cosine distance) of the `model` vectors (alias `e`) nearest to `vector` among
    those `where_sql` keeps, nearest first, ties by id; and the path that answered.

    `approximate` walks the model's HNSW index with pgvector's iterative scan ("hnsw"): the walk
    goes on until `limit` rows pass the filter, so a filter keeping a small share of the store
    still gets `limit` rows (up to `hnsw.max_scan_tuples`, sized from `share`, the number of rows
    the filter may keep). It comes back short only when the filter keeps far fewer vectors than
    `share` says (messages not embedded yet, or most of the vectors still waiting for the
    indexer): those few are then scanned exactly ("hnsw+exact"). Vectors waiting for the indexer
    are scanned exactly beside the walk and merged by distance ("hnsw+pending" when any was).
    Otherwise ("exact") every kept row is scanned and the `limit` nearest kept (a top-N sort in
    memory: only `limit` rows are held, nothing spills to disk), exact and, for a few thousand
    rows, faster than the index."""
    dims = int(len(vector))
    literal = vector_literal(vector)
    # The query vector is written once (384 numbers of text, parsed once by the server) and
    # referenced from each part; an uncorrelated subquery is a parameter the index scan takes.
    query_cte = f"q AS MATERIALIZED (SELECT %s::vector({dims}) AS v)"
    distance = f"e.vector::vector({dims}) <=> (SELECT v FROM q)"  # noqa: S608 - dims is an int
    # The walk orders by the index's expression (half precision); the rows it keeps are then
    # ranked by their full-precision distance.
    walk_distance = f"e.vector::halfvec({dims}) <=> (SELECT v::halfvec({dims}) FROM q)"  # noqa: S608
    rows = f"""
        FROM memory_app_embedding e {join_sql}
        WHERE e.model = %s AND e.dimensions = {dims} AND e.vector IS NOT NULL AND {where_sql}
    """  # noqa: S608 - dims is an int; the fragments are the callers' constants
    if approximate:
        # Relaxed order lets the walk return rows slightly out of distance order (better recall
        # per visited node); the materialized CTE sorts the `limit` rows it kept. The walk
        # covers the rows in the graph (`e.indexed`, the index's predicate); rows of a deferred
        # batch still waiting for the indexer are scanned exactly (through their small partial
        # index) and merged by distance, so they are found at once.
        sql = f"""
            WITH {query_cte}, nearest AS MATERIALIZED (
                SELECT e.{item_column} AS item_id, {distance} AS distance {rows} AND e.indexed
                ORDER BY {walk_distance} LIMIT %s
            ), waiting AS MATERIALIZED (
                SELECT e.{item_column} AS item_id, {distance} AS distance {rows} AND NOT e.indexed
                ORDER BY distance, item_id LIMIT %s
            )
            SELECT item_id, distance, false FROM nearest
            UNION ALL SELECT item_id, distance, true FROM waiting
        """  # noqa: S608
        args = [literal, model, *params, limit, model, *params, limit]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(hnsw_settings_sql(model=model, dims=dims, limit=limit, share=share))
            cursor.execute(sql, args)
            found = cursor.fetchall()
        hits = sorted(((row[0], float(row[1])) for row in found), key=lambda hit: (hit[1], hit[0]))
        walked = sum(1 for row in found if not row[2])
        if walked == limit:
            return hits[:limit], "hnsw" if len(found) == walked else "hnsw+pending"
    # OFFSET 0 keeps the subquery apart, so the ORDER BY cannot be answered by the HNSW index.
    sql = f"""
        WITH {query_cte}
        SELECT item_id, distance FROM (
            SELECT e.{item_column} AS item_id, {distance} AS distance {rows} OFFSET 0
        ) s ORDER BY distance, item_id LIMIT %s
    """  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, [literal, model, *params, limit])
        hits = [(row[0], float(row[1])) for row in cursor.fetchall()]
    return hits, "hnsw+exact" if approximate else "exact"


# pgvector's defaults: hnsw.ef_search 40, hnsw.max_scan_tuples 20,000.
MIN_SCAN_TUPLES = 20_000
MAX_EF_SEARCH = 1000
SCAN_WORK_MEM_MB = 64
_store_sizes: dict[tuple[str, int], tuple[float, int]] = {}
STORE_SIZE_TTL = 300.0


def store_size(model: str, dims: int) -> int:
    """How many vectors the model's HNSW index holds, from the planner's statistics (kept up to
    date by autovacuum's ANALYZE, which estimates a partial index's own rows), cached per
    process for a few minutes.

    The index's own estimate, not the table's: the table holds every model's vectors (a
    re-embed keeps the old ones), and a store counted too large makes every search walk
    further. Only an index with no estimate yet (never analysed, or built empty and filled
    since) falls back to the table's."""
    import time

    key = (model, dims)
    now = time.monotonic()
    cached = _store_sizes.get(key)
    if cached and cached[0] > now:
        return cached[1]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT greatest(CASE WHEN i.reltuples > 0 THEN i.reltuples ELSE t.reltuples END, 0)"
            "::bigint FROM pg_class t LEFT JOIN pg_class i ON i.relname = %s"
            " WHERE t.relname = 'memory_app_embedding'",
            [indexer.index_name(model, dims)],
        )
        size = int(cursor.fetchone()[0])
    _store_sizes[key] = (now + STORE_SIZE_TTL, size)
    return size


def ef_search_for(store: int, limit: int, share: int | None = None) -> int:
    """hnsw.ef_search for a store of `store` vectors: `AGENTMEMORY_HNSW_EF_SEARCH` when set,
    else grown with the store (a bigger graph needs a longer candidate list for the same recall)
    along `AGENTMEMORY_HNSW_EF_SEARCH_STEPS`, log-linearly between two steps (the store size is
    the planner's estimate: 999,963 and 1,000,000 must get about the same); never below twice
    the rows asked for.

    `share`: how many of the store's vectors the search's filter keeps (one context's). The
    iterative scan finds `limit` of them however few they are, but the further the walk goes
    past its first candidate list the likelier it is to step over some of the nearest: a filter
    keeping a small share gets a longer list, by the square root of store / share (a context of
    30,000 vectors in a store of 1,200,000: 6.3 times), up to MAX_EF_SEARCH."""
    base = settings.AGENTMEMORY_HNSW_EF_SEARCH
    if not base:
        steps = settings.AGENTMEMORY_HNSW_EF_SEARCH_STEPS or [(0, 40)]
        base = steps[0][1]
        for (size, ef), (next_size, next_ef) in zip(steps, steps[1:], strict=False):
            if store >= next_size:
                base = next_ef
            elif store > size > 0:
                step = math.log(store / size) / math.log(next_size / size)
                base = round(ef + (next_ef - ef) * step)
                break
            else:
                break
        if share and 0 < share < store:
            base = math.ceil(base * math.sqrt(store / share))
    return max(1, min(max(base, 2 * limit), MAX_EF_SEARCH))


def hnsw_settings_sql(*, model: str, dims: int, limit: int, share: int | None) -> str:
    """SET LOCAL statements for one HNSW query (only ints, no parameters: one round trip)."""
    store = store_size(model, dims)
    ef = ef_search_for(store, limit, share)
    # To find `limit` rows of a filter keeping `share` of `store` rows, the walk visits about
    # limit * store / share rows; four times that, so a clustered filter still gets its rows.
    share = max(share or store or 1, 1)
    scan = max(MIN_SCAN_TUPLES, 4 * limit * max(store, share) // share)
    # The walk also stops when the tuples it holds outgrow work_mem * hnsw.scan_mem_multiplier
    # (each holds its vector): room for `scan` of them.
    multiplier = max(1, -(-scan * (dims * 4 + 256) // (SCAN_WORK_MEM_MB << 20)))
    return (
        f"SET LOCAL hnsw.ef_search = {int(ef)}; "
        "SET LOCAL hnsw.iterative_scan = relaxed_order; "
        f"SET LOCAL hnsw.max_scan_tuples = {int(scan)}; "
        f"SET LOCAL work_mem = '{SCAN_WORK_MEM_MB}MB'; "
        f"SET LOCAL hnsw.scan_mem_multiplier = {int(min(multiplier, 1000))}; "
        # The index is the plan asked for: a sort over the filter's rows is what it replaces.
        "SET LOCAL enable_sort = off"
    )


# --- the entry point --------------------------------------------------------------------------


def query_vector_for(
    *, query: str, model: str | None, query_vector: Sequence[float] | None
) -> tuple[list[float], str]:
    """The vector to search with and its model: the client's own, or the provider's."""
    if query_vector is not None:
        if not model:
            raise Invalid("a query_vector needs the name of the model it comes from")
        return client_vectors.check_vector(model=model, vector=query_vector), model
    provider = providers.get_provider()
    if provider is None:
        raise SemanticUnavailable(
            "semantic search needs an embedding provider (AGENTMEMORY_EMBEDDING_PROVIDER is "
            "'none') "
            "or a query_vector with its model; keyword search is available"
        )
    if model and model != provider.model:
        raise SemanticUnavailable(
            f"the server embeds queries with {provider.model!r}; send a query_vector to "
            f"search {model!r}"
        )
    try:
        [vector] = provider.embed([query])
    except errors.ProviderError as exc:
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
    query = _checked_query(query, mode=mode, k=k, match=match)
    notes: list[str] = []
    asked_auto = mode == "auto"
    if mode == "auto":
        available = query_vector is not None or providers.get_provider() is not None
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
            search_seq=context.search_seq,
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
    order = _ranked_order(mode, keyword, semantic, kw=kw, sem=sem)[:k]
    hits = _hits(order, kw=kw, sem=sem)
    if mode in ("keyword", "hybrid"):
        notes += fulltext.truncation_notes([h.message for h in hits])
    return SearchResult(hits=hits, mode=mode, model=used_model, notes=notes)


def _checked_query(query: str, *, mode: str, k: Any, match: str | None) -> str:
    """The query (empty for none) once the search's arguments are known to be valid."""
    if mode not in ("auto", "keyword", "semantic", "hybrid"):
        raise Invalid("mode must be one of auto, keyword, semantic, hybrid")
    if not isinstance(k, int) or not 1 <= k <= 1000:
        raise Invalid("k must be an integer between 1 and 1000")
    query = query or ""
    if len(query) > MAX_QUERY_CHARS:
        raise Invalid(f"the query is longer than {MAX_QUERY_CHARS} characters")
    if match not in (None, "all", "any"):
        raise Invalid("match must be 'all' or 'any'")
    return query


def _ranked_order(
    mode: str,
    keyword: list[tuple[int, float]],
    semantic: list[tuple[int, float]],
    *,
    kw: dict[int, tuple[int, float]],
    sem: dict[int, tuple[int, float]],
) -> list[tuple[int, float]]:
    """(message id, score), best first: one ranking alone, or both fused when both found some."""
    if mode == "keyword" or (mode == "hybrid" and not sem):
        return [(mid, s) for mid, s in keyword]
    if mode == "semantic" or not kw:
        return [(mid, 1.0 - d) for mid, d in semantic]
    fused = rrf_scores(keyword, semantic)
    # Ties: better best rank first, then id (newer) for a stable order.
    return sorted(
        fused.items(),
        key=lambda item: (
            -item[1],
            min(kw.get(item[0], (10**9,))[0], sem.get(item[0], (10**9,))[0]),
            -item[0],
        ),
    )


def _hits(
    order: list[tuple[int, float]],
    *,
    kw: dict[int, tuple[int, float]],
    sem: dict[int, tuple[int, float]],
) -> list[Hit]:
    """The ranked messages, each with where it stood in the keyword and the semantic ranking."""
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
    return hits
