"""Pure-Python client for the agentmemory API (no Django needed): `MemoryClient`, plus
framework adapters in `memory_app.client.smolagents`, `memory_app.client.agentscope` and
`memory_app.client.langgraph` (LangGraph's store; needs the `langchain` extra)."""

from memory_app.client.client import (
    ApiError,
    ConflictError,
    MemoryClient,
    NotFoundError,
    ServerUnreachable,
)

__all__ = ["ApiError", "ConflictError", "MemoryClient", "NotFoundError", "ServerUnreachable"]
