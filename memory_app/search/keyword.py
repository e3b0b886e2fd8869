"""Keyword search inside one context: PostgreSQL full-text matches ranked by BM25.

A message matches when it holds any word of the query or any of its "quoted phrases", and none
of its -exclusions (websearch syntax); `match="all"` asks for every word instead
(websearch_to_tsquery as written). The matches are scored by BM25 with term frequencies read
from the stored tsvectors and document frequencies counted per term with a cap (the formula and
its approximations: `memory_app.search.bm25`). The work is bounded whatever the context's size:
each term reads at most `AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES` of its newest matches, through
the GIN index for rare terms and a walk back on the primary key for frequent ones (see
`_keyword_candidates`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from memory_app.models import FTS_CONFIG, Context
from memory_app.search import bm25, fulltext

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


@dataclass(frozen=True)
class KeywordQuery:
    """A query as keyword search reads it: the terms scored, the exclusions (tsquery text, ""
    for none) and the whole query as websearch_to_tsquery reads it (for `match="all"`)."""

    terms: tuple[bm25.Term, ...]
    exclusion: str
    strict: str

    @property
    def lexemes(self) -> list[str]:
        return sorted({lexeme for term in self.terms for lexeme in term.lexemes})

    def term_tsquery(self, term: bm25.Term) -> str:
        return f"({term.tsquery}) & ({self.exclusion})" if self.exclusion else term.tsquery


_QUOTED = r"'((?:[^']|'')*)'"


def parse_query(query: str) -> KeywordQuery:
    """The query's terms (its stemmed words, and its phrases), exclusions and strict reading, in
    one round trip; no terms when it holds only stop words or punctuation."""
    import re

    split = bm25.split_websearch(query)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tsvector_to_array(to_tsvector(%(c)s::regconfig, %(words)s)),"
            " (SELECT q::text FROM websearch_to_tsquery(%(c)s::regconfig, %(neg)s) q"
            "  WHERE numnode(q) > 0),"
            " (SELECT q::text FROM websearch_to_tsquery(%(c)s::regconfig, %(query)s) q"
            "  WHERE numnode(q) > 0),"
            " ARRAY(SELECT q::text FROM unnest(%(phrases)s::text[]) WITH ORDINALITY p(t, i),"
            "  phraseto_tsquery(%(c)s::regconfig, p.t) q WHERE numnode(q) > 0 ORDER BY p.i)",
            {
                "c": FTS_CONFIG,
                "words": " ".join(split.words),
                "neg": split.exclusion_text,
                "query": query,
                "phrases": list(split.phrases),
            },
        )
        lexemes, exclusion, strict, phrases = cursor.fetchone()
    terms: dict[str, bm25.Term] = {}
    for lexeme in lexemes or []:
        quoted = bm25.quote_lexeme(lexeme)
        terms[quoted] = bm25.Term(quoted, (lexeme,))
    for phrase in phrases or []:
        found = tuple(x.replace("''", "'") for x in re.findall(_QUOTED, phrase))
        terms.setdefault(phrase, bm25.Term(phrase, found))
    return KeywordQuery(tuple(terms.values()), exclusion or "", strict or "")


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
) -> list[tuple[int, float]]:
    """(message id, BM25 score) of live messages matching `query`, best first, ties newest first.

    `match="any"` matches any word or "phrase" of the query and none of its -exclusions;
    `match="all"` reads it as websearch_to_tsquery does (every word, phrases, exclusions, or).
    Either way the matches are ranked by BM25 over the context (see `memory_app.search.bm25`).

    Each term's newest `AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES` matches are the candidates (and
    its count, exact below that cap, estimated above it): every match of a rare term is scored.
    `last_seq`, `search_seq` and `message_count` are the context's counters (read when not
    given; an older `search_seq` is always safe). See `_keyword_candidates`.
    """
    parsed = parse_query(query)
    if not parsed.terms or (match == "all" and not parsed.strict):
        return []
    if last_seq is None or search_seq is None or message_count is None:
        last_seq, search_seq, message_count = Context.objects.filter(pk=context_id).values_list(
            "last_seq", "search_seq", "message_count"
        ).first() or (0, 0, 0)
    cap = max(settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES, limit)
    fetch = {
        "context_id": context_id,
        "lexemes": parsed.lexemes,
        "last_seq": last_seq,
        "search_seq": search_seq,
        "candidates": cap,
        "exclude_ids": list(exclude_ids),
    }
    rows: list[tuple[int, int, int, str]] = []
    found_per_term = []
    for term in parsed.terms:
        found_per_term.append(_keyword_candidates(tsquery=parsed.term_tsquery(term), **fetch))
        rows += found_per_term[-1]
    # The counter may lag a store written around the domain (never below what was found).
    n = max(message_count, len({row[0] for row in rows}))
    idfs = []
    for found in found_per_term:
        df = bm25.estimated_df(
            matches=len(found),
            cap=cap,
            oldest_seq=min((row[1] for row in found), default=None),
            last_seq=last_seq,
            n=n,
        )
        idfs.append(bm25.idf(df, n))
    if match == "all":
        rows = _keyword_candidates(tsquery=parsed.strict, **fetch)
    lengths = {row[0]: row[2] for row in rows}
    avgdl = sum(lengths.values()) / len(lengths) if lengths else 0.0
    ranked = bm25.rank(rows, terms=parsed.terms, idfs=idfs, avgdl=avgdl)
    return [(mid, score) for mid, _, score in ranked[:limit]]


# What BM25 reads of a candidate's vector: its positions of the query's lexemes (the vector
# restricted to them: those lexemes weighted A, then only A kept).
FEATURES = "ts_filter(setweight({vector}, 'A', %(lexemes)s::text[]), '{{a}}')::text"


# The keyword passes of `_keyword_candidates` as SQL text: seq bounds are ints written into the
# text, the rest are parameters.
def _parsed_pass(after: int, upto: int) -> str:
    """A keyword pass over messages the indexer has not reached: their text is parsed (its first
    part, as the indexer parses it)."""
    return f"""
        SELECT m.id, m.seq, length(v.vector), {FEATURES.format(vector="v.vector")}
        FROM memory_app_message m,
             LATERAL (SELECT memory_app_search_vector(%(config)s::regconfig, m.text) AS vector) v
        WHERE m.context_id = %(context)s AND m.pruned_at IS NULL
          AND m.seq > {int(after)} AND m.seq <= {int(upto)}
          AND v.vector @@ %(q)s::tsquery
          AND NOT (m.id = ANY(%(exclude)s))
        ORDER BY m.seq DESC LIMIT %(need)s
    """  # noqa: S608 - constant SQL


def _stored_pass(after: int, upto: int, match: str) -> str:
    """A keyword pass over stored vectors, `match` being the condition on s.search_vector."""
    # The message's id is looked up for each candidate (a subplan on
    # message_context_seq_unique), never by joining the context's messages.
    return f"""
        SELECT c.id, c.seq, c.length, c.tfs FROM (
            SELECT (SELECT m.id FROM memory_app_message m
                    WHERE m.context_id = %(context)s AND m.seq = s.seq) AS id,
                   s.seq, length(s.search_vector) AS length,
                   {FEATURES.format(vector="s.search_vector")} AS tfs
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
    lexemes: list[str],
    last_seq: int,
    search_seq: int,
    candidates: int,
    exclude_ids: list[int],
) -> list[tuple[int, int, int, str]]:
    """(id, seq, vector length, vector text restricted to `lexemes`) of the newest `candidates`
    live matches of `tsquery`, newest seqs first, in passes whose cost follows the candidates,
    not the context's size.

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
    params = {
        "context": context_id,
        "q": tsquery,
        "exclude": exclude_ids,
        "config": FTS_CONFIG,
        "lexemes": lexemes,
    }
    found: list = []
    with connection.cursor() as cursor:
        for sql in passes:
            if len(found) >= candidates:
                break
            if sql:
                cursor.execute(sql, {**params, "need": candidates - len(found)})
                found += cursor.fetchall()
    return [(mid, seq, int(length or 0), tfs or "") for mid, seq, length, tfs in found]
