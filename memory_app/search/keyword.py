"""Keyword search inside one context: PostgreSQL full-text matches ranked by BM25.

A message matches when it holds any word of the query or any of its "quoted phrases", and none
of its -exclusions (websearch syntax); `match="all"` asks for every word instead
(websearch_to_tsquery as written). The matches are scored by BM25 with term frequencies read
from the stored tsvectors and document frequencies counted per term with a cap (the formula and
its approximations: `memory_app.search.bm25`). The work is bounded whatever the context's size:
a context of up to KEYWORD_EXACT_MESSAGES messages has every match scored with exact counts, in
one prepared statement that also parses the query (`_EXACT_SQL`; up to KEYWORD_SCAN_MESSAGES
messages its own rows are matched, past that its matches read through the GIN index, for a
query of up to `AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS` terms). In a larger context, or for a
longer query past KEYWORD_SCAN_MESSAGES, a long query keeps its phrases and rarest words
(`keyword_terms.rarest_terms`) and each term reads at most
`AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES` of its newest matches, as many as its weight asks for
(`bm25.plan_term`, from its matches among the latest seqs), through the GIN index or a walk back
on the primary key bounded in rows (see `_term_candidates`), and the server scores them in the
same statement (`RANK_SQL`).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings

from memory_app import db, shard_reads
from memory_app.models import FTS_CONFIG, Context, Message
from memory_app.search import bm25, fulltext, keyword_terms
from memory_app.search.keyword_query import QUERY_TERMS, KeywordQuery, parse_query, query_parts
from memory_app.search.keyword_terms import TAIL, read

# Keyword candidates are looked for in the latest KEYWORD_RECENT_SEQS seqs first, then in the
# older ones through the GIN index (see `_term_candidates`).
KEYWORD_RECENT_SEQS = 2_000
# The rows one term's older pass may cost (`bm25.plan_term`): a few milliseconds of the server's.
KEYWORD_TERM_ROWS = 10_000
# A context no larger than this is ranked exactly, in one statement: every match of every term
# read and scored, no more rows than one term's pass may cost in a larger context (see
# `_exact_found`).
KEYWORD_EXACT_MESSAGES = KEYWORD_TERM_ROWS
# A context of up to this many messages, ranked exactly, has its own stored vectors read and
# matched one by one (`_exact_sql`'s `scan`), never through the GIN index: its posting lists span
# every context, and the statement's one plan, made without the query, may read a query's lists
# there and keep the context's rows from them, far more rows than the context holds for a query
# of many or frequent words (the benchmark's composite selector on a small context). Past it the
# matches are read through the index, for a query of up to AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS
# terms (a longer one is ranked the bounded way, on its rarest words): a context's every vector
# read costs about as much as the latest seqs' in a larger one.
KEYWORD_SCAN_MESSAGES = 2_000


def keyword_ranking(
    *,
    context_id: int,
    query: str,
    limit: int,
    exclude_ids: Sequence[int] = (),
    match: str = "any",
    last_seq: int | None = None,
    search_seq: int | None = None,
    message_count: int | None = None,
    rows: dict[int, tuple] | None = None,
) -> list[tuple[int, float]]:
    """(message id, BM25 score) of live messages matching `query`, best first, ties newest first.

    `match="any"` matches any word or "phrase" of the query and none of its -exclusions;
    `match="all"` reads it as websearch_to_tsquery does (every word, phrases, exclusions, or).
    Either way the matches are ranked by BM25 over the context (see `memory_app.search.bm25`).

    Each term's newest matches are the candidates (and its count, exact below their number,
    estimated above it): up to `AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES`, every match of a rare
    term, fewer of a frequent one in a large context (`bm25.plan_term`, from each term's matches
    among the latest KEYWORD_RECENT_SEQS seqs, counted in one read of them). `last_seq`,
    `search_seq` and `message_count` are the context's counters (read when not given; an older
    `search_seq` is always safe). See `_term_candidates`. A small context needs only its size
    (as last seen will do): its statement reads the counters itself, and a request's deferred
    key read (`pipelines.deferred_read`) goes with it in one round trip (`pipelines.read_rows`).

    In a context of up to KEYWORD_EXACT_MESSAGES messages, one prepared statement (on one node,
    on one plan for every call) parses the query and scores every match (past
    KEYWORD_SCAN_MESSAGES, a query of more terms than the cap is found too long there and ranked
    the bounded way). In a larger one, two after the query's parse: the terms' counts in the
    latest seqs, then one for every term's passes, the document frequencies and the scores.
    The parse's text never changes: it is prepared on the connection. The other two are
    planned for each call's values (their shapes vary, and a generic plan could not see the
    tsqueries the passes were chosen for); their parameters are bound by the server.
    Either way the server sends back the top `limit` only (scoring a thousand candidates in
    Python, and sending them, cost more than finding them). With `rows` (a dict), the last
    statement also reads the top messages' columns (`db.select_columns`) into it by id: the
    hits need no read of their own.
    """
    columns = _MESSAGE_COLUMNS if rows is not None else ""
    params: dict = {"context": context_id, "exclude": list(exclude_ids), "limit": limit}
    if message_count is None:
        last_seq, search_seq, message_count = _counters(context_id)
    # A small context as far as the caller knows: ranked exactly, unless the statement finds it
    # has outgrown that (the counters it reads are the context's own).
    found = None
    known = None not in (last_seq, search_seq)
    if message_count <= KEYWORD_EXACT_MESSAGES and (
        not known or last_seq - search_seq <= KEYWORD_EXACT_MESSAGES
    ):
        parts = query_parts(query)
        if parts is None:
            return []
        scan = message_count <= KEYWORD_SCAN_MESSAGES
        found = _exact_found(params | parts, match=match, columns=columns, scan=scan)
        known = known and found is not None
    if found is None:
        if not known:
            last_seq, search_seq, message_count = _counters(context_id)
        parsed = parse_query(query)
        if not parsed.terms or (match == "all" and not parsed.strict):
            return []
        params.update(config=FTS_CONFIG, n=message_count, last_seq=last_seq, search_seq=search_seq)
        sql = _ranking_sql(
            params, parsed, match=match, columns=columns, excluding=bool(exclude_ids)
        )
        found = read(sql, params, lambda: ["bigint", "double precision", *_message_types(columns)])
    if rows is not None:
        rows.update((row[0], row[2:]) for row in found)
    return [(row[0], float(row[1])) for row in found]


def _counters(context_id: int) -> tuple[int, int, int]:
    """The context's last_seq, search_seq and message_count (zeros for no context)."""
    return Context.objects.filter(pk=context_id).values_list(
        "last_seq", "search_seq", "message_count"
    ).first() or (0, 0, 0)


