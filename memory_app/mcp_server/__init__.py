"""The memory as Model Context Protocol tools: Streamable HTTP at `/mcp` (official `mcp` SDK).

Agents that speak MCP connect with the same Bearer API keys as the REST API, and get the same
scopes and confinement: no key is a 401 and a wrong one a 403 before any MCP message is read; a
tool the key's scope does not allow answers a tool error naming the scope; ids outside the key's
context keys answer "not found", as unknown ids do.

One module per job: `keys` (Bearer keys), `app` (the server and how a tool runs), `schema`
(input schemas every client can call), `contexts`, `memories`, `runs`, `scores` and
`search_all` (the tools), `transport` (JSON bodies, the ASGI app) and `unavailable` (a database
fault as a 503).

The tools are thin: they validate their arguments with the REST API's input schemas and call the
domain functions the routers call (auth, services, search, selectors, memories, queries), so an
answer has the REST shape. Django's ORM is synchronous: each tool runs its body in Django's
thread-sensitive executor, between `close_old_connections()` calls as a Django request does.

The server is stateless with JSON responses: any worker process can answer any request (no
session to find), and there is nothing to stream.
"""

from memory_app.mcp_server import (  # noqa: F401  (they register the tools)
    contexts,
    memories,
    runs,
    scores,
    search_all,
)
from memory_app.mcp_server.app import PATH, server
from memory_app.mcp_server.transport import asgi_app

__all__ = ["PATH", "asgi_app", "server"]
