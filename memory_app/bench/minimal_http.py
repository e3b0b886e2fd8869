"""The benchmark's minimal HTTP handler: an ASGI app doing a single append's writes and nothing
else, served by the same server as the product (gunicorn with uvicorn workers) so the
request-path row compares our work above the database with none.

`POST /contexts/{id}/messages` with `{"role": ..., "text": ...}`: in one transaction the
statements our append sends (the context's counters and seq, the message row, its full-text
row), on one psycopg connection per worker opened on first use; it answers the id and seq.
No authentication, no validation, no middleware: what a peer library wrapped in a few lines of
handler would do. It reads `DATABASE_URL` and does not import Django.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime

import orjson
import psycopg

COUNTERS = (
    "UPDATE memory_app_context SET last_seq = last_seq + 1, search_seq = CASE WHEN "
    "search_seq = last_seq THEN last_seq + 1 ELSE search_seq END, message_count = "
    "message_count + 1, token_count = token_count + 1, last_activity_at = %s WHERE id = %s "
    "RETURNING last_seq"
)
MESSAGE = (
    "INSERT INTO memory_app_message (context_id, seq, client_id, role, name, text, content, "
    "tags, metadata, key_order, run_id, step_id, token_count, tokenizer, source_timestamp, "
    "created_at, updated_at, pruned_at, pruned_by) VALUES (%s, %s, NULL, %s, '', %s, NULL, "
    "'{}', '{}', NULL, NULL, NULL, 1, 'cl100k_base', '', %s, %s, NULL, '') RETURNING id"
)
FULLTEXT = (
    "INSERT INTO memory_app_messagesearch (context_id, seq, search_vector) SELECT context_id, "
    "seq, memory_app_search_vector('english'::regconfig, text) FROM memory_app_message WHERE "
    "context_id = %s AND seq = %s AND pruned_at IS NULL ON CONFLICT (context_id, seq) DO UPDATE "
    "SET search_vector = EXCLUDED.search_vector, error = NULL"
)

_conn: psycopg.AsyncConnection | None = None
_lock = asyncio.Lock()


async def _connection() -> psycopg.AsyncConnection:
    global _conn
    if _conn is None:
        _conn = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"])
    return _conn


async def _body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send, status: int, payload: dict) -> None:
    body = orjson.dumps(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    parts = scope["path"].strip("/").split("/")
    if scope["method"] != "POST" or len(parts) != 3 or parts[0] != "contexts":
        await _answer(send, 404, {"detail": "not found"})
        return
    item = orjson.loads(await _body(receive))
    context_id, now = int(parts[1]), datetime.now(UTC)
    async with _lock:  # one connection per worker: its transactions one after another
        conn = await _connection()
        async with conn.transaction():
            seq = (await (await conn.execute(COUNTERS, [now, context_id])).fetchone())[0]
            cursor = await conn.execute(
                MESSAGE, [context_id, seq, item["role"], item["text"], now, now]
            )
            message_id = (await cursor.fetchone())[0]
            await conn.execute(FULLTEXT, [context_id, seq])
    await _answer(send, 201, {"id": message_id, "seq": seq})