def _exact_found(params: dict, *, match: str, columns: str, scan: bool) -> list[tuple] | None:
    """The rows of `_EXACT_SQL` (id, score, `columns`), best first; None when the context
    turned out larger than KEYWORD_EXACT_MESSAGES (or its indexer that far behind), or the
    query longer than `AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS` terms for a context read through the
    GIN index (not `scan`): nothing was read then. A request's deferred key read shares the
    round trip (`pipelines.read_rows`)."""
    sql = _exact_sql(excluding=bool(params["exclude"]), columns=columns, scan=scan)
    answer = read(
        sql,
        params
        | {
            "strict": match == "all",
            "exact": KEYWORD_EXACT_MESSAGES,
            "max_terms": settings.AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS,
        },
        lambda: ["boolean", "bigint", "double precision", *_message_types(columns)],
        prepared=True,
        generic=True,
    )
    if answer and not answer[0][0]:
        return None
    return [row[1:] for row in answer if row[1] is not None]


def _ranking_sql(
    params: dict, parsed: KeywordQuery, *, match: str, columns: str, excluding: bool
) -> str:
    """RANK_SQL over each term's candidates in a large context (`_term_candidates`), planned
    from the terms' matches among the latest seqs: counted by the read that kept a long query's
    rarest words (`keyword_terms.rarest_terms`) when it counted every term kept, else by one
    read of their own (`keyword_terms.window_counts`)."""
    cap = max(settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES, params["limit"])
    last_seq = params["last_seq"]
    bounds = _seq_bounds(last_seq, params["search_seq"])
    params.update(bounds)
    most = settings.AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS
    parsed, counts, window = keyword_terms.rarest_terms(params, parsed, most)
    params["lexemes"] = sorted({lexeme for term in parsed.terms for lexeme in term.lexemes})
    for i, term in enumerate(parsed.terms, start=1):
        params[f"q{i}"] = parsed.term_tsquery(term)
        params[f"l{i}"] = list(term.lexemes)
    if counts is None:
        window = KEYWORD_RECENT_SEQS
        counts = keyword_terms.window_counts(params, len(parsed.terms), window)
    plans = keyword_terms.term_plans(
        counts,
        n=params["n"],
        last_seq=last_seq,
        cap=cap,
        limit=params["limit"],
        window=window,
        budget=KEYWORD_TERM_ROWS,
    )
    found = []
    for i, plan in enumerate(plans, start=1):
        params[f"need{i}"] = plan.need
        sql = _term_candidates(
            f"q{i}", need=f"need{i}", gin=plan.gin, bounds=bounds, excluding=excluding
        )
        found.append(f"SELECT {i} AS term, f.* FROM ({sql}) f")  # noqa: S608 - constant SQL
    if match == "all":
        params["q0"], params["need0"] = parsed.strict, cap
        sql = _term_candidates("q0", need="need0", gin=None, bounds=bounds, excluding=excluding)
        found.append(f"SELECT 0 AS term, f.* FROM ({sql}) f")  # noqa: S608
    newest = _NEWEST.format(
        parsed=_PARSED.format(rows=TAIL.format(after="%(newest_after)s")),
        excluded_ids="WHERE NOT (m.id = ANY(%(exclude)s))" if excluding else "",
    )
    terms = ", ".join(
        f"({i}, %(q{i})s::tsquery, %(l{i})s::text[], %(need{i})s::int)"
        for i in range(1, len(parsed.terms) + 1)
    )
    return RANK_SQL.format(
        inputs=f"{newest}, found AS MATERIALIZED ({' UNION ALL '.join(found)}),"
        f" terms (term, q, lexemes, need) AS (VALUES {terms})",
        lexemes="%(lexemes)s::text[]",
        candidates="term = 0" if match == "all" else "term > 0",
        term_score=_term_score(tf="t.tf", idf="t.idf", length="t.length"),
        columns=columns,
    )


