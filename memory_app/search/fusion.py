"""Fusion of rankings: message search's hybrid mode (`ranked_order`, a weighted sum of
normalised scores) and reciprocal rank fusion (`rrf_scores`, for memory recall)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Reciprocal rank fusion constant (Cormack et al.): damps the weight of top ranks.
RRF_K = 60
# Hybrid search's weight of the keyword score (the semantic one weighs the rest). On LoCoMo's
# questions (`benchmark --quality`, memory_app/bench/notes.md) BM25 finds the evidence far more
# often than the local model's cosine: equal-weight reciprocal rank fusion fell below keyword
# search alone (recall@10 0.50 against 0.58), this weighted sum is at or above both (0.59).
KEYWORD_WEIGHT = 0.8


def rrf_scores(*rankings: Sequence[tuple[int, Any]]) -> dict[int, float]:
    """Reciprocal rank fusion: each id scores the sum of 1 / (RRF_K + rank) over the rankings
    (each a best-first list of (id, score)) it appears in."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, (item_id, _) in enumerate(ranking, start=1):
            fused[item_id] = fused.get(item_id, 0.0) + 1.0 / (RRF_K + rank)
    return fused


def ranked_order(
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
    fused = weighted_scores(keyword, semantic)
    # Ties: better best rank first, then id (newer) for a stable order.
    return sorted(
        fused.items(),
        key=lambda item: (
            -item[1],
            min(kw.get(item[0], (10**9,))[0], sem.get(item[0], (10**9,))[0]),
            -item[0],
        ),
    )


def weighted_scores(
    keyword: list[tuple[int, float]], semantic: list[tuple[int, float]]
) -> dict[int, float]:
    """KEYWORD_WEIGHT × the BM25 score over the best one's, plus the rest × the cosine
    similarity scaled to 0..1 between the list's least and most similar (1 when they are
    equal); a message missing from one list gets 0 from it. Scores rather than ranks: a
    ranking's confidence (a clear BM25 winner, a flat cosine list) carries into the fusion."""
    fused: dict[int, float] = {}
    best = max((score for _, score in keyword), default=0.0)
    for mid, score in keyword:
        fused[mid] = KEYWORD_WEIGHT * (score / best if best > 0 else 1.0)
    similarities = [1.0 - distance for _, distance in semantic]
    low, high = min(similarities, default=0.0), max(similarities, default=0.0)
    for (mid, _), similarity in zip(semantic, similarities, strict=True):
        scaled = (similarity - low) / (high - low) if high > low else 1.0
        fused[mid] = fused.get(mid, 0.0) + (1.0 - KEYWORD_WEIGHT) * scaled
    return fused
