"""Fusion of the keyword and the semantic rankings (reciprocal rank fusion)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Reciprocal rank fusion constant (Cormack et al.): damps the weight of top ranks.
RRF_K = 60


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