_MESSAGE_COLUMNS = ", " + db.select_columns(Message, "m")


def _message_types(columns: str) -> list[str]:
    """The SQL types of `_MESSAGE_COLUMNS` when `columns` is it, else none."""
    if not columns:
        return []
    fields = [f.column for f in Message._meta.concrete_fields]
    return shard_reads.column_types(Message._meta.db_table, fields)


# A small context ranked in one statement after `QUERY_TERMS` (the query parsed in the statement
# itself), every count exact: BM25 as its formula reads. The context's counters (its size, the
# indexer's mark) are read by the statement too, so it needs none from the request and sees them
# as of its own snapshot; when they show the context outgrew the exact ranking (the request knew
# an older size), nothing is read and the one row says so (`fits`), as it does for a query of
# more than `max_terms` terms where the matches are read through the GIN index
# (`short_enough`; with `scan`, any query is).
# Every message matching any term, and none of the exclusions, is a hit: the stored vectors
# (`stored_match`: each matched, or read through the GIN index), the messages past `search_seq`
# parsed from their text (`keyword_terms.TAIL`). A word's tf in a hit is read by one C call
# (`_WORD_TF`); a phrase's from the hit unnested, kept to the query's lexemes
# (`ts_filter`): all its lexemes, the fewest positions, and matching it. A term's df is the number
# of hits holding it. With `strict` (`match="all"`) only the hits matching the
# whole query as websearch_to_tsquery reads it are scored, the df still counting every hit. A
# query of stop words only reads nothing (a test on `matching` alone, checked once). The text
# depends only on `excluding` and the columns read, so the statement is prepared once per
# connection: parsed, analysed and, outside a transaction on one node, planned once. Its one
# plan serves every call (PostgreSQL's generic plan, asked for: the server would plan it anew for
# each call's values, about a fifth of the statement's time, where the plan seeing the values
# gained nothing measured on stores of 12 and of 1,401 contexts, sizes 8 to 10,000).
_EXACT_SQL = r"""
WITH {query_terms},
counters AS MATERIALIZED (
    SELECT c.message_count, c.search_seq,
           c.message_count <= %(exact)s AND c.last_seq - c.search_seq <= %(exact)s
           AND {short_enough} AS fits
    FROM memory_app_context c WHERE c.id = %(context)s
),
terms (term, q, lexemes) AS MATERIALIZED (
    SELECT row_number() OVER (ORDER BY n.o)::int, n.q, n.lexemes FROM named n
),
matching AS MATERIALIZED (
    SELECT CASE WHEN p.exclusion IS NULL THEN m.q ELSE m.q && p.exclusion END AS q, m.lexemes
    FROM (SELECT string_agg(DISTINCT '(' || t.q::text || ')', ' | ')::tsquery AS q,
                 array_agg(DISTINCT l.lexeme) AS lexemes
          FROM terms t CROSS JOIN unnest(t.lexemes) l (lexeme)) m
    CROSS JOIN parsed p
),
hits AS MATERIALIZED (
    SELECT a.seq, a.length, a.vector,
           coalesce(NOT %(strict)s OR ts_match_vq(a.vector, (SELECT strict FROM parsed)), false)
           AS chosen
    FROM (
        SELECT s.seq, length(s.search_vector) AS length, s.search_vector AS vector
        FROM {table} s
        WHERE (SELECT q FROM matching) IS NOT NULL AND (SELECT fits FROM counters)
          AND s.context_id = %(context)s AND s.seq <= (SELECT search_seq FROM counters)
          AND {stored_match} {excluded_seqs}
        UNION ALL
        SELECT m.seq, length(v.vector), v.vector
        FROM (SELECT m.id, m.seq, m.text FROM {tail}) m,
             LATERAL (SELECT memory_app_search_vector(%(config)s::regconfig, m.text)
                      AS vector) v
        WHERE (SELECT q FROM matching) IS NOT NULL AND (SELECT fits FROM counters)
          AND v.vector @@ (SELECT q FROM matching) {excluded_ids}
    ) a
),
held AS MATERIALIZED (
    SELECT h.seq, h.length, h.chosen, w.term, w.tf
    FROM hits h
    CROSS JOIN LATERAL (
        SELECT t.term, {word_tf} AS tf FROM terms t WHERE cardinality(t.lexemes) = 1
        OFFSET 0  -- kept a subquery: its tf is computed once, not again for the filter
    ) w
    WHERE w.tf > 0
    UNION ALL
    SELECT h.seq, h.length, h.chosen, l.term, min(coalesce(array_length(u.positions, 1), 1)) AS tf
    FROM hits h
    CROSS JOIN unnest(ts_filter(setweight(h.vector, 'A', (SELECT lexemes FROM matching)),
                                '{{a}}')) u
    JOIN (SELECT t.term, t.q, x.lexeme, cardinality(t.lexemes) AS parts
          FROM terms t CROSS JOIN unnest(t.lexemes) x (lexeme)
          WHERE cardinality(t.lexemes) > 1) l ON l.lexeme = u.lexeme
    WHERE EXISTS (SELECT FROM terms t WHERE cardinality(t.lexemes) > 1)
    GROUP BY h.seq, h.length, h.chosen, l.term
    HAVING count(*) = max(l.parts) AND bool_and(h.vector @@ l.q)
),
n AS (
    SELECT greatest((SELECT message_count FROM counters), (SELECT count(*) FROM hits), 1)::float8
    AS n
),
idf AS (
    SELECT h.term, ln(1 + (greatest(n.n, count(*)) - count(*) + 0.5) / (count(*) + 0.5)) AS idf
    FROM held h CROSS JOIN n GROUP BY h.term, n.n
),
avgdl AS (SELECT avg(length)::float8 AS avgdl FROM hits WHERE chosen),
scored AS (
    SELECT h.seq, sum({term_score}) AS score
    FROM held h JOIN idf i ON i.term = h.term CROSS JOIN avgdl a
    WHERE h.chosen
    GROUP BY h.seq
),
best AS (SELECT seq, score FROM scored ORDER BY score DESC, seq DESC LIMIT %(limit)s)
SELECT c.fits, m.id, b.score{columns} FROM counters c
LEFT JOIN best b ON true
LEFT JOIN LATERAL (
    SELECT * FROM memory_app_message x
    WHERE b.seq IS NOT NULL AND x.context_id = %(context)s AND x.seq = b.seq LIMIT 1
) m ON true
ORDER BY b.score DESC, b.seq DESC
"""


