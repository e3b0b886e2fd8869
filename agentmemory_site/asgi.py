"""The site as one ASGI app (what `manage.py serve` runs): `/mcp` is the MCP server (the `mcp`
SDK's Streamable HTTP transport, memory_app/mcp_server/); the Agent API's paths (`/api/`,
OTLP's `/v1/`) are Django on a chain of their own (agentmemory_site/api_handler.py: one thread
hop a request, no dashboard middleware); everything else is Django.

Django does not speak the ASGI lifespan protocol; the MCP app does (it starts its session
manager), so lifespan events go to it. A worker's lifespan starting also starts loading the
local embedding model on a thread of its own, so that the first semantic search does not pay
for it (after the fork: a forked copy of torch's threads would hang). Hosts are checked against
ALLOWED_HOSTS for `/mcp` as Django checks them for its own paths, and `/mcp` answers carry the
security headers Django's middleware gives every other answer.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentmemory_site.settings")
# Under ASGI Django runs each request's sync code on a thread of its own: connections come from
# a pool the threads share (settings.py), not one persistent connection per thread.
os.environ.setdefault("AGENTMEMORY_DB_POOL", "true")
django_app = get_asgi_application()  # sets Django up before the MCP module imports models

from agentmemory_site.embedded_postgres.base import start_embedded_database  # noqa: E402

# The process serving this app holds the embedded server (no DATABASE_URL), before gunicorn
# forks its workers under --preload; with DATABASE_URL this does nothing.
start_embedded_database()

from django.conf import settings  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402

from agentmemory_site.api_handler import ApiHandler  # noqa: E402
from memory_app import mcp_server  # noqa: E402
from memory_app.embeddings import providers  # noqa: E402
from memory_app.middleware import CONTENT_SECURITY_POLICY  # noqa: E402

mcp_app = mcp_server.asgi_app()
# More threads than the pool has connections: every request in flight reaches the pool, whose
# timeout turns a wait for a connection into a 503 with Retry-After; with no more threads than
# connections, the requests past them would queue for a thread without any bound instead.
API_THREADS = max(64, 4 * int(os.environ.get("AGENTMEMORY_DB_POOL_SIZE", "10")))
api_app = ApiHandler(settings.API_MIDDLEWARE, API_THREADS)


async def _bad_host(send) -> None:
    body = b'{"detail": "invalid Host header"}'
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _host_allowed(scope) -> bool:
    host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
    domain, _port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]  # as Django's own check does
    return bool(domain) and validate_host(domain, allowed)


def _security_headers() -> list[tuple[bytes, bytes]]:
    """What SecurityMiddleware, XFrameOptionsMiddleware and the CSP middleware add to Django's
    answers, for JSON answers: no sniffing into HTML, no framing, no referrer outside the site,
    and a policy under which nothing loads if a browser opens one. HSTS is the reverse proxy's
    or Django's on HTTPS pages; Cross-Origin-Opener-Policy concerns documents only."""
    headers = {"X-Frame-Options": settings.X_FRAME_OPTIONS}
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers["X-Content-Type-Options"] = "nosniff"
    if settings.SECURE_REFERRER_POLICY:
        headers["Referrer-Policy"] = settings.SECURE_REFERRER_POLICY
    headers["Content-Security-Policy"] = getattr(
        settings, "CONTENT_SECURITY_POLICY", CONTENT_SECURITY_POLICY
    )
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


SECURITY_HEADERS = _security_headers()


def _with_security_headers(send):
    async def send_with_headers(message):
        if message["type"] == "http.response.start":
            present = {k.lower() for k, _ in message.get("headers", [])}
            extra = [(k, v) for k, v in SECURITY_HEADERS if k not in present]
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return send_with_headers


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        providers.warm_up_in_background()
        await mcp_app(scope, receive, send)
    elif scope["type"] == "http" and (
        scope["path"] == mcp_server.PATH or scope["path"].startswith(mcp_server.PATH + "/")
    ):
        send = _with_security_headers(send)
        if not _host_allowed(scope):
            await _bad_host(send)
            return
        await mcp_app(scope, receive, send)
    elif scope["type"] == "http" and scope["path"].startswith(settings.API_PATH_PREFIXES):
        await api_app(scope, receive, send)
    else:
        await django_app(scope, receive, send)
