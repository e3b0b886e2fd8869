"""Who calls: the REST API's Bearer keys, verified for the SDK's Bearer middleware, and the
ApiKey behind a tool call."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.fastmcp import Context as ToolContext
from mcp.server.fastmcp.exceptions import ToolError
from pydantic import ConfigDict

from memory_app import auth
from memory_app.models import ApiKey


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
