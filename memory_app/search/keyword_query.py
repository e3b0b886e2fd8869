"""A query as keyword search reads it (`memory_app.search.keyword`): its terms (stemmed words
and "quoted phrases"), its -exclusions and its strict reading (websearch_to_tsquery as written),
parsed by PostgreSQL's own text search so that the terms are the stored vectors' lexemes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from django.db import connection

from memory_app import pipelines
from memory_app.models import FTS_CONFIG
from memory_app.search import bm25


def any_terms_tsquery(query: str) -> str:
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

    def term_tsquery(self, term: bm25.Term) -> str:
        return f"({term.tsquery}) & ({self.exclusion})" if self.exclusion else term.tsquery


# A query as the server reads it, for both ways of ranking (CTEs of its parameters config,
# words, neg, query and phrases, from `query_parts`): `parsed` holds the exclusions and the
# strict reading, `named` the terms (tsquery, lexemes) in the query's order: its stemmed words,
# then its phrases, a phrase equal to a word's term counted once.
QUERY_TERMS = r"""
parsed AS MATERIALIZED (
    SELECT (SELECT q FROM websearch_to_tsquery(%(config)s::regconfig, %(neg)s) q
            WHERE numnode(q) > 0) AS exclusion,
           (SELECT q FROM websearch_to_tsquery(%(config)s::regconfig, %(query)s) q
            WHERE numnode(q) > 0) AS strict
),
named AS MATERIALIZED (
    SELECT min(x.o) AS o, x.q, x.lexemes FROM (
        SELECT w.o, ('''' || replace(replace(w.x, '\', '\\'), '''', '''''') || '''')::tsquery AS q,
               ARRAY[w.x] AS lexemes
        FROM unnest(tsvector_to_array(to_tsvector(%(config)s::regconfig, %(words)s)))
             WITH ORDINALITY w (x, o)
        UNION ALL
        SELECT 2147483647::bigint + p.o, q,
               ARRAY(SELECT replace(r[1], '''''', '''')
                     FROM regexp_matches(q::text, '''((?:[^'']|'''')*)''', 'g') r)
        FROM unnest(%(phrases)s::text[]) WITH ORDINALITY p (t, o),
             phraseto_tsquery(%(config)s::regconfig, p.t) q
        WHERE numnode(q) > 0
    ) x
    GROUP BY x.q::text, x.q, x.lexemes
)"""


def query_parts(query: str) -> dict[str, object] | None:
    """The parameters of `QUERY_TERMS` for `query`; None when it has nothing to match (no word,
    no phrase)."""
    split = bm25.split_websearch(query)
    if not split.words and not split.phrases:
        return None
    return {
        "config": FTS_CONFIG,
        "words": " ".join(split.words),
        "neg": split.exclusion_text,
        "query": query,
        "phrases": list(split.phrases),
    }


_PARSE_SQL = (
    f"WITH {QUERY_TERMS} SELECT (SELECT exclusion::text FROM parsed),"  # noqa: S608
    " (SELECT strict::text FROM parsed),"
    " ARRAY(SELECT q::text FROM named ORDER BY o),"
    # Every term's lexemes in one flat array, and how many each term has: a phrase's and a
    # word's are arrays of different lengths, which one two-dimensional array cannot hold.
    " ARRAY(SELECT x FROM named n, unnest(n.lexemes) WITH ORDINALITY l (x, i) ORDER BY n.o, l.i),"
    " ARRAY(SELECT cardinality(lexemes) FROM named ORDER BY o)"
)


def parse_query(query: str) -> KeywordQuery:
    """The query's terms (its stemmed words, and its phrases), exclusions and strict reading, in
    one round trip; no terms when it holds only stop words or punctuation."""
    parts = query_parts(query)
    if parts is None:
        return KeywordQuery((), "", "")
    ((exclusion, strict, queries, lexemes, sizes),) = pipelines.read_rows(
        _PARSE_SQL, parts, prepared=True
    )
    ends = list(itertools.accumulate(sizes))
    terms = tuple(
        bm25.Term(q, tuple(lexemes[end - size : end]))
        for q, size, end in zip(queries, sizes, ends, strict=True)
    )
    return KeywordQuery(terms, exclusion or "", strict or "")
