"""BM25 (Okapi, Lucene's IDF) over PostgreSQL full-text vectors: the formula, the constants and
the query's parts. The scores are computed by the server, in the statement that finds the
candidates (`memory_app.search.keyword.RANK_SQL`).

For a query of terms t (each stemmed word of the query, and each "quoted phrase") and a message d:

    score(d) = sum over t in d of  idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * norm(d))
    idf(t)   = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
    norm(d)  = 1 - b + b * dl(d) / avgdl

with k1 = 1.2 and b = 0.75. N is the context's live message count. What is approximated, so
that a query's work stays bounded at a million messages in a context:

- tf(t, d) is the number of positions the message's tsvector holds for the lexeme (PostgreSQL
  keeps at most 256 per lexeme); a phrase's tf is the smallest tf of its lexemes (an upper
  bound of its occurrences).
- dl(d) is the number of distinct lexemes of the vector (`length(tsvector)`, no unnesting),
  and avgdl their mean over the candidates scored (the messages matching the query, rather
  than the whole context: no read beyond the candidates, and the same whether a message's
  vector is stored yet or parsed from its text).
- df(t) counts the messages the query can match (its exclusions applied). It is exact when
  fewer than the term's `need` messages match t (`plan_term`: the per-term cap, or fewer for a
  frequent term in a large context); otherwise it is estimated from how far back the newest
  `need` matches reach: need × N / (last seq - oldest of them + 1), never below the matches
  seen nor above N. A term that frequent has an IDF near its floor, where the estimate's error
  barely moves the score.
- A message is a candidate when it is among the newest `need` matches of at least one term:
  every match of a rare term is scored, and a message holding only frequent terms older than
  their newest `need` matches is missed (its score, made of low IDFs, would rank it low anyway).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

K1 = 1.2
B = 0.75

# A web search's tokens as websearch_to_tsquery reads them: "quoted phrases" (an unclosed quote
# runs to the end) and words, each possibly negated by a leading "-".
_TOKEN = re.compile(r'(-?)"([^"]*)(?:"|$)|(-?)([^\s"]+)')


@dataclass(frozen=True)
class WebSearch:
    """A query split as websearch syntax writes it: the words and phrases any of which a
    message must hold, and the words and phrases excluded (`-word`, `-"a phrase"`)."""

    words: tuple[str, ...]
    phrases: tuple[str, ...]
    excluded: tuple[str, ...]

    @property
    def exclusion_text(self) -> str:
        """The exclusions as a web search of their own (websearch_to_tsquery reads it as
        AND NOT each)."""
        return " ".join(f'-"{x}"' if " " in x else f"-{x}" for x in self.excluded)


def split_websearch(query: str) -> WebSearch:
    """The words, "phrases" and -exclusions of a web search. The operator `or` is dropped: any
    word matches already."""
    words: list[str] = []
    phrases: list[str] = []
    excluded: list[str] = []
    for token in _TOKEN.finditer(query):
        if token.group(2) is not None:
            text, negated = token.group(2).strip(), bool(token.group(1))
        else:
            text, negated = token.group(4).strip("-"), bool(token.group(3))
        if not text:
            continue
        if negated:
            excluded.append(text)
        elif token.group(2) is not None:
            phrases.append(text)
        elif text.lower() != "or":
            words.append(text)
    return WebSearch(tuple(words), tuple(phrases), tuple(excluded))


@dataclass(frozen=True)
class Term:
    """One term of the score: a lexeme, or a phrase of several (`tsquery` matches it)."""

    tsquery: str
    lexemes: tuple[str, ...]


def idf(df: float, n: float) -> float:
    """Lucene's IDF of a term held by `df` of `n` messages."""
    n = max(n, df, 1)
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


# A match read through the GIN index (a heap fetch per match, in no useful order, then a sort by
# seq) costs about as much as this many rows walked back on the primary key (the vector tested
# in place): measured with EXPLAIN ANALYZE on a context of a million messages.
GIN_MATCH_COST = 4


@dataclass(frozen=True)
class TermPlan:
    """How one term's older candidates are read: its newest `need` matches, through the GIN
    index (`gin`, every match read, then sorted by seq) or by walking back on the primary key;
    `gin` None leaves the choice to the planner (nothing is known of the term's frequency)."""

    need: int
    gin: bool | None


def plan_term(
    *, window_matches: int, window: int, n: int, last_seq: int, cap: int, limit: int, budget: int
) -> TermPlan:
    """A term's plan from its matches among the newest `window` seqs of a context of `n` live
    messages (seqs up to `last_seq`); `budget` bounds the rows a walk may cost.

    A term no message of the window holds is left to the planner, up to `cap` matches (a rare
    word: the GIN index). A term estimated at or below the cap keeps all of it (every match of
    a rare term is scored, and its count is exact); a more frequent one has candidates in
    proportion to its weight, `cap` × idf(its estimated df) ÷ idf(1) (the weight of a word one
    message holds), never fewer than the `limit` asked for: a very common word, whose part of
    any score is small, has few. They are walked back on the primary key for no more than
    `budget` rows, or, when reading every match through the GIN index costs less than that
    walk, through the index. In a context no longer than the window every term's count is
    exact and every plan reads all of its matches up to `cap`."""
    if window_matches == 0 or last_seq <= window:
        return TermPlan(cap, None)
    df = window_matches * max(n, 1) / window
    span = max(last_seq, 1)
    weighted = max(limit, round(cap * idf(df, n) / idf(1, n))) if df > cap else cap
    walk = max(limit, min(weighted, int(budget * df / span)))
    if GIN_MATCH_COST * df <= walk * span / df:
        return TermPlan(min(cap, weighted), True)
    return TermPlan(min(cap, walk), False)