# A one-lexeme term's tf in a hit's vector `h.vector` (its query `t.q`): the number of positions
# the vector holds for the lexeme (at most 256, as a vector keeps them; 1 without positions; 0
# when it does not hold it), read back from `ts_rank`, one C call, instead of unnesting the
# vector. With every weight 1 and one lexeme, ts_rank gives (1 + 1/2² + … + 1/n²) / 1.64493406685
# for n positions; the tail π²/6 − (1 + … + 1/n²) is 1/(n + 1/2) less about 1/(12n³), so n is
# 1 / tail − 1/2 rounded (within 0.06 of it), for every n a vector holds and through the rank's
# float4 rounding (tests/test_search_bounds.py checks each n up to 300).
_WORD_TF = (
    "round(1 / (pi() ^ 2 / 6 - ts_rank('{1,1,1,1}', h.vector, t.q)::float8 * 1.64493406685)"
    " - 0.5)::int"
)


def _exact_sql(*, excluding: bool, columns: str, scan: bool) -> str:
    """`_EXACT_SQL`: a small context ranked in one statement. `scan`: its stored vectors are
    read through the context's own index and matched one by one (`ts_match_vq`, the function
    behind `@@`, which keeps the planner off the GIN index), else through the GIN index."""
    if scan:
        stored_match = "ts_match_vq(s.search_vector, (SELECT q FROM matching))"
        short_enough = "true"
    else:
        stored_match = "s.search_vector @@ (SELECT q FROM matching)"
        short_enough = "(SELECT count(*) FROM named) <= %(max_terms)s"
    return _EXACT_SQL.format(
        query_terms=QUERY_TERMS,
        table=fulltext.TABLE,
        stored_match=stored_match,
        short_enough=short_enough,
        tail=TAIL.format(after="(SELECT search_seq FROM counters)"),
        excluded_seqs=_EXCLUDED_SEQS if excluding else "",
        excluded_ids="AND NOT (m.id = ANY(%(exclude)s))" if excluding else "",
        word_tf=_WORD_TF,
        term_score=_term_score(tf="h.tf", idf="i.idf", length="h.length"),
        columns=columns,
    )


