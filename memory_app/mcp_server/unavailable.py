"""The MCP endpoint's answer to a database fault: HTTP 503 with Retry-After and a JSON-RPC error,
where the SDK would answer a 500 (a fault while checking the key) or a 200 tool error (a fault
inside a tool), neither of which an MCP client's HTTP layer retries."""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.types import Receive, Scope, Send

from memory_app import db

logger = logging.getLogger(__name__)

# Set in the request's ASGI scope by a tool whose database call failed.
DATABASE_FAULT = "agentmemory.database_fault"
INTERNAL_ERROR = -32603


class DatabaseUnavailableAnswer:
    """A database fault, while checking the key or inside a tool, answers HTTP 503 with
    Retry-After and a JSON-RPC error (same id) instead of a 500 or a 200 tool error: clients
    and their HTTP layers retry a 503. Outermost of the app's own middleware (inside
    Starlette's error middleware, which would answer the 500 first)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: list[dict] = []
        started = False

        async def checked_send(message) -> None:
            nonlocal started
            if not scope.get(DATABASE_FAULT):
                started = True
                await send(message)
                return
            held.append(message)  # the SDK's answer: replaced once its body is complete
            if message["type"] == "http.response.body" and not message.get("more_body"):
                body = b"".join(m.get("body", b"") for m in held if "body" in m)
                await _unavailable(send, _rpc_id(body))

        try:
            await self.app(scope, receive, checked_send)
        except db.DATABASE_FAULTS as exc:
            if started:
                raise
            logger.warning("database unavailable (MCP): %s", str(exc).strip()[:200])
            await _unavailable(send, None)


def _rpc_id(body: bytes) -> Any:
    try:
        return json.loads(body).get("id")
    except (ValueError, AttributeError):
        return None


async def _unavailable(send: Send, rpc_id: Any) -> None:
    error = {"code": INTERNAL_ERROR, "message": db.UNAVAILABLE}
    body = json.dumps({"jsonrpc": "2.0", "id": rpc_id, "error": error}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"retry-after", b"%d" % db.RETRY_AFTER_SECONDS),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
