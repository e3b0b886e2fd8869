"""The rows of `benchmark --only citus`: an agent's routed operations on the single node and on
the cluster, turn about, through the API in-process (`django.test.Client`: WSGI, middleware,
API-key authentication, JSON), as the other rows are measured; what each statement of an
operation does on the cluster (routed to one shard, run on the coordinator, or fanned out);
the store's size on both; and the report's section (`## Single node vs Citus cluster`), which
the citus area writes alone into the Markdown file and a full run keeps as it is.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings

from memory_app.bench import sections
from memory_app.bench.citus import Pair, Side
from memory_app.bench.dataset import Dataset, Generator
from memory_app.bench.harness import API, MAX_TOKENS, SEARCH_K, WINDOW_K, BenchError
from memory_app.bench.measure import Latency, latency_of, loadavg

SECTION = sections.CITUS
# The target: a routed operation on the cluster within 1.5× the single node's p50.
TARGET_RATIO = 1.5
WARMUP = 3


@dataclass
class Op:
    name: str
    call: Callable[[Side, int], object]


@dataclass
class CitusRow:
    op: str
    single: Latency
    cluster: Latency
    statements: str
    load: float

    @property
    def ratio(self) -> float:
        return self.cluster.p50 / self.single.p50

    @property
    def met(self) -> bool:
        return self.ratio <= TARGET_RATIO


def connect_clients(pair: Pair) -> None:
    """An API key of each side's own store, and a client holding it."""
    from memory_app import auth

    for side in pair.sides():
        pair.use(side)
        issued = auth.apikey_create(name="benchmark", scopes=["read", "write", "admin"])
        side.client = Client(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")


def _post(side: Side, path: str, body: dict) -> dict:
    response = side.client.post(path, data=json.dumps(body), content_type="application/json")
    if response.status_code not in (200, 201):
        raise BenchError(
            f"{side.name}: POST {path} answered {response.status_code}: {response.content[:300]!r}"
        )
    return response


def operations(data: Dataset, calls: int) -> list[Op]:
    """The agent's per-turn operations on the largest context (and contexts found by keys); the
    i-th call sends the same request to either side."""
    gen = Generator(data.sizes)
    gen.rng = np.random.default_rng(data.sizes.seed + 2000)
    cid = data.largest_context_id
    topics = data.context_topics[cid]
    queries = [gen.query(topics[i % len(topics)]) for i in range(calls)]
    texts = gen.texts(np.array([i % 40 for i in range(calls)]))
    select = f"{API}/contexts/{cid}/select"
    n_contexts = data.sizes.contexts
    stamp = str(time.time_ns())

    def keys_of(i: int) -> dict:  # the dataset's own keys (bench.load) of a spread of contexts
        c = (i * 7919) % n_contexts + 1
        return {"tenant": f"t{c % 7}", "user": f"user{c}", "chat": str(c)}

    def queued_append(side: Side, i: int):
        # As a server with an embedding model configured appends: each message queued for its
        # vector in the append's statement (the worker that embeds it is not running here).
        with override_settings(
            AGENTMEMORY_EMBEDDING_PROVIDER="openai", AGENTMEMORY_EMBEDDING_MODEL=data.model
        ):
            body = {"role": "user", "text": texts[i]}
            return _post(side, f"{API}/contexts/{cid}/messages", body)

    def semantic(side: Side, i: int):
        vector = [float(x) for x in queries[i][1]]
        body = {"selector": "search", "query": "", "k": SEARCH_K, "mode": "semantic"}
        return _post(side, select, {**body, "model": data.model, "query_vector": vector})

    return [
        Op(
            f"window k={WINDOW_K}",
            lambda s, i: _post(s, select, {"selector": "window", "k": WINDOW_K}),
        ),
        Op(
            f"token_window {MAX_TOKENS} contiguous",
            lambda s, i: _post(
                s,
                select,
                {"selector": "token_window", "max_tokens": MAX_TOKENS, "policy": "contiguous"},
            ),
        ),
        Op(
            f"keyword search k={SEARCH_K}",
            lambda s, i: _post(
                s,
                select,
                {"selector": "search", "query": queries[i][0], "k": SEARCH_K, "mode": "keyword"},
            ),
        ),
        Op(f"semantic search k={SEARCH_K}", semantic),
        Op(
            "get-or-create a context by keys (existing)",
            lambda s, i: _post(s, f"{API}/contexts", {"keys": keys_of(i)}),
        ),
        Op(
            "get-or-create a context by keys (new)",
            lambda s, i: _post(
                s, f"{API}/contexts", {"keys": {"bench": "citus", "n": f"{stamp}{i}"}}
            ),
        ),
        # Last: they write (the reads above see the loaded store).
        Op(
            "single append",
            lambda s, i: _post(
                s, f"{API}/contexts/{cid}/messages", {"role": "user", "text": texts[i]}
            ),
        ),
        Op(f"single append queued for {data.model}", queued_append),
    ]


def measure(pair: Pair, data: Dataset, *, samples: int, log: Callable[[str], None]):
    """Each operation `samples` times on each side, the sides taking turns call by call (the
    side that goes first alternates), after a warm-up; then once more on each side with its
    statements captured."""
    rows, fanned = [], []
    for op in operations(data, WARMUP + samples + 1):
        times: dict[str, list[float]] = {"single node": [], "cluster": []}
        for i in range(WARMUP + samples):
            order = pair.sides() if i % 2 == 0 else tuple(reversed(pair.sides()))
            for side in order:
                pair.use(side)
                t = time.perf_counter()
                op.call(side, i)
                if i >= WARMUP:
                    times[side.name].append((time.perf_counter() - t) * 1000)
        statements, fans = _statements(pair, op, WARMUP + samples)
        fanned += [f"{op.name}: {sql}" for sql in fans]
        row = CitusRow(
            op.name,
            latency_of(times["single node"]),
            latency_of(times["cluster"]),
            statements,
            os.getloadavg()[0],
        )
        log(
            f"  {op.name}: single {row.single} · cluster {row.cluster} · "
            f"{row.ratio:.2f}× · {statements}"
        )
        rows.append(row)
    return rows, fanned


def _statements(pair: Pair, op: Op, i: int) -> tuple[str, list[str]]:
    """How many statements the operation sends on each side, and on the cluster what each is:
    routed to one shard (`Task Count: 1`), run on the coordinator alone (no Citus node in its
    plan: local and reference tables' coordinator copies), or fanned out to several shards."""
    counts = {}
    for side in pair.sides():
        pair.use(side)
        with CaptureQueriesContext(connection) as captured:
            op.call(side, i)
        counts[side.name] = [q["sql"] for q in captured.captured_queries]
    kinds: dict[str, int] = {}
    fans = []
    with connection.cursor() as cursor:  # the cluster's: it was used last
        for sql in counts["cluster"]:
            kind = _kind(cursor, sql)
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind.startswith("fan-out"):
                fans.append(sql[:300])
    single, cluster = len(counts["single node"]), len(counts["cluster"])
    text = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    return f"{cluster} ({text})" + ("" if single == cluster else f"; {single} on one node"), fans


_DML = re.compile(r"^\s*\(?\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)


def _kind(cursor, sql: str) -> str:
    if not _DML.match(sql):
        return "other"  # SAVEPOINT, SET LOCAL, ...: no plan, no shard
    try:
        cursor.execute("EXPLAIN " + sql)
    except Exception:  # a statement whose text does not replay alone: counted, not classified
        return "unclassified"
    plan = "\n".join(row[0] for row in cursor.fetchall())
    tasks = [int(n) for n in re.findall(r"Task Count: (\d+)", plan)]
    if not tasks:
        return "coordinator"
    if max(tasks) == 1:
        return "routed"
    return f"fan-out ({max(tasks)} tasks)"


# --- storage ----------------------------------------------------------------------------------

STORE_TABLES = (
    "memory_app_message",
    "memory_app_embedding",
    "memory_app_messagesearch",
    "memory_app_context",
    "memory_app_contextkey",
)
_HNSW_ON_SHARD = (
    "SELECT coalesce(sum(pg_relation_size(i.indexrelid)), 0) FROM pg_index i"
    " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam"
    " WHERE i.indrelid = '%s'::regclass AND a.amname = 'hnsw'"
)


def _server(cursor) -> str:
    cursor.execute(
        "SELECT current_setting('server_version'), current_setting('shared_buffers'),"
        " (SELECT extversion FROM pg_extension WHERE extname = 'vector')"
    )
    version, buffers, vector = cursor.fetchone()
    return f"PostgreSQL {version}, pgvector {vector}, shared_buffers {buffers}"


def storage(pair: Pair, data: Dataset) -> dict:
    """Bytes of the store's tables with their indexes on each side (the cluster's summed over
    its shards), the HNSW graphs' bytes, and how the cluster's bytes sit on its nodes."""
    out: dict = {"tables": {}}
    pair.use(pair.single)
    with connection.cursor() as cursor:
        out["server"] = _server(cursor)
        cursor.execute("SELECT count(*) FROM memory_app_message")
        out["messages"] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM memory_app_embedding WHERE vector IS NOT NULL")
        out["vectors"] = cursor.fetchone()[0]
        for table in STORE_TABLES:
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
            out["tables"][table] = [cursor.fetchone()[0], None]
        cursor.execute(
            "SELECT coalesce(sum(pg_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'hnsw'"
        )
        out["hnsw"] = [int(cursor.fetchone()[0]), None]
    pair.use(pair.cluster)
    with connection.cursor() as cursor:
        out["cluster_server"] = _server(cursor)
        cursor.execute("SELECT citus_version()")
        out["citus"] = cursor.fetchone()[0].split(" on ")[0]
        for table in STORE_TABLES:
            cursor.execute("SELECT citus_total_relation_size(%s)", [table])
            out["tables"][table][1] = cursor.fetchone()[0]
        cursor.execute(
            "SELECT coalesce(sum(result::bigint), 0) FROM run_command_on_shards("
            "'memory_app_embedding', %s)",
            [_HNSW_ON_SHARD],
        )
        out["hnsw"][1] = int(cursor.fetchone()[0])
        cursor.execute(
            "SELECT nodename || ':' || nodeport, count(*), sum(shard_size) FROM citus_shards"
            " GROUP BY 1 ORDER BY 1"
        )
        out["nodes"] = cursor.fetchall()
        cursor.execute(
            "SELECT count(DISTINCT shardid), max(shard_size) FROM citus_shards"
            " WHERE table_name = 'memory_app_embedding'::regclass"
        )
        out["shards"], out["largest_vector_shard"] = cursor.fetchone()
    return out


# --- the report's section ---------------------------------------------------------------------


def section(
    rows: list[CitusRow],
    fanned: list[str],
    store: dict,
    data: Dataset,
    *,
    command: str,
    cluster: str,
    samples: int,
    quick: bool,
) -> list[str]:
    s = data.sizes
    load = loadavg()
    lines = [
        *sections.opening(SECTION, command, quick=quick),
        f"- Servers: single node {store['server']}; coordinator {store['cluster_server']}, "
        f"{store['citus']} (the workers run the same build).",
        f"- Cluster: {cluster}, {store['shards']} shards per distributed table "
        "(`manage.py distribute`), every node on this machine "
        f"({os.cpu_count()} cores shared by all three and by the client); each node has the "
        "embedded server's memory settings. The single node is the embedded server.",
        f"- Dataset (the same rows on both, `bench.load`): {s.messages:,} messages over "
        f"{s.contexts:,} contexts, the largest holding {s.largest_messages:,}, every message "
        f"with a {s.dims}-d vector and its full-text vector; {s.runs:,} runs. The operations "
        "read and write the largest context; get-or-create finds contexts by their keys.",
        "- Path: the HTTP API in-process (`django.test.Client`, WSGI and API-key authentication "
        "included), as the other rows; each side's connection stays open, both over a Unix "
        "socket (the coordinator reaches its workers over TCP).",
        f"- Latencies: p50 / p95 of {samples} calls per side after {WARMUP} warm-up calls; "
        "the sides take turns call by call, the first of each pair alternating "
        "(single, cluster, cluster, single, …), so both see the same load. "
        f"Load average (1/5/15 min) when written: {load}.",
        "- Statements: what one call sends to the coordinator, each classified by its "
        "`EXPLAIN` there: routed (one shard), coordinator (local or reference tables' "
        "coordinator copies: no worker), fan-out (several shards).",
        "",
        "| Operation | Single node | Cluster | Cluster / single (p50) | Target | Result | "
        "Statements on the cluster | Load (1 min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.op} | {r.single} | {r.cluster} | {r.ratio:.2f}× | ≤ {TARGET_RATIO}× | "
            f"{'met' if r.met else '**missed**'} | {r.statements} | {r.load:.2f} |"
        )
    if fanned:
        lines += ["", "Statements fanned out to several shards:", ""]
        lines += [f"- `{f}`" for f in fanned]
    lines += ["", *storage_lines(store)]
    return lines


def _mb(n: int | None) -> str:
    return "—" if n is None else f"{int(n) / 1e6:,.1f} MB"


def storage_lines(store: dict) -> list[str]:
    per = max(store["messages"], 1)
    total = [sum(int(v[i]) for v in store["tables"].values()) for i in (0, 1)]
    lines = [
        f"Storage of the store ({store['messages']:,} messages, {store['vectors']:,} vectors; "
        "tables with their indexes and TOAST; the cluster's summed over its shards by "
        "`citus_total_relation_size`):",
        "",
        "| Table | Single node | Cluster (all shards) |",
        "|---|---|---|",
    ]
    lines += [f"| `{table}` | {_mb(a)} | {_mb(b)} |" for table, (a, b) in store["tables"].items()]
    lines += [
        f"| of which HNSW graphs | {_mb(store['hnsw'][0])} | {_mb(store['hnsw'][1])} |",
        f"| **total** | {_mb(total[0])} | {_mb(total[1])} |",
        f"| **per message** (text, vector, full-text vector, indexes) | "
        f"{total[0] / per / 1e3:,.2f} KB | {total[1] / per / 1e3:,.2f} KB |",
        f"| HNSW per vector | {store['hnsw'][0] / max(store['vectors'], 1):,.0f} B | "
        f"{store['hnsw'][1] / max(store['vectors'], 1):,.0f} B |",
        "",
        "On the cluster's nodes (every distributed and reference table's shards; "
        f"largest shard of the vectors {_mb(store['largest_vector_shard'])}): "
        + "; ".join(f"{node}: {n} shards, {_mb(int(size))}" for node, n, size in store["nodes"]),
    ]
    return lines
