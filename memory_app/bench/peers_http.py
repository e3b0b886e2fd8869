"""`benchmark --only peers_http`: ours against the peers, each behind an HTTP server of the same
kind, over the same transport, interleaved.

Ours is served as `manage.py serve` serves it (gunicorn, one uvicorn worker, the site's ASGI
app); the peers by the same server with the same worker class, one worker, started side by
side, running `memory_app/bench/peer_handlers.py` in the peers' own venv (`make peers-venv`):
langchain-postgres's `PostgresChatMessageHistory` and LangGraph's `AsyncPostgresStore`, each
route a few lines around the library call. One keep-alive `http.client` connection per side;
request bodies are encoded before the clock; a call ends when its whole answer is read.

Each row pairs a call of ours (A) with the peer's (B), A B, B A, A B ..., and its ratio is the
median of the per-pair ratios, the spread beside it (issue target ≤ 1.0: ours as fast as the peer or
faster; for batches the time per batch of 1,000). Both sides hold the same texts and vectors:
reads on a context of 10,000 messages, semantic search on 10,000 and 50,000, writes into
fresh contexts. Ours is loaded through the API's batches and the deferred indexer drained
(`peers._drained`), the peers through their own routes; then both sides' tables are vacuumed
and analysed.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import orjson
import psycopg
from django.conf import settings

from memory_app.bench import sections
from memory_app.bench.harness import API, MAX_TOKENS, SEARCH_K, WINDOW_K, Bench, BenchError
from memory_app.bench.http_path import _Http, _served
from memory_app.bench.measure import (
    Paired,
    Row,
    Target,
    load_span,
    loadavg,
    paired_note,
    time_pairs,
)

AREA = "peers (HTTP)"
# The section `--only peers_http` writes into the report alone (kept by every other run).
SECTION = sections.PEERS_HTTP
TARGET = Target("<=", 1.0, "median per-pair ratio ≤ 1.0", of_ratio=True)
LANGCHAIN = "langchain-postgres chat history"
LANGGRAPH = "LangGraph AsyncPostgresStore"
PEER_APP = "memory_app.bench.peer_handlers:app"
SCHEMA = "peers_http"  # the handlers' schema (peer_handlers.SCHEMA)


def venv_python() -> Path:
    """The peers' venv's python (`AGENTMEMORY_PEERS_VENV`, else var/peers-venv), or BenchError
    naming the command that makes it."""
    venv = Path(
        os.environ.get("AGENTMEMORY_PEERS_VENV") or Path(settings.BASE_DIR) / "var" / "peers-venv"
    )
    python = venv / "bin" / "python"
    if not python.exists():
        raise BenchError(
            f"the peers' venv {venv} is missing: `make peers-venv` makes it (langchain-postgres "
            "pins pgvector below the product's, so the peers run in a venv of their own)"
        )
    return python


@dataclass
class Side:
    """One side's handle on a stored context: ours its id, the peers their session / namespace."""

    ours: int
    langchain: str
    langgraph: str


