"""Keyword search inside one context: PostgreSQL full-text matches, ranked.

Full-text search finds every match (the GIN index answers `@@` without loss) but ranks the
newest `AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES` of them only (see `keyword_ranking`), so that its
cost does not grow with the context.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from django.db import connection

from memory_app.models import FTS_CONFIG, Context
from memory_app.search import fulltext

# Keyword candidates are looked for in the latest KEYWORD_RECENT_SEQS seqs first, then in the
# older ones through the GIN index (see _keyword_candidates).
KEYWORD_RECENT_SEQS = 2_000


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
