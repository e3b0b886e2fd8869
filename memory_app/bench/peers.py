"""`benchmark --peers`: the same work on the same server with the peers' own libraries.

- langchain-postgres `PostgresChatMessageHistory` (a chat history table: append, read all);
- LangGraph `PostgresStore` (langgraph-checkpoint-postgres; key-value items with a pgvector index,
  the vectors given precomputed through its `embed` function);
- the naive in-process baseline of the rest of the benchmark.

They run in the benchmark's database (their own tables), on one context's worth of the dataset's
texts and vectors. The peers are the optional extra `agentmemory[peers]`, imported only here.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import numpy as np

from memory_app import backlog
from memory_app.bench import baseline
from memory_app.bench.measure import Amount, Rate, Row, Target, time_each
from memory_app.embeddings import indexer, queue
from memory_app.search import fulltext

LC_TABLE = "peer_langchain_history"
LG_TABLES = ("store_vectors", "store", "vector_migrations", "store_migrations")
PEERS_EXTRA = "pip install 'agentmemory[peers]' (langchain-postgres, langgraph-checkpoint-postgres)"


class PeersMissing(Exception):
    pass


def load():
    """The peers' modules, or PeersMissing naming the extra to install."""
    try:
        from langchain_core.messages import AIMessage, HumanMessage
        from langchain_postgres import PostgresChatMessageHistory
        from langgraph.store.base import PutOp
        from langgraph.store.postgres import PostgresStore
    except ImportError as exc:
        raise PeersMissing(f"the peers are not installed ({exc}): {PEERS_EXTRA}") from exc
    return {
        "AIMessage": AIMessage,
        "HumanMessage": HumanMessage,
        "History": PostgresChatMessageHistory,
        "PutOp": PutOp,
        "Store": PostgresStore,
    }


@dataclass
class Workload:
    """The messages every side stores and searches: one context's worth of the dataset's texts,
    their precomputed vectors and the queries, drawn once."""

    n: int
    batch: int
    texts: list[str]
    queries: list[tuple[str, np.ndarray]]
    vector_of: dict[str, list[float]]
    model: str
    dims: int
    roles: list[str]
    chunks: list[range]
    stamp: str

    @classmethod
    def draw(cls, b) -> Workload:
        n = 300 if b.quick else 10_000
        gen = b.gen(seed_offset=4)
        topics = np.array([i % 40 for i in range(n)])
        texts = gen.texts(topics)
        vectors = gen.vectors(topics)
        queries = [gen.query(int(t)) for t in range(min(b.samples, 40))]
        vector_of = {t: v.tolist() for t, v in zip(texts, vectors, strict=True)}
        vector_of.update({q: v.tolist() for q, v in queries})
        batch = 100 if b.quick else 1_000
        return cls(
            n=n,
            batch=batch,
            texts=texts,
            queries=queries,
            vector_of=vector_of,
            model=b.data.model,
            dims=vectors.shape[1],
            roles=["user" if i % 2 == 0 else "assistant" for i in range(n)],
            chunks=[range(i, min(i + batch, n)) for i in range(0, n, batch)],
            stamp=str(time.time_ns()),  # LangGraph namespace labels take no dots
        )


def run(b, *, window_k: int = 20, search_k: int = 10) -> None:
    """Adds rows `peers` (ours vs each peer: ratio = ours ÷ peer) to the report."""
    from memory_app.bench.database import conninfo

    mods = load()
    w = Workload.draw(b)
    ours, ours_ctx = _ours(b, w, window_k=window_k, search_k=search_k)
    naive = _naive(b, w, ours_ctx, window_k=window_k, search_k=search_k)
    info = conninfo()
    lc = _langchain(mods, info, w, window_k=window_k, samples=b.samples)
    lg = _langgraph(mods, info, w, window_k=window_k, search_k=search_k, samples=b.samples)
    ours["storage"] = _ours_per_100k()
    for measure, mine, theirs in _comparisons(w, ours, naive, lc, lg, window_k, search_k):
        for peer, figure in theirs.items():
            b.report.add(Row("peers", f"{measure} — vs {peer}", mine, figure), b.log)
    b.report.add(
        Row(
            "peers",
            f"storage filled through the API, {w.n:,} messages with {w.dims}-d vectors in "
            "batches, after the deferred indexer, per 100,000 messages — vs LangGraph "
            "PostgresStore (the same messages and vectors)",
            ours["storage_api"],
            lg["storage"],
            Target("<=", 1.0, "≤ 1.0× LangGraph PostgresStore", of_ratio=True),
            note=ours["storage_api_note"],
        ),
        b.log,
    )
    b.report.notes += [
        "",
        "## Peers",
        "",
        f"Same server and database, {w.n:,} messages of the dataset's texts with precomputed "
        f"{w.dims}-d vectors (LangGraph receives them through its `embed` function). Ours goes "
        "through the API in-process (WSGI, JSON encoding included), the peers are called in "
        "Python directly. Ratio = ours ÷ peer: below 1 is faster for latencies and smaller for "
        "storage, above 1 is faster for rates. Storage (ours) is the whole dataset's messages "
        "with their vectors and every index, per 100,000 messages.",
    ]


