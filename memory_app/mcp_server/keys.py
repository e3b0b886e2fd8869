"""Who calls: the REST API's Bearer keys, verified for the SDK's Bearer middleware, the
ApiKey behind a tool call, and the answer to a request without a good key."""

from __future__ import annotations

import json

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.fastmcp import Context as ToolContext
from mcp.server.fastmcp.exceptions import ToolError
from pydantic import ConfigDict
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from memory_app import auth
from memory_app.models import ApiKey

# JSON-RPC's "Invalid Request": the request cannot be served as sent.
INVALID_REQUEST = -32600


class KeyAccess(AccessToken):
    """The SDK's access token, carrying the verified ApiKey row."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    api_key: ApiKey


class ApiKeyVerifier:
    """The SDK's TokenVerifier over `auth.apikey_verify` (same keys, revocation, last-used)."""

    async def verify_token(self, token: str) -> AccessToken | None:
        key = await sync_to_async(_verify, thread_sensitive=True)(token.strip())
        if key is None:
            return None
        return KeyAccess(token=token, client_id=key.actor, scopes=list(key.scopes), api_key=key)


def _verify(token: str) -> ApiKey | None:
    close_old_connections()
    try:
        return auth.apikey_verify(token)
    finally:
        close_old_connections()


def key_of(ctx: ToolContext) -> ApiKey:
    """The ApiKey of the HTTP request carrying this tool call."""
    request = ctx.request_context.request
    user = request.scope.get("user") if request is not None else None
    if not isinstance(user, AuthenticatedUser) or not isinstance(user.access_token, KeyAccess):
        raise ToolError("not authenticated")  # unreachable behind RequireAuthMiddleware
    return user.access_token.api_key


# --- refusing a request: no key (401) or a wrong one (403) ---------------------------------------

NO_KEY = (
    "this endpoint needs an agentmemory API key: send it as 'Authorization: Bearer am_...' "
    "(an operator creates one with `manage.py apikey create` or on the dashboard)"
)
WRONG_KEY = "the API key is wrong or revoked: ask the operator for a valid one"


class RequireKey:
    """Lets through a request whose Bearer key verified; refuses the others before any MCP
    message is read, in a way MCP clients report rather than start an OAuth flow over.

    MCP clients answer a 401 by discovering an OAuth authorization server, which this server
    does not have (operators issue keys): a client with no key gets that 401, without a
    `resource_metadata` pointer, and a message saying which header to send. A key that is sent
    but does not verify (unknown, malformed, revoked) is a 403 with `error="invalid_token"`:
    the credentials are there and refused, and clients show the status and message instead of
    opening a browser on an authorization server that does not exist.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if isinstance(scope.get("user"), AuthenticatedUser):
            await self.app(scope, receive, send)
            return
        sent = _bearer(Headers(scope=scope).get("authorization", ""))
        if sent:
            challenge = f'Bearer error="invalid_token", error_description="{WRONG_KEY}"'
            await _refuse(send, 403, challenge, WRONG_KEY)
        else:
            await _refuse(
                send, 401, f'Bearer realm="agentmemory", error_description="{NO_KEY}"', NO_KEY
            )


def _bearer(header: str) -> str:
    """The token of a Bearer Authorization header, '' when there is none."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def _refuse(send: Send, status: int, challenge: str, message: str) -> None:
    error = {"code": INVALID_REQUEST, "message": message}
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"www-authenticate", challenge.encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
