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

import numpy as np

from memory_app.bench import baseline
from memory_app.bench.measure import Amount, Rate, Row, time_each
from memory_app.embeddings import indexer
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


def run(b, *, window_k: int = 20, search_k: int = 10) -> None:
    """Adds rows `peers` (ours vs each peer: ratio = ours ÷ peer) to the report."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    from memory_app.bench.database import conninfo
    from memory_app.bench.harness import API

    mods = load()
    n = 300 if b.quick else 10_000
    batch = 100 if b.quick else 1_000
    gen = b.gen(seed_offset=4)
    topics = np.array([i % 40 for i in range(n)])
    texts = gen.texts(topics)
    vectors = gen.vectors(topics)
    queries = [gen.query(int(t)) for t in range(min(b.samples, 40))]
    vector_of = {t: v.tolist() for t, v in zip(texts, vectors, strict=True)}
    vector_of.update({q: v.tolist() for q, v in queries})
    model, dims = b.data.model, vectors.shape[1]
    roles = ["user" if i % 2 == 0 else "assistant" for i in range(n)]
    chunks = [range(i, min(i + batch, n)) for i in range(0, n, batch)]
    stamp = str(time.time_ns())  # LangGraph namespace labels take no dots

    # --- ours, through the API ----------------------------------------------------------------
    ours_ctx = b.post(f"{API}/contexts", {"keys": {"bench": "peers", "at": stamp}}).json()["id"]
    text_ctx = b.post(f"{API}/contexts", {"keys": {"bench": "peers-text", "at": stamp}}).json()[
        "id"
    ]

    def ours_ingest(cid: int, with_vectors: bool) -> Rate:
        t = time.perf_counter()
        for chunk in chunks:
            items = []
            for i in chunk:
                item = {"role": roles[i], "text": texts[i]}
                if with_vectors:
                    item |= {"vector": vector_of[texts[i]], "vector_model": model}
                items.append(item)
            b.post(f"{API}/contexts/{cid}/messages/batch", {"messages": items})
        return Rate(n / (time.perf_counter() - t))

    ours = {
        "ingest": ours_ingest(text_ctx, False),
        "ingest_vec": ours_ingest(ours_ctx, True),
    }
    # LangGraph inserts each vector into its index as it is put; large batches of ours wait for
    # the indexer (its catch-up is the ingest area's own row) and are scanned exactly meanwhile.
    # The searches compare the steady state: after the indexer caught up (vectors and full text).
    indexer.index_pending()
    fulltext.index_pending()
    ours |= {
        "window": time_each(
            [
                lambda: b.post(
                    f"{API}/contexts/{ours_ctx}/select", {"selector": "window", "k": window_k}
                )
            ]
            * b.samples
        ),
        "search": time_each(
            [
                lambda v=v: b.post(
                    f"{API}/contexts/{ours_ctx}/select",
                    {
                        "selector": "search",
                        "query": "",
                        "mode": "semantic",
                        "k": search_k,
                        "model": model,
                        "query_vector": v.tolist(),
                    },
                )
                for _, v in queries
            ]
        ),
    }

    # --- naive ----------------------------------------------------------------------------------
    from memory_app.models import Context

    naive_ctx = Context.objects.create(
        keys={"bench": "peers-naive", "at": stamp}, keys_digest=f"peers-naive-{stamp}"
    )
    naive_n = min(n, 500)
    t = time.perf_counter()
    baseline.append_loop_with_vectors(
        naive_ctx.pk, texts[:naive_n], model, [vector_of[x] for x in texts[:naive_n]]
    )
    naive = {
        "ingest_vec": Rate(naive_n / (time.perf_counter() - t)),
        "window": time_each([lambda: baseline.window(ours_ctx, window_k)] * max(3, b.samples // 5)),
        "search": time_each(
            [lambda v=v: baseline.semantic(ours_ctx, model, v, search_k) for _, v in queries[:5]]
        ),
    }
    naive_ctx.delete()

    # --- langchain-postgres chat history ------------------------------------------------------
    info = conninfo()
    lc: dict[str, object] = {}
    with psycopg.connect(**info, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {LC_TABLE}")
        mods["History"].create_tables(conn, LC_TABLE)
        history = mods["History"](LC_TABLE, str(uuid.uuid4()), sync_connection=conn)
        make = [mods["HumanMessage"] if r == "user" else mods["AIMessage"] for r in roles]
        t = time.perf_counter()
        for chunk in chunks:
            history.add_messages([make[i](content=texts[i]) for i in chunk])
        lc["ingest"] = Rate(n / (time.perf_counter() - t))
        # Its only read is the whole history; the window is its last k.
        lc["window"] = time_each(
            [lambda: history.get_messages()[-window_k:]] * max(5, b.samples // 5)
        )
        lc["storage"] = _per_100k(conn, [LC_TABLE], n)

    # --- LangGraph PostgresStore --------------------------------------------------------------
    lg: dict[str, object] = {}

    def embed(batch_texts):
        return [vector_of[x] for x in batch_texts]

    index = {"dims": dims, "embed": embed, "fields": ["text"], "distance_type": "cosine"}
    with psycopg.connect(**info, autocommit=True) as conn:
        for table in LG_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    with mods["Store"].from_conn_string(make_conninfo(**info), index=index) as store:
        store.setup()
        ns = ("bench", "peers", stamp)
        put = mods["PutOp"]
        t = time.perf_counter()
        for chunk in chunks:
            store.batch(
                [
                    put(ns, f"m{i:08d}", {"role": roles[i], "text": texts[i], "seq": i})
                    for i in chunk
                ]
            )
        lg["ingest_vec"] = Rate(n / (time.perf_counter() - t))
        with psycopg.connect(**info) as conn:
            lg["storage"] = _per_100k(conn, ["store", "store_vectors"], n)
        text_ns = ("bench", "peers-text", stamp)
        t = time.perf_counter()
        for chunk in chunks:
            store.batch(
                [
                    put(
                        text_ns,
                        f"m{i:08d}",
                        {"role": roles[i], "text": texts[i], "seq": i},
                        index=False,
                    )
                    for i in chunk
                ]
            )
        lg["ingest"] = Rate(n / (time.perf_counter() - t))
        # Without a query its search lists the namespace newest first: the recent window.
        lg["window"] = time_each([lambda: store.search(ns, limit=window_k)] * b.samples)
        lg["search"] = time_each(
            [lambda q=q: store.search(ns, query=q, limit=search_k) for q, _ in queries]
        )

    ours_storage = _ours_per_100k()
    rows: list[tuple[str, object, dict[str, object]]] = [
        (
            f"ingest, batches of {batch:,} (text only)",
            ours["ingest"],
            {
                "langchain-postgres chat history": lc["ingest"],
                "LangGraph PostgresStore": lg["ingest"],
            },
        ),
        (
            f"ingest, batches of {batch:,} with {dims}-d vectors",
            ours["ingest_vec"],
            {
                "LangGraph PostgresStore": lg["ingest_vec"],
                "naive (ORM row by row)": naive["ingest_vec"],
            },
        ),
        (
            f"recent window k={window_k} of {n:,} messages",
            ours["window"],
            {
                "langchain-postgres chat history": lc["window"],
                "LangGraph PostgresStore": lg["window"],
                "naive (ORM row by row)": naive["window"],
            },
        ),
        (
            f"semantic search k={search_k} in {n:,} messages (ours after the indexer caught up)",
            ours["search"],
            {"LangGraph PostgresStore": lg["search"], "naive (ORM row by row)": naive["search"]},
        ),
        (
            "storage per 100,000 messages",
            ours_storage,
            {
                "langchain-postgres chat history (no vectors)": lc["storage"],
                "LangGraph PostgresStore (with vectors)": lg["storage"],
            },
        ),
    ]
    for measure, mine, theirs in rows:
        for peer, figure in theirs.items():
            b.report.add(Row("peers", f"{measure} — vs {peer}", mine, figure), b.log)
    b.report.notes += [
        "",
        "## Peers",
        "",
        f"Same server and database, {n:,} messages of the dataset's texts with precomputed "
        f"{dims}-d vectors (LangGraph receives them through its `embed` function). Ours goes "
        "through the API in-process (WSGI, JSON encoding included), the peers are called in "
        "Python directly. Ratio = ours ÷ peer: below 1 is faster for latencies and smaller for "
        "storage, above 1 is faster for rates. Storage (ours) is the whole dataset's messages "
        "with their vectors and every index, per 100,000 messages.",
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
