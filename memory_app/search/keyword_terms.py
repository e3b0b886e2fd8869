"""A large context's query terms before keyword search ranks them (memory_app/search/keyword.py):
how many of the latest seqs' messages hold each term, counted in one read of their vectors; the
rarest words kept of a long query; and each term's plan (`bm25.plan_term`) from those counts.
Also the reads both share: the messages past the indexer's mark (`TAIL`) and one statement of
the context's, run where its rows are (`read`).
"""

from __future__ import annotations

from collections.abc import Callable

from memory_app import shard_reads
from memory_app.models import Context, Message
from memory_app.search import bm25, fulltext
from memory_app.search.keyword_query import KeywordQuery

# The tables the ranking statements read, all distributed by context and co-located.
TABLES = (Message._meta.db_table, fulltext.TABLE, Context._meta.db_table)

# The live messages past seq `after`, up to the context's newest seq as the statement finds it
# (so messages appended since the request read its counters are found too), each read by its
# key. The planner cannot know where one context's seqs end (its statistics span every
# context), so a bare `seq > after` past the end is estimated at thousands of rows and read
# through a scan of the whole context; the series walks only the seqs up to the newest (none,
# usually: small appends write their vectors at once). `LIMIT 1` keeps each probe a lookup on
# (context, seq).
TAIL = """
    generate_series({after} + 1,
                    (SELECT max(n.seq) FROM memory_app_message n
                     WHERE n.context_id = %(context)s)) g (seq)
    CROSS JOIN LATERAL (
        SELECT x.id, x.seq, x.text FROM memory_app_message x
        WHERE x.context_id = %(context)s AND x.seq = g.seq AND x.pruned_at IS NULL LIMIT 1
    ) m
"""

# The latest seqs a long query's words are counted in, to keep the rarest (`rarest_terms`): a
# sample of the latest seqs `window_counts` reads, since each vector read costs (a message's
# vector is stored compressed), for every word of the query.
RAREST_SAMPLE_SEQS = 500


def read(
    sql: str,
    params: dict,
    types: Callable[[], list[str]],
    *,
    prepared: bool = False,
    generic: bool = False,
) -> list[tuple]:
    """The rows of one of the context's ranking statements, answering columns of `types()`: on
    a distributed store run on the context's worker, planned there only (`shard_reads`)."""
    return shard_reads.read_rows(
        sql,
        params,
        context_id=params["context"],
        tables=TABLES,
        types=types,
        prepared=prepared,
        generic=generic,
    )


def latest_vectors(seqs: int) -> str:
    """SQL of the vectors (`w.v`) of the latest `seqs` seqs as far as the indexer went (never
    before `older`, the start of the latest seqs the ranking reads first) and of the messages
    past the indexer's mark there, parsed from their text. The stored vectors are read newest
    first under a limit, so that the planner walks the primary key, as a ranking pass does."""
    return f"""(
        (SELECT s.search_vector AS v FROM {fulltext.TABLE} s
         WHERE s.context_id = %(context)s AND s.seq > %(older)s AND s.seq <= %(search_seq)s
         ORDER BY s.seq DESC LIMIT {int(seqs)})
        UNION ALL
        SELECT memory_app_search_vector(%(config)s::regconfig, m.text)
        FROM {TAIL.format(after="%(newest_after)s")}
    ) w"""  # noqa: S608 - constant SQL


def window_counts(params: dict, terms: int, seqs: int) -> list[int]:
    """Each term's matches (its query `q1`, `q2`... of `params`) among the latest `seqs` seqs,
    in one read of their vectors."""
    counts = ", ".join(
        f"count(*) FILTER (WHERE ts_match_vq(w.v, %(q{i})s::tsquery))" for i in range(1, terms + 1)
    )
    sql = f"SELECT {counts} FROM {latest_vectors(seqs)}"  # noqa: S608 - constant SQL
    return [int(c) for c in read(sql, params, lambda: ["bigint"] * terms)[0]]


def rarest_terms(
    params: dict, parsed: KeywordQuery, most: int
) -> tuple[KeywordQuery, list[int] | None, int]:
    """A query of more than `most` terms (a whole message as the query: the composite
    selector's last user message, say) kept to `most` of them: its phrases, and the words the
    fewest of the latest RAREST_SAMPLE_SEQS seqs' messages hold, ties by lexeme. Each term costs
    the ranking passes of its own, and the words left out are those BM25 weighs least in the
    context (its most frequent). Words none of those messages holds fill no more than half the
    room: some of them are in no message at all (a name, a typo), and would leave no room for
    the words that are. The words are counted in one read of those messages' vectors.

    With the terms kept, their matches among the messages read and how many were read, when the
    counts are the terms' own (words only, no exclusion), to plan their passes without reading
    the latest seqs again; else None and 0."""
    most = max(most, 1)
    if len(parsed.terms) <= most:
        return parsed, None, 0
    words = [term for term in parsed.terms if len(term.lexemes) == 1]
    room = max(most - (len(parsed.terms) - len(words)), 0)
    held: dict[str, int] = {}
    sampled = 0
    if room:
        sql = f"""
            WITH w AS MATERIALIZED (SELECT w.v FROM {latest_vectors(RAREST_SAMPLE_SEQS)})
            SELECT (SELECT count(*) FROM w), x.lexeme, count(*) FROM w
            CROSS JOIN unnest(tsvector_to_array(w.v)) x (lexeme)
            JOIN unnest(%(words)s::text[]) q (lexeme) ON q.lexeme = x.lexeme
            GROUP BY x.lexeme
        """  # noqa: S608 - constant SQL
        lexemes = [term.lexemes[0] for term in words]
        rows = read(sql, params | {"words": lexemes}, lambda: ["bigint", "text", "bigint"])
        held = {lexeme: count for _, lexeme, count in rows}
        sampled = rows[0][0] if rows else 0
    unseen = [term for term in words if not held.get(term.lexemes[0])]
    seen = sorted(
        (term for term in words if held.get(term.lexemes[0])),
        key=lambda term: (held[term.lexemes[0]], term.lexemes[0]),
    )
    first_unseen = unseen[: room // 2]
    chosen = first_unseen + seen[: room - len(first_unseen)]
    # Room the seen words leave goes to more of the unseen.
    chosen += unseen[len(first_unseen) : len(first_unseen) + room - len(chosen)]
    kept = set(chosen)
    terms = tuple(term for term in parsed.terms if len(term.lexemes) > 1 or term in kept)
    if parsed.exclusion or any(len(term.lexemes) > 1 for term in terms) or not sampled:
        return KeywordQuery(terms, parsed.exclusion, parsed.strict), None, 0
    counts = [held.get(term.lexemes[0], 0) for term in terms]
    return KeywordQuery(terms, parsed.exclusion, parsed.strict), counts, sampled


def term_plans(
    counts: list[int], *, n: int, last_seq: int, cap: int, limit: int, window: int, budget: int
) -> list[bm25.TermPlan]:
    """Each term's plan (`bm25.plan_term`) from its matches among `window` of the latest seqs
    (`budget`: the rows one of its passes may cost)."""
    window = min(window, max(last_seq, 1))
    return [
        bm25.plan_term(
            window_matches=matches,
            window=window,
            n=n,
            last_seq=last_seq,
            cap=cap,
            limit=limit,
            budget=budget,
        )
        for matches in counts
    ]
