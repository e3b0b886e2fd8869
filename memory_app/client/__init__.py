"""Pure-Python client for the agentmemory API (no Django needed): `MemoryClient`, plus
framework adapters in `memory_app.client.smolagents` and `memory_app.client.agentscope`."""

from memory_app.client.client import (
    ApiError,
    ConflictError,
    MemoryClient,
    NotFoundError,
    ServerUnreachable,
)

__all__ = ["ApiError", "ConflictError", "MemoryClient", "NotFoundError", "ServerUnreachable"]