def _term_score(*, tf: str, idf: str, length: str) -> str:
    """SQL of one term's BM25 part in a message (`bm25`'s formula), from the columns naming
    its tf, the term's idf and the message's length; `a.avgdl` is the mean length."""
    k1, b = bm25.K1, bm25.B
    norm = f"(1 - {b} + {b} * CASE WHEN a.avgdl > 0 THEN {length} / a.avgdl ELSE 1 END)"
    return f"{idf} * {tf} * ({k1} + 1) / ({tf} + {k1} * {norm})"


# BM25 (memory_app.search.bm25) over the candidates `found` (term, seq, length, vector): the
# terms' matches (term 0: the strict query's, the candidates of `match="all"`); `inputs` defines
# `found` and `terms` (term, tsquery, lexemes, need), `lexemes` is every term's lexemes. Each
# term's df is its match count, exact below the term's `need` (its plan's), else the density of its
# newest `need` matches over the context; N the context's count, never below the messages
# found; avgdl the candidates' mean length; a term's tf the fewest positions of its lexemes in
# a candidate holding them all (a phrase: matching it). The query's lexemes are read from each
# candidate's vector in one pass (`ts_filter` keeps only theirs). Ties newest first; only the
# best `limit` are joined to their messages (and `columns`, the messages' own, read there).
RANK_SQL = """
WITH {inputs},
candidates AS (
    SELECT DISTINCT ON (seq) seq, length, vector FROM found
    WHERE {candidates}
),
n AS (
    SELECT greatest(%(n)s, (SELECT count(DISTINCT seq) FROM found WHERE term > 0), 1)::float8 AS n
),
df AS (
    SELECT t.term, t.q, t.lexemes, CASE
        WHEN count(f.seq) < t.need THEN count(f.seq)::float8
        ELSE least(
            greatest(count(f.seq) * n.n
                     / greatest(%(last_seq)s - min(f.seq) + 1, count(f.seq)), count(f.seq)),
            greatest(n.n, count(f.seq)))
        END AS df
    FROM terms t CROSS JOIN n LEFT JOIN found f ON f.term = t.term
    GROUP BY t.term, t.q, t.lexemes, t.need, n.n
),
idf AS (
    SELECT term, q, lexemes,
           ln(1 + (greatest(n.n, df) - df + 0.5) / (df + 0.5)) AS idf
    FROM df CROSS JOIN n
),
avgdl AS (SELECT avg(length)::float8 AS avgdl FROM candidates),
lexemes AS (
    SELECT i.term, i.q, i.idf, x.lexeme, cardinality(i.lexemes) AS parts
    FROM idf i CROSS JOIN unnest(i.lexemes) x (lexeme)
),
tfs AS (
    SELECT c.seq, c.length, l.term, l.idf, min(coalesce(array_length(u.positions, 1), 1)) AS tf
    FROM candidates c
    CROSS JOIN unnest(ts_filter(setweight(c.vector, 'A', {lexemes}), '{{a}}')) u
    JOIN lexemes l ON l.lexeme = u.lexeme
    GROUP BY c.seq, c.length, l.term, l.idf
    HAVING count(*) = max(l.parts) AND bool_and(l.parts = 1 OR c.vector @@ l.q)
),
scored AS (
    SELECT t.seq, sum({term_score}) AS score
    FROM tfs t CROSS JOIN avgdl a
    GROUP BY t.seq
),
best AS (SELECT seq, score FROM scored ORDER BY score DESC, seq DESC LIMIT %(limit)s)
SELECT m.id, b.score{columns} FROM best b
JOIN memory_app_message m ON m.context_id = %(context)s AND m.seq = b.seq
ORDER BY b.score DESC, b.seq DESC
"""