def _ours(b, w: Workload, *, window_k: int, search_k: int) -> tuple[dict[str, object], int]:
    """Ours through the API: ingest with and without vectors, then the window and semantic
    search on the context with vectors (returned with the figures)."""
    from memory_app.bench.harness import API

    ours_ctx = b.post(f"{API}/contexts", {"keys": {"bench": "peers", "at": w.stamp}}).json()["id"]
    text_ctx = b.post(f"{API}/contexts", {"keys": {"bench": "peers-text", "at": w.stamp}}).json()[
        "id"
    ]

    def ingest(cid: int, with_vectors: bool) -> Rate:
        t = time.perf_counter()
        for chunk in w.chunks:
            items = []
            for i in chunk:
                item = {"role": w.roles[i], "text": w.texts[i]}
                if with_vectors:
                    item |= {"vector": w.vector_of[w.texts[i]], "vector_model": w.model}
                items.append(item)
            b.post(f"{API}/contexts/{cid}/messages/batch", {"messages": items})
        return Rate(w.n / (time.perf_counter() - t))

    ours: dict[str, object] = {"ingest": ingest(text_ctx, False)}
    _drained()
    before = _stored_total()
    ours["ingest_vec"] = ingest(ours_ctx, True)
    # LangGraph inserts each vector into its index as it is put; large batches of ours wait for
    # the indexer (its catch-up is the ingest area's own row) and are scanned exactly meanwhile.
    # The searches compare the steady state: after the indexer caught up (vectors and full text).
    _drained()
    ours["storage_api"], ours["storage_api_note"] = _filled(before, w.n)
    path = f"{API}/contexts/{ours_ctx}/select"
    ours["window"] = time_each(
        [lambda: b.post(path, {"selector": "window", "k": window_k})] * b.samples
    )
    ours["search"] = time_each(
        [
            lambda v=v: b.post(
                path,
                {
                    "selector": "search",
                    "query": "",
                    "mode": "semantic",
                    "k": search_k,
                    "model": w.model,
                    "query_vector": v.tolist(),
                },
            )
            for _, v in w.queries
        ]
    )
    return ours, ours_ctx


def _drained() -> None:
    """Every deferred vector in its HNSW graph and every full-text vector written: the indexer
    thread's batches (when it runs) committed, then what is left drained here."""
    from django.conf import settings

    from memory_app.bench.harness import BenchError

    if settings.AGENTMEMORY_INDEXER_THREAD and not backlog.indexer.wait_idle(600):
        raise BenchError("the indexer thread did not drain the batches' backlog")
    indexer.index_pending()
    fulltext.index_pending()
    if queue.unindexed_count() or fulltext.pending_count():
        raise BenchError("vectors or full-text vectors still wait after the indexer's drain")


def _stored_total() -> dict[str, int]:
    from memory_app.bench.storage import stored_bytes

    return {table: size + indexes for table, size, indexes in stored_bytes()[1]}


def _filled(before: dict[str, int], items: int) -> tuple[Amount, str]:
    """What the tables a message occupies grew by since `before`, per 100,000 of the `items`
    stored meanwhile: the vectors' side table vacuumed first (as autovacuum does once the
    indexer has emptied it), the rest as the batches and the indexer left them."""
    from django.db import connection

    waiting = indexer.WAITING_TABLES[indexer.MESSAGE_VECTORS]
    unvacuumed = _stored_total()[waiting] - before[waiting]
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {waiting}")
    after = _stored_total()
    per = 100_000 / items / 1e6
    note = "; ".join(
        f"{table.removeprefix('memory_app_')} +{(after[table] - before[table]) * per:,.1f} MB"
        for table in after
    )
    note += f" (the side table +{unvacuumed * per:,.1f} MB before its vacuum)"
    return Amount(sum(after[t] - before[t] for t in after) * per, "MB"), note


