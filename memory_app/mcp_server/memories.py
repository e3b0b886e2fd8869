"""The tools over long-term memories: record and retrieve."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.fastmcp import Context as ToolContext
from pydantic import Field

from memory_app.mcp_server.app import READ, WRITE, ContextIdArg, drop_none, run, server
from memory_app.schemas.fields import Id, JsonObject, Text
from memory_app.schemas.memories import (
    Keywords,
    Kind,
    MemoryRecordIn,
    MemoryRecordOut,
    MemoryRetrieveIn,
    record,
    retrieve_out,
)


def _record(key, **fields):
    results = record(key, MemoryRecordIn(**fields))
    return {
        "items": [
            {"memory": MemoryRecordOut.from_orm(r.record).dict(), "created": r.created}
            for r in results
        ]
    }


@server.tool(annotations=WRITE)
async def record_memory(
    ctx: ToolContext,
    content: Annotated[
        Text | None, Field(max_length=20_000, description="one fact to remember")
    ] = None,
    contents: Annotated[
        list[Text] | None, Field(max_length=200, description="several facts at once")
    ] = None,
    context_id: Annotated[Id | None, Field(description="remember for this context only")] = None,
    scope_keys: Annotated[
        JsonObject | None,
        Field(
            description='remember for every context whose keys contain these, e.g. {"user": "ada"}'
        ),
    ] = None,
    kind: Annotated[
        Kind | None, Field(description="fact (default), preference, task, tool")
    ] = None,
    keywords: Annotated[
        Keywords | None, Field(max_length=100, description="words to recall it by")
    ] = None,
    thinking: Annotated[Text | None, Field(description="why it is worth keeping")] = None,
    metadata: JsonObject | None = None,
    source_message_id: Annotated[Id | None, Field(description="the message it comes from")] = None,
) -> dict[str, Any]:
    """Remember long-term facts, for one context (`context_id`) or for every context sharing
    `scope_keys`. Content already remembered in that scope is returned as stored
    (`created: false`). Needs the 'write' scope."""
    return await run(
        ctx,
        "write",
        _record,
        **drop_none(
            content=content,
            contents=contents,
            context_id=context_id,
            scope_keys=scope_keys,
            kind=kind,
            keywords=keywords,
            thinking=thinking,
            metadata=metadata,
            source_message_id=source_message_id,
        ),
    )


def _retrieve(key, **fields):
    return retrieve_out(key, MemoryRetrieveIn(**fields))


@server.tool(annotations=READ)
async def retrieve_memories(
    ctx: ToolContext,
    context_id: ContextIdArg,
    query: Annotated[
        Text | None, Field(max_length=10_000, description="what to recall, in words")
    ] = None,
    keywords: Annotated[
        Keywords | None, Field(max_length=50, description="recall by keywords (up to limit each)")
    ] = None,
    limit: Annotated[int, Field(ge=1, le=100)] = 5,
    kinds: list[Kind] | None = None,
    include_archived: bool = False,
) -> dict[str, Any]:
    """Recall long-term memories a context can see (its own and those of key scopes its keys
    contain), by `query` and/or `keywords`, each with a score and reason. Needs the 'read'
    scope."""
    return await run(
        ctx,
        "read",
        _retrieve,
        **drop_none(
            context_id=context_id,
            query=query,
            keywords=keywords,
            limit=limit,
            kinds=kinds,
            include_archived=include_archived,
        ),
    )