@dataclass
class Load:
    """One context's worth of the dataset's texts (distinct: the store's `embed` hands vectors
    over by text), their vectors and the queries drawn for it."""

    texts: list[str]
    vectors: np.ndarray
    queries: list[tuple[str, np.ndarray]]

    @classmethod
    def draw(cls, b: Bench, n: int, seed_offset: int) -> Load:
        gen = b.gen(seed_offset=seed_offset)
        topics = np.array([i % 40 for i in range(n + n // 10)])
        texts, vectors = gen.texts(topics), gen.vectors(topics)
        keep = list({t: i for i, t in enumerate(texts)}.values())[:n]
        queries = [gen.query(t % 40) for t in range(b.samples + 3)]
        return cls([texts[i] for i in keep], vectors[keep], queries)

    def role(self, i: int) -> str:
        return "user" if i % 2 == 0 else "assistant"


def run(b: Bench) -> None:
    from memory_app.bench.database import conninfo, server_info
    from memory_app.bench.measure import machine_lines

    python = venv_python()
    quick = b.quick
    small, large = (300, 600) if quick else (10_000, 50_000)
    batch = 100 if quick else 1_000
    info = conninfo()
    url = f"postgresql://{quote(info.get('user', ''))}:@/{info['dbname']}?host={info['host']}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "AGENTMEMORY_SEARCH_EXACT_THRESHOLD": str(settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD),
        "PEERS_HTTP_DIMS": str(b.data.sizes.dims),
    }
    loads = {small: Load.draw(b, small, 11), large: Load.draw(b, large, 12)}
    start = loadavg()
    apps, pythons = ["agentmemory_site.asgi:application", PEER_APP], [sys.executable, str(python)]
    with _served(apps, env, pythons) as (ours_served, peer_served):
        ours = _Http(ours_served.port, {"Authorization": f"Bearer {b.api_secret}"})
        peer = _Http(peer_served.port, {})
        peer.post("/setup", b"{}")
        b.log(f"  loading {small:,} and {large:,} messages with vectors into each side")
        sides = {n: _load(b, peer, load, batch) for n, load in loads.items()}
        held = _analysed(info)
        _reads(b, ours, peer, sides[small], loads[small])
        notes: list[str] = []
        for n in (small, large):
            notes += _semantic(b, ours, peer, sides[n], loads[n])
        _writes(b, ours, peer, loads[small], batch)
    server = server_info(info["dbname"])
    b.report.notes += [
        "",
        SECTION,
        "",
        *machine_lines(server["server"], server["pgvector"]),
        "",
        _note(small, large, batch),
        held,
        load_span(start),
        *notes,
    ]


def section(report, *, command: str, quick: bool) -> list[str]:
    """This area's section of the report, when it runs alone."""
    return sections.paired_section(
        report, SECTION, command=command, quick=quick, sides=("Ours", "Peer")
    )


def _load(b: Bench, peer: _Http, load: Load, batch: int) -> Side:
    """The texts and vectors into ours (API batches, then the indexer drained), into the store
    (its batch route, vectors through `embed`) and into both langchain histories (text only:
    they hold no vectors), so each side's tables and indexes hold every loaded message. Ours
    is loaded once per database: a later run finds the context full (the same seed draws the
    same texts) and reuses it; the peers' schema is made anew each run."""
    from memory_app.bench.peers import _drained

    n = len(load.texts)
    keys = {"bench": "peers_http", "n": n, "seed": b.data.sizes.seed}
    found = b.post(f"{API}/contexts", {"keys": keys}).json()
    if found["message_count"] not in (0, n):  # an earlier load broke off: a context of its own
        keys["at"] = str(time.time_ns())
        found = b.post(f"{API}/contexts", {"keys": keys}).json()
    fill_ours = found["message_count"] == 0
    side = Side(found["id"], str(uuid.uuid4()), f"c{n}-{time.time_ns()}")
    for start in range(0, n, batch):
        rows = range(start, min(start + batch, n))
        items = [{"role": load.role(i), "text": load.texts[i]} for i in rows]
        vectors = [load.vectors[i].tolist() for i in rows]
        vector_items = [{**x, "vector": v} for x, v in zip(items, vectors, strict=True)]
        if fill_ours:
            ours_items = [{**x, "vector_model": b.data.model} for x in vector_items]
            b.post_raw(
                f"{API}/contexts/{side.ours}/messages/batch",
                orjson.dumps({"messages": ours_items}).decode(),
            )
        peer.post(f"/lg/{side.langgraph}/batch", orjson.dumps({"messages": vector_items}))
        for table in ("plain", "fts"):
            peer.post(f"/lc/{table}/{side.langchain}/batch", orjson.dumps({"messages": items}))
    _drained()
    return side


def _analysed(info: dict) -> str:
    """Both sides' tables vacuumed and analysed, as autovacuum leaves them a minute after a
    load: our search sizes its walk by the HNSW index's row estimate, the planner picks both
    sides' plans by the statistics, and the side table our indexer has just emptied would
    otherwise be scanned whole, dead rows and all, by every search (with a parallel worker,
    by its stale estimate) until autovacuum reaches it."""
    with psycopg.connect(**info, autocommit=True) as conn:
        for table in (
            "memory_app_message",
            "memory_app_messagesearch",
            "memory_app_embedding",
            "memory_app_embeddingwaiting",
            f"{SCHEMA}.store",
            f"{SCHEMA}.store_vectors",
            f"{SCHEMA}.lc_history",
            f"{SCHEMA}.lc_history_fts",
        ):
            conn.execute(f"VACUUM ANALYZE {table}")
        counts = [
            conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608 - constant
            for table in (
                "memory_app_message",
                "memory_app_embedding",
                f"{SCHEMA}.store",
                f"{SCHEMA}.lc_history",
            )
        ]
    return (
        "- Held when measured (both sides' tables and indexes cover all of it): ours {:,} "
        "messages, {:,} of them with vectors (the base dataset's among them); LangGraph's "
        "store {:,} items; each langchain table {:,} messages.".format(*counts)
    )


def _row(b: Bench, measure: str, peer: str, pairs, *, warmup: int = 3) -> Paired:
    a, p, paired = time_pairs(pairs, warmup=warmup)
    note = paired_note(paired)
    b.report.add(Row(AREA, f"{measure} — vs {peer}", a, p, TARGET, note, paired), b.log)
    return paired


def _reads(b: Bench, ours: _Http, peer: _Http, side: Side, load: Load) -> None:
    n = len(load.texts)
    select = f"{API}/contexts/{side.ours}/select"
    cases = [
        (
            f"window k={WINDOW_K} of {n:,} messages",
            {"selector": "window", "k": WINDOW_K},
            "window",
            {"k": WINDOW_K},
        ),
        (
            f"token window {MAX_TOKENS} tokens (contiguous) of {n:,} messages",
            {"selector": "token_window", "max_tokens": MAX_TOKENS, "policy": "contiguous"},
            "token_window",
            {"max_tokens": MAX_TOKENS},
        ),
    ]
    for label, mine, action, theirs in cases:
        body, peer_body = orjson.dumps(mine), orjson.dumps(theirs)
        for name, path in (
            (LANGCHAIN, f"/lc/plain/{side.langchain}/{action}"),
            (LANGGRAPH, f"/lg/{side.langgraph}/{action}"),
        ):
            pairs = [
                (
                    lambda body=body: ours.post(select, body),
                    lambda path=path, body=peer_body: peer.post(path, body),
                )
            ] * b.samples
            _row(b, label, name, pairs)
    queries = [q for q, _ in load.queries]
    pairs = [
        (
            lambda q=q: ours.post(
                select,
                orjson.dumps({"selector": "search", "query": q, "k": SEARCH_K, "mode": "keyword"}),
            ),
            lambda q=q: peer.post(
                f"/lc/fts/{side.langchain}/keyword", orjson.dumps({"query": q, "k": SEARCH_K})
            ),
        )
        for q in queries
    ]
    _row(b, f"keyword search k={SEARCH_K} in {n:,} messages", f"{LANGCHAIN} + full text", pairs)


def _semantic(b: Bench, ours: _Http, peer: _Http, side: Side, load: Load) -> list[str]:
    """Semantic search k=10 on the context against LangGraph as it ships (pgvector's defaults)
    and, where ours walks its HNSW graph, against LangGraph with our walk's settings; each
    side's recall against the exact scan of the same vectors (computed here)."""
    n = len(load.texts)
    select = f"{API}/contexts/{side.ours}/select"
    mine = [
        orjson.dumps(
            {
                "selector": "search",
                "query": "",
                "k": SEARCH_K,
                "mode": "semantic",
                "model": b.data.model,
                "query_vector": v,
            },
            option=orjson.OPT_SERIALIZE_NUMPY,
        )
        for _, v in load.queries
    ]
    path, exact = f"/lg/{side.langgraph}/search", _exact(load)
    got_ours = [
        [item["message"]["text"] for item in orjson.loads(ours.post(select, body))["items"]]
        for body in mine
    ]
    lines = [
        f"- Semantic search in {n:,} messages, recall@{SEARCH_K} against the exact scan of the "
        f"same vectors: ours {_recall(got_ours, exact):.3f} ({_ef_note(b, n)})."
    ]
    variants = [("", {}, "pgvector's defaults: hnsw.ef_search 40, no iterative scan")]
    ours_hnsw = _our_hnsw(b, n)
    if ours_hnsw:
        named = ", ".join(f"{k} {v}" for k, v in ours_hnsw.items())
        variants.append((" at our walk's settings", ours_hnsw, f"our walk's settings: {named}"))
    for suffix, hnsw, said in variants:
        theirs = [
            orjson.dumps(
                {"vector": v, "k": SEARCH_K, "hnsw": hnsw}, option=orjson.OPT_SERIALIZE_NUMPY
            )
            for _, v in load.queries
        ]
        peer.post(path, theirs[0])  # its settings set before the clock
        pairs = [
            (lambda a=a: ours.post(select, a), lambda t=t: peer.post(path, t))
            for a, t in zip(mine, theirs, strict=True)
        ]
        _row(b, f"semantic search k={SEARCH_K} in {n:,} messages", LANGGRAPH + suffix, pairs)
        got = [[item["text"] for item in orjson.loads(peer.post(path, t))] for t in theirs]
        lines.append(
            f"  - LangGraph{suffix}: recall@{SEARCH_K} {_recall(got, exact):.3f} ({said}; its "
            "index m 16, ef_construction 64: pgvector's defaults)."
        )
    return lines


def _our_hnsw(b: Bench, n: int) -> dict[str, str]:
    """The pgvector settings our search sets for its walk on a context of `n` (none when it
    scans exactly)."""
    from memory_app.search import semantic

    if n < settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD:
        return {}
    _, params = semantic.hnsw_settings_sql(
        model=b.data.model, dims=b.data.sizes.dims, limit=SEARCH_K, share=n
    )
    values = dict(zip(params[::2], params[1::2], strict=True))
    return {
        name: values[f"hnsw.{name}"] for name in ("ef_search", "iterative_scan", "max_scan_tuples")
    }


def _exact(load: Load) -> list[set[str]]:
    vectors = load.vectors / np.linalg.norm(load.vectors, axis=1, keepdims=True)
    out = []
    for _, v in load.queries:
        scores = vectors @ (v / np.linalg.norm(v))
        out.append({load.texts[i] for i in np.argsort(-scores)[:SEARCH_K]})
    return out


def _recall(got: list[list[str]], exact: list[set[str]]) -> float:
    return float(np.mean([len(set(g) & e) / len(e) for g, e in zip(got, exact, strict=True)]))


def _ef_note(b: Bench, n: int) -> str:
    from memory_app.search import semantic

    if n < settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD:
        return "an exact scan: the context is below AGENTMEMORY_SEARCH_EXACT_THRESHOLD"
    store = semantic.store_size(b.data.model, b.data.sizes.dims)
    ef = semantic.ef_search_for(store, SEARCH_K, n)
    return (
        f"hnsw.ef_search {ef} for a store of ~{store:,} vectors, iterative scan relaxed_order; "
        f"its index m 16, ef_construction {settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION}"
    )


def _writes(b: Bench, ours: _Http, peer: _Http, load: Load, batch: int) -> None:
    """Single appends and batches into fresh contexts, sessions and namespaces; ours deleted
    after the rows, as the peers' schema is made anew on the next run: a reused database keeps
    both sides' tables and indexes the same size from run to run."""
    from memory_app.models import Context

    stamp = str(time.time_ns())
    written: list[int] = []

    def context(kind: str) -> int:
        keys = {"bench": "peers_http", "write": kind, "at": stamp}
        written.append(b.post(f"{API}/contexts", {"keys": keys}).json()["id"])
        return written[-1]

    try:
        _write_rows(b, ours, peer, load, batch, stamp, context)
    finally:
        Context.objects.filter(pk__in=written).delete()


def _write_rows(b: Bench, ours: _Http, peer: _Http, load: Load, batch: int, stamp: str, context):
    texts = load.texts
    singles = [orjson.dumps({"role": load.role(i), "text": texts[i]}) for i in range(b.samples + 3)]
    cid, session = context("single"), str(uuid.uuid4())
    for name, path in (
        (LANGCHAIN, f"/lc/plain/{session}/messages"),
        (LANGGRAPH, f"/lg/single-{stamp}/messages"),
    ):
        pairs = [
            (
                lambda body=body: ours.post(f"{API}/contexts/{cid}/messages", body),
                lambda body=body, path=path: peer.post(path, body),
            )
            for body in singles
        ]
        _row(b, "single append", name, pairs)
    items = [{"role": load.role(i), "text": texts[i]} for i in range(batch)]
    vectors = [load.vectors[i].tolist() for i in range(batch)]
    text_body = orjson.dumps({"messages": items})
    vector_items = [{**x, "vector": v} for x, v in zip(items, vectors, strict=True)]
    ours_vector_body = orjson.dumps(
        {"messages": [{**x, "vector_model": b.data.model} for x in vector_items]}
    )
    peer_vector_body = orjson.dumps({"messages": vector_items})
    rounds = max(3, b.samples // 5)
    cases = [
        (f"text batch of {batch:,}", LANGCHAIN, text_body, text_body, f"/lc/plain/{session}/batch"),
        (f"text batch of {batch:,}", LANGGRAPH, text_body, text_body, f"/lg/text-{stamp}/batch"),
        (
            f"batch of {batch:,} with {b.data.sizes.dims}-d vectors",
            LANGGRAPH,
            ours_vector_body,
            peer_vector_body,
            f"/lg/vectors-{stamp}/batch",
        ),
    ]
    for label, name, mine, theirs, path in cases:
        target = context(f"{label} {name}")
        pairs = [
            (
                lambda path=f"{API}/contexts/{target}/messages/batch", mine=mine: ours.post(
                    path, mine
                ),
                lambda theirs=theirs, path=path: peer.post(path, theirs),
            )
        ] * rounds
        _row(b, f"{label} (time per batch)", name, pairs, warmup=1)


def _note(small: int, large: int, batch: int) -> str:
    return (
        "Ours as `manage.py serve` runs it (gunicorn, one uvicorn worker, the site's ASGI app) "
        "against each peer behind a minimal ASGI handler (memory_app/bench/peer_handlers.py: "
        "orjson in and out, the library call, nothing else; its connections opened once per "
        "worker) on the same server with the same worker class, in the peers' own venv "
        "(`make peers-venv`), over one keep-alive HTTP connection per side from the same "
        "client on 127.0.0.1. Pairs of calls interleaved A B, B A, A B ...; the ratio is the "
        "median of the per-pair ratios (ours ÷ peer, the middle half and the extremes in the "
        "row); below 1 ours is faster. Both sides hold the same texts and vectors, their "
        "tables vacuumed and analysed after the load (as autovacuum leaves them). Settings: the "
        "window is "
        f"langchain's whole history read then its last k (it has no other read), LangGraph's "
        "`asearch` without a query (newest first); the token window counts each message's "
        "text with tiktoken's cl100k_base on every side (ours stored at write, the peers' at "
        "read: langchain's own `trim_messages`, strategy last; LangGraph newest first a page "
        "of 100 at a time); keyword search has no peer in either library, so its peer is "
        "PostgreSQL full text over langchain's table as a user would add it (a stored "
        "tsvector of the text, GIN index, any word matching, ordered by ts_rank_cd) against "
        "our BM25 ranking; single appends and batches are text only (langchain "
        "`aadd_messages`, LangGraph `aput`/`abatch` with index=False) except the vector batch "
        "(LangGraph's own index, the vectors handed over through its `embed`); ours writes "
        "a single append's full-text row in its transaction and leaves a batch's full text "
        "and HNSW inserts to the indexer (the served worker's thread, running meanwhile), "
        "the peers write no full text. Reads on a context of "
        f"{small:,} messages; semantic search on {small:,} and {large:,} (LangGraph namespaces "
        f"of the same sizes in one store); batches of {batch:,} into fresh contexts."
    )