def _naive(b, w: Workload, ours_ctx: int, *, window_k: int, search_k: int) -> dict[str, object]:
    """The naive baseline: its own ingest (fewer messages: row by row is slow), its reads on the
    context ours ingested."""
    from memory_app.models import Context

    naive_ctx = Context.objects.create(
        keys={"bench": "peers-naive", "at": w.stamp}, keys_digest=f"peers-naive-{w.stamp}"
    )
    naive_n = min(w.n, 500)
    texts = w.texts[:naive_n]
    t = time.perf_counter()
    baseline.append_loop_with_vectors(naive_ctx.pk, texts, w.model, [w.vector_of[x] for x in texts])
    naive = {
        "ingest_vec": Rate(naive_n / (time.perf_counter() - t)),
        "window": time_each([lambda: baseline.window(ours_ctx, window_k)] * max(3, b.samples // 5)),
        "search": time_each(
            [
                lambda v=v: baseline.semantic(ours_ctx, w.model, v, search_k)
                for _, v in w.queries[:5]
            ]
        ),
    }
    naive_ctx.delete()
    return naive


def _langchain(mods, info: dict, w: Workload, *, window_k: int, samples: int) -> dict[str, object]:
    """langchain-postgres chat history: append in batches, read the window, its table's size."""
    import psycopg

    lc: dict[str, object] = {}
    with psycopg.connect(**info, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {LC_TABLE}")
        mods["History"].create_tables(conn, LC_TABLE)
        history = mods["History"](LC_TABLE, str(uuid.uuid4()), sync_connection=conn)
        make = [mods["HumanMessage"] if r == "user" else mods["AIMessage"] for r in w.roles]
        t = time.perf_counter()
        for chunk in w.chunks:
            history.add_messages([make[i](content=w.texts[i]) for i in chunk])
        lc["ingest"] = Rate(w.n / (time.perf_counter() - t))
        # Its only read is the whole history; the window is its last k.
        lc["window"] = time_each(
            [lambda: history.get_messages()[-window_k:]] * max(5, samples // 5)
        )
        lc["storage"] = _per_100k(conn, [LC_TABLE], w.n)
    return lc


def _langgraph(
    mods, info: dict, w: Workload, *, window_k: int, search_k: int, samples: int
) -> dict[str, object]:
    """LangGraph PostgresStore: put with vectors (its `embed` hands over the precomputed ones),
    its tables' size, put without, then the window and semantic search."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    lg: dict[str, object] = {}

    def embed(batch_texts):
        return [w.vector_of[x] for x in batch_texts]

    index = {"dims": w.dims, "embed": embed, "fields": ["text"], "distance_type": "cosine"}
    with psycopg.connect(**info, autocommit=True) as conn:
        for table in LG_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    with mods["Store"].from_conn_string(make_conninfo(**info), index=index) as store:
        store.setup()
        ns = ("bench", "peers", w.stamp)
        lg["ingest_vec"] = _langgraph_puts(mods["PutOp"], store, ns, w, index=None)
        with psycopg.connect(**info) as conn:
            lg["storage"] = _per_100k(conn, ["store", "store_vectors"], w.n)
        lg["ingest"] = _langgraph_puts(
            mods["PutOp"], store, ("bench", "peers-text", w.stamp), w, index=False
        )
        # Without a query its search lists the namespace newest first: the recent window.
        lg["window"] = time_each([lambda: store.search(ns, limit=window_k)] * samples)
        lg["search"] = time_each(
            [lambda q=q: store.search(ns, query=q, limit=search_k) for q, _ in w.queries]
        )
    return lg


def _langgraph_puts(put, store, ns: tuple[str, ...], w: Workload, *, index: bool | None) -> Rate:
    """Every message put in batches; `index=False` skips the vector index, None uses the
    store's."""
    extra = {} if index is None else {"index": index}
    t = time.perf_counter()
    for chunk in w.chunks:
        store.batch(
            [
                put(ns, f"m{i:08d}", {"role": w.roles[i], "text": w.texts[i], "seq": i}, **extra)
                for i in chunk
            ]
        )
    return Rate(w.n / (time.perf_counter() - t))


def _comparisons(
    w: Workload,
    ours: dict[str, object],
    naive: dict[str, object],
    lc: dict[str, object],
    lg: dict[str, object],
    window_k: int,
    search_k: int,
) -> list[tuple[str, object, dict[str, object]]]:
    """(measure, our figure, {peer: its figure}) in the order the report lists them."""
    return [
        (
            f"ingest, batches of {w.batch:,} (text only)",
            ours["ingest"],
            {
                "langchain-postgres chat history": lc["ingest"],
                "LangGraph PostgresStore": lg["ingest"],
            },
        ),
        (
            f"ingest, batches of {w.batch:,} with {w.dims}-d vectors",
            ours["ingest_vec"],
            {
                "LangGraph PostgresStore": lg["ingest_vec"],
                "naive (ORM row by row)": naive["ingest_vec"],
            },
        ),
        (
            f"recent window k={window_k} of {w.n:,} messages",
            ours["window"],
            {
                "langchain-postgres chat history": lc["window"],
                "LangGraph PostgresStore": lg["window"],
                "naive (ORM row by row)": naive["window"],
            },
        ),
        (
            f"semantic search k={search_k} in {w.n:,} messages (ours after the indexer caught up)",
            ours["search"],
            {"LangGraph PostgresStore": lg["search"], "naive (ORM row by row)": naive["search"]},
        ),
        (
            "storage per 100,000 messages",
            ours["storage"],
            {
                "langchain-postgres chat history (no vectors)": lc["storage"],
                "LangGraph PostgresStore (with vectors)": lg["storage"],
            },
        ),
    ]


def _per_100k(conn, tables: list[str], items: int) -> Amount:
    size = sum(
        conn.execute("SELECT pg_total_relation_size(%s::regclass)", [t]).fetchone()[0]
        for t in tables
    )
    return Amount(size * 100_000 / items / 1e6, "MB")


def _ours_per_100k() -> Amount:
    from memory_app.bench.storage import stored_bytes

    count, parts = stored_bytes()
    size = sum(table + indexes for _, table, indexes in parts)
    return Amount(size * 100_000 / max(count, 1) / 1e6, "MB")
