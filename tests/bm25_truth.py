"""BM25 computed the slow way, for tests: every live message of a context parsed from its text,
every term counted over all of them (keyword search estimates some of this; in a small context
its answer must be this one)."""

from __future__ import annotations

import math
import re

from django.db import connection

K1, B = 1.2, 0.75


def _positions(vector_text: str) -> dict[str, int]:
    return {
        lexeme.replace("''", "'"): len(positions.split(",")) if positions else 1
        for lexeme, positions in re.findall(r"'((?:[^']|'')*)'(?::(\S+))?", vector_text)
    }


def split(query: str) -> dict:
    """A simple query's words and -exclusions, as keyword arguments of `bm25_truth`."""
    tokens = query.split()
    return {
        "words": [t for t in tokens if not t.startswith("-")],
        "excluded": [t[1:] for t in tokens if t.startswith("-")],
    }


def bm25_truth(context, *, words=(), phrases=(), excluded=(), strict=None):
    """(message id, score) best first, ties newest first, of the live messages holding any of
    `words` or `phrases`, none of `excluded` and (when given) matching the web search
    `strict`."""
    with connection.cursor() as cur:
        terms = []
        for text, parse in [(w, "plainto_tsquery") for w in words] + [
            (p, "phraseto_tsquery") for p in phrases
        ]:
            cur.execute(
                f"SELECT {parse}('english', %s)::text, "
                "tsvector_to_array(to_tsvector('english', %s))",
                [text, text],
            )
            tsquery, lexemes = cur.fetchone()
            if tsquery and tsquery not in [t[0] for t in terms]:
                terms.append((tsquery, lexemes))
        cur.execute(
            "SELECT id, seq, to_tsvector('english', left(text, 128000)) FROM memory_app_message"
            " WHERE context_id = %s AND pruned_at IS NULL",
            [context.pk],
        )
        messages = cur.fetchall()
        n = len(messages)
        rows = []
        for mid, seq, vector in messages:
            cur.execute(
                "SELECT %s::tsvector::text, length(%s::tsvector),"
                " ARRAY(SELECT %s::tsvector @@ q::tsquery FROM unnest(%s::text[]) q),"
                " %s::tsvector @@ coalesce(websearch_to_tsquery('english', %s), ''),"
                " %s::tsvector @@ coalesce(websearch_to_tsquery('english', %s), '')",
                [vector, vector, vector, [t[0] for t in terms]]
                + [vector, " or ".join(f'"{x}"' for x in excluded), vector, strict or ""],
            )
            text, length, matched, is_excluded, strict_match = cur.fetchone()
            rows.append((mid, seq, _positions(text), length, matched, is_excluded, strict_match))
    # Counted among the messages the query may match (its exclusions applied).
    df = [sum(1 for r in rows if r[4][i] and not (excluded and r[5])) for i in range(len(terms))]
    candidates = [
        r for r in rows if any(r[4]) and not (excluded and r[5]) and (strict is None or r[6])
    ]
    if not candidates:
        return []
    avgdl = sum(r[3] for r in candidates) / len(candidates)
    scored = []
    for mid, seq, tfs, length, matched, _, _ in candidates:
        total = 0.0
        for i, (_, lexemes) in enumerate(terms):
            tf = min(tfs.get(x, 0) for x in lexemes) if matched[i] else 0
            if tf:
                idf = math.log(1 + (n - df[i] + 0.5) / (df[i] + 0.5))
                total += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avgdl))
        scored.append((mid, seq, total))
    return [(mid, s) for mid, _, s in sorted(scored, key=lambda r: (-r[2], -r[1]))]
