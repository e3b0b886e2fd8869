"""The HTTP side of `/mcp`: RFC 8259 JSON bodies only, and the ASGI app that puts the SDK's
Bearer check, the body limit and the database-fault answer around the SDK's transport."""

from __future__ import annotations

import json

from django.conf import settings
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
from mcp.server.fastmcp.server import StreamableHTTPASGIApp
from mcp.server.transport_security import RequestBodyLimitMiddleware
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from memory_app.json_values import depth_over, finite_float, reject_constant
from memory_app.mcp_server.app import PATH, server
from memory_app.mcp_server.keys import ApiKeyVerifier, RequireKey
from memory_app.mcp_server.unavailable import DatabaseUnavailableAnswer

# Deeper than any tool's arguments nest, and far below where Python's parsers run out of stack
# (10,000 levels end in RecursionError, which the SDK answers with a 500 and a broken stream).
MAX_DEPTH = 200
PARSE_ERROR = -32700


def body_problem(body: bytes) -> str | None:
    """Why a request body is not JSON the tools can take, or None.

    The SDK parses with `json.loads`, which turns NaN, Infinity and 1e400 into floats that end
    as null (or break a write), and answers invalid UTF-8 and deep nesting with a 500.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "the body is not UTF-8"
    try:
        value = json.loads(text, parse_constant=reject_constant, parse_float=finite_float)
    except RecursionError:
        return f"nested deeper than {MAX_DEPTH} levels"
    except ValueError as exc:  # json.JSONDecodeError too
        return str(exc)
    # Only a body with that many brackets (in strings or not) can nest that deep: one count in C.
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and depth_over(value, MAX_DEPTH):
        return f"nested deeper than {MAX_DEPTH} levels"
    return None


class StrictJsonBody:
    """Answers a POST whose body is not RFC 8259 JSON with a JSON-RPC parse error (400) before
    the SDK reads it; other bodies go on unchanged. Sits behind the SDK's body limit, so the
    whole body is already in memory and arrives as one message."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks, messages = [], []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        problem = body_problem(b"".join(chunks))
        if problem is not None:
            await _parse_error(send, problem)
            return

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _parse_error(send: Send, problem: str) -> None:
    error = {"code": PARSE_ERROR, "message": f"Parse error: {problem}"}
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- the ASGI app -------------------------------------------------------------------------------


def asgi_app() -> Starlette:
    """The ASGI app serving `/mcp`; run its lifespan (it runs the SDK's session manager).

    Built as the SDK's `streamable_http_app()` builds it with a token verifier, minus the OAuth
    metadata routes (operators issue keys; there is no authorization server to point to): the
    SDK's Bearer backend over our key verifier, then `RequireKey`, answer a missing key (401) or a
    wrong one (403) before the MCP transport sees a request; then a body over the limit is a 413
    and one that is not JSON a parse error, before the SDK parses it. Build it once per process: a
    session manager runs only once.
    """
    server.streamable_http_app()  # creates server.session_manager
    manager = server.session_manager
    return Starlette(
        routes=[
            Route(
                PATH,
                endpoint=RequireKey(
                    RequestBodyLimitMiddleware(
                        StrictJsonBody(StreamableHTTPASGIApp(manager)),
                        settings.MAX_REQUEST_BODY_BYTES,
                    )
                ),
            )
        ],
        middleware=[
            Middleware(DatabaseUnavailableAnswer),
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(ApiKeyVerifier())),
            Middleware(AuthContextMiddleware),
        ],
        lifespan=lambda app: manager.run(),
    )