# The keyword passes of `_term_candidates` as SQL text: `after` and `upto` are the SQL of their
# seq bounds (parameters, or 0), `q` and `need` name the term's parameters.
def _parsed_pass(after: str, upto: str, q: str, need: str, excluding: bool) -> str:
    """A keyword pass over messages the indexer has not reached, behind the latest seqs: their
    text is parsed (its first part, as the indexer parses it). Those in the latest seqs are
    parsed once, for all the terms (`_NEWEST`)."""
    rows = f"""memory_app_message m WHERE m.context_id = %(context)s AND m.pruned_at IS NULL
              AND m.seq > {after} AND m.seq <= {upto}"""
    return f"""
        {_PARSED.format(rows=rows)}
        WHERE v.vector @@ %({q})s::tsquery
          {"AND NOT (m.id = ANY(%(exclude)s))" if excluding else ""}
        ORDER BY m.seq DESC LIMIT %({need})s
    """  # noqa: S608 - constant SQL


# (seq, vector length, vector) of the messages `rows` names (aliased m), their text parsed as
# the indexer parses it.
_PARSED = """SELECT m.seq, length(v.vector) AS length, v.vector
    FROM (SELECT m.id, m.seq, m.text FROM {rows}) m,
         LATERAL (SELECT memory_app_search_vector(%(config)s::regconfig, m.text) AS vector) v"""

# The messages past the indexer's mark in the latest seqs (`keyword_terms.TAIL` past
# `newest_after`: none, usually), parsed once, for all the terms' first passes
# (`_term_candidates`): the statement holds one such read, not one per term for the server to
# plan and run.
_NEWEST = """newest AS MATERIALIZED (
    {parsed}
    {excluded_ids}
)"""


_EXCLUDED_SEQS = """
    AND NOT (s.seq = ANY(ARRAY(SELECT x.seq FROM memory_app_message x
                               WHERE x.context_id = %(context)s AND x.id = ANY(%(exclude)s))))
"""


def _stored_pass(after: str, upto: str, match: str, need: str, excluding: bool) -> str:
    """A keyword pass over stored vectors, `match` being the condition on s.search_vector.
    Excluded messages are left out by their seqs (looked up once, by id)."""
    return f"""
        SELECT s.seq, length(s.search_vector) AS length, s.search_vector AS vector
        FROM {fulltext.TABLE} s
        WHERE s.context_id = %(context)s AND s.seq > {after} AND s.seq <= {upto}
          AND {match} {_EXCLUDED_SEQS if excluding else ""}
        ORDER BY s.seq DESC LIMIT %({need})s
    """  # noqa: S608 - constant SQL


