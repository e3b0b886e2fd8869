"""Semantic search recall@10 against an exact scan: what the approximate (HNSW) path gives up."""

from __future__ import annotations

import numpy as np
from django.conf import settings

from memory_app.bench.harness import SCALE_MESSAGES, SEARCH_K, Bench, context_size
from memory_app.bench.measure import Amount, Row, Target
from memory_app.embeddings import indexer
from memory_app.models import Context
from memory_app.search.semantic import ef_search_for, semantic_ranking, store_size


def recall(b: Bench) -> None:
    """Semantic search recall@10 against an exact scan, on the largest context (and at scale on
    a large context that is a small part of the store: the filtered-HNSW case)."""
    contexts = {"largest context": b.data.largest_context_id}
    if b.data.sizes.largest_messages >= SCALE_MESSAGES:
        contexts[f"context of {context_size(3):,} msgs in a store of {b.data.sizes.messages:,}"] = 3
    for label, cid in contexts.items():
        _recall(b, label, cid)


def _recall(b: Bench, label: str, cid: int) -> None:

    gen = b.gen(seed_offset=2)
    ids, matrix = _live_vectors(cid, b.data.model, b.data.sizes.dims)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    topics = b.data.context_topics[cid]
    n_queries = 20 if b.quick else 100
    total, paths = 0.0, set()
    for i in range(n_queries):
        _, v = gen.query(topics[i % len(topics)])
        hits, path = semantic_ranking(
            context_id=cid, model=b.data.model, vector=[float(x) for x in v], limit=SEARCH_K
        )
        paths.add(path)
        exact = set(ids[np.argsort(-(matrix @ (v / np.linalg.norm(v))))[:SEARCH_K]].tolist())
        total += len(exact & {mid for mid, _ in hits}) / SEARCH_K
    value = total / n_queries
    # The index as built (the settings shape new indexes only; see `manage.py hnsw_rebuild`).
    built = [
        f"m={i.m}, ef_construction={i.ef_construction}"
        for i in indexer.built_indexes()
        if (i.model, i.dimensions, i.table)
        == (b.data.model, b.data.sizes.dims, indexer.MESSAGE_VECTORS)
    ]
    store = store_size(b.data.model, b.data.sizes.dims)
    share = Context.objects.get(pk=cid).message_count
    settings_text = (
        f"path {'/'.join(sorted(paths))}; HNSW {' / '.join(built) or 'index not found'}, "
        f"ef_search={ef_search_for(store, SEARCH_K, share)} (store {store:,}, context {share:,}), "
        "iterative scan; "
        f"exact scan below {settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD:,} messages per "
        f"context; {n_queries} queries"
    )
    b.report.add(
        Row(
            "search",
            f"semantic recall@{SEARCH_K} vs exact scan, {label}",
            Amount(value, ""),
            None,
            Target(">=", 0.95, "≥ 0.95"),
            note=settings_text,
        ),
        b.log,
    )


def _live_vectors(context_id: int, model: str, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """The ground truth's input: every live message's vector, read in binary on a connection of
    its own (pgvector's numpy loader) rather than parsed from text by the ORM."""
    import psycopg
    from pgvector.psycopg import register_vector

    from memory_app.bench.database import conninfo

    with psycopg.connect(**conninfo()) as conn:
        register_vector(conn)
        rows = conn.execute(
            f"""
            SELECT e.message_id, e.vector::vector({int(dims)}) FROM memory_app_embedding e
            JOIN memory_app_message m ON m.id = e.message_id
            WHERE e.context_id = %s AND e.model = %s AND m.pruned_at IS NULL
                AND e.vector IS NOT NULL
            """,  # noqa: S608 - dims is an int
            [context_id, model],
            binary=True,
        ).fetchall()
    ids = np.array([r[0] for r in rows])
    matrix = np.vstack(
        [
            np.asarray(r[1].to_numpy() if hasattr(r[1], "to_numpy") else r[1], dtype=np.float32)
            for r in rows
        ]
    )
    return ids, matrix