def _indexed_pass(after: str, upto: str, q: str, need: str, excluding: bool) -> str:
    """A keyword pass over stored vectors through the GIN index: every match's seq read and
    sorted (`s.seq + 0` keeps the planner off the primary key's order), and only the newest
    `need` of them fetched again with their vectors (a sort carrying every match's vector cost
    more than the index read)."""
    return f"""
        SELECT hit.seq, length(v.search_vector) AS length, v.search_vector AS vector
        FROM (
            SELECT s.seq FROM {fulltext.TABLE} s
            WHERE s.context_id = %(context)s AND s.seq > {after} AND s.seq <= {upto}
              AND s.search_vector @@ %({q})s::tsquery {_EXCLUDED_SEQS if excluding else ""}
            ORDER BY s.seq + 0 DESC LIMIT %({need})s
        ) hit
        CROSS JOIN LATERAL (
            SELECT x.search_vector FROM {fulltext.TABLE} x
            WHERE x.context_id = %(context)s AND x.seq = hit.seq LIMIT 1
        ) v
        ORDER BY hit.seq DESC
    """  # noqa: S608 - constant SQL


def _term_candidates(
    q: str, *, need: str, gin: bool | None, bounds: dict[str, int], excluding: bool
) -> str:
    """SQL of (seq, vector length, vector) of the newest live matches of the tsquery parameter
    `q` (as many as the parameter `need`), newest seqs first, in passes whose cost follows the
    candidates, not the context's size; `bounds` are the seqs where they meet (`_seq_bounds`).

    Up to the context's `search_seq` the vectors are read from MessageSearch (live messages
    only, keyed by (context, seq)); after it, where the indexer has not been yet, each message's
    text is parsed (a large batch just stored: its size is read until the indexer catches up,
    as deferred vectors are scanned). In seq order, newest first:

    1. Messages past `search_seq` in the latest KEYWORD_RECENT_SEQS seqs (none, usually: small
       appends write their vectors at once), parsed once, for all the terms (`_NEWEST`).
    2. The vectors of the latest KEYWORD_RECENT_SEQS seqs, walked back on the primary key until
       enough match: frequent words (the usual case for natural-language prompts) stop early.
       The match is written as a call of `ts_match_vq` (the function behind `@@`) so the
       planner does not take the GIN index here: on a frequent word its posting list is far
       longer than the walk.
    3. Older messages past `search_seq` (a backlog deeper than the recent seqs).
    4. The older vectors, newest first, by the path `gin` names (`bm25.plan_term` chooses it
       from the term's matches in the latest seqs): every match read through the GIN index and
       sorted by seq (`s.seq + 0` keeps the planner off the primary key's order), or a walk
       back on the primary key (`ts_match_vq`, as in 2.). With `gin` None (no match of the
       term in the latest seqs: nothing is known of it) the planner chooses from the word's
       statistics.
    The passes are one UNION ALL under the limit: a pass runs only while the ones before it
    found fewer than `need`.
    """
    walk = f"ts_match_vq(s.search_vector, %({q})s::tsquery)"
    passes = [
        # The messages parsed past `newest_after` (`_NEWEST`), with no upper bound: those
        # appended since `last_seq` was read too.
        f"""SELECT n.seq, n.length, n.vector FROM newest n WHERE n.vector @@ %({q})s::tsquery
            ORDER BY n.seq DESC LIMIT %({need})s""",  # noqa: S608 - constant SQL
        _stored_pass("%(older)s", "%(search_seq)s", walk, need, excluding),
    ]
    if bounds["search_seq"] < bounds["older"]:
        passes.append(_parsed_pass("%(searched_older)s", "%(older)s", q, need, excluding))
    if bounds["searched_older"] > 0:
        if gin:
            passes.append(_indexed_pass("0", "%(searched_older)s", q, need, excluding))
        else:
            match = walk if gin is False else f"s.search_vector @@ %({q})s::tsquery"
            passes.append(_stored_pass("0", "%(searched_older)s", match, need, excluding))
    return " UNION ALL ".join(f"({p})" for p in passes) + f" LIMIT %({need})s"


def _seq_bounds(last_seq: int, search_seq: int) -> dict[str, int]:
    """The seqs where the passes of `_term_candidates` (and the terms' counts) meet: the latest
    KEYWORD_RECENT_SEQS seqs begin past `older`; the indexer's vectors stop at `search_seq`,
    so the older ones stop at `searched_older`; the text is parsed past `newest_after`. They
    shape the passes and are the statements' parameters, bound by the server like the tsqueries
    and lexemes rather than written into the text."""
    older = max(last_seq - KEYWORD_RECENT_SEQS, 0)
    return {
        "search_seq": search_seq,
        "older": older,
        "searched_older": min(search_seq, older),
        "newest_after": max(search_seq, older),
    }
