"""The tools over long-term memories: record, retrieve, list, status, correct and delete.

Deleting is archiving (hidden from recall, kept, restorable with the REST API's
`POST /memories/{id}/restore` or on the dashboard), with the 'write' scope an agent's key has;
erasing for good (`purge`) needs the 'admin' scope, as the REST API's `DELETE /memories/{id}`
does. Every record is found through the key's confinement: another tenant's record is "not found",
as an unknown id is."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from mcp.server.fastmcp import Context as ToolContext
from pydantic import Field

from memory_app import auth, errors
from memory_app.audit import Actor
from memory_app.mcp_server.app import READ, WRITE, ContextIdArg, drop_none, run, server
from memory_app.memories import MAX_TTL_SECONDS
from memory_app.queries.memories import memories_listed, memory_for_key
from memory_app.schemas.fields import INT64_MAX, Id, JsonObject, Text
from memory_app.schemas.memories import (
    Keywords,
    Kind,
    MemoryEditIn,
    MemoryRecordIn,
    MemoryRecordOut,
    MemoryRetrieveIn,
    record,
    recorded_out,
    retrieve_out,
    status_out,
)
from memory_app.services.memories import memory_change, memory_purge, memory_set_archived

MemoryIdArg = Annotated[int, Field(ge=1, le=INT64_MAX, description="the memory's id")]
NoteArg = Annotated[Text | None, Field(max_length=2000, description="why, kept in the audit trail")]


def _record(key, **fields):
    return recorded_out(record(key, MemoryRecordIn(**fields)))


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
    metadata: Annotated[
        JsonObject | None, Field(description="any JSON object, stored and returned as written")
    ] = None,
    source_message_id: Annotated[Id | None, Field(description="the message it comes from")] = None,
    ttl_seconds: Annotated[
        int | None,
        Field(ge=1, le=MAX_TTL_SECONDS, description="forget it this many seconds from now"),
    ] = None,
    expires_at: Annotated[
        datetime | None,
        Field(description="forget it after this ISO 8601 time (with a time zone)"),
    ] = None,
    pinned: Annotated[bool | None, Field(description="a pinned memory never expires")] = None,
    source_step_id: Annotated[Id | None, Field(description="the step it comes from")] = None,
    source_run_id: Annotated[Id | None, Field(description="the run it comes from")] = None,
) -> dict[str, Any]:
    """Remember long-term facts, for one context (`context_id`) or for every context sharing
    `scope_keys`. Content already remembered in that scope is returned as stored
    (`created: false`), and so is a live memory nearly identical to it (`near_copy`: its
    similarity). With a reviewed key a memory is `proposed`: not recalled until an operator
    approves it (see memory_status). With `ttl_seconds` or `expires_at` it is forgotten after
    that time (unless `pinned`). Needs the 'write' scope."""
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
            ttl_seconds=ttl_seconds,
            expires_at=expires_at,
            pinned=pinned,
            source_step_id=source_step_id,
            source_run_id=source_run_id,
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
    limit: Annotated[int, Field(ge=1, le=100, description="most memories (per keyword)")] = 5,
    kinds: Annotated[
        list[Kind] | None, Field(description="only these kinds (fact, preference, task, tool)")
    ] = None,
    include_archived: Annotated[
        bool, Field(description="also deleted (archived) memories")
    ] = False,
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


@server.tool(annotations=READ)
async def memory_status(
    ctx: ToolContext,
    memory_ids: Annotated[
        list[Id], Field(min_length=1, max_length=100, description="the memories' ids")
    ],
) -> dict[str, Any]:
    """The memories of `memory_ids` this key may see, each with its review `status`: proposed
    (waiting for an operator), live (recalled), rejected, or merged (`metadata.merged_into`
    names the memory it went into); `missing` lists the others. Needs the 'read' scope."""
    return await run(ctx, "read", status_out, ids=memory_ids)


def _memory_out(record) -> dict[str, Any]:
    return MemoryRecordOut.from_orm(record).dict()


def _list(key, *, context_id=None, scope_keys=None, include_archived=False, after=None, limit=20):
    context = auth.context_for_key(key, context_id) if context_id is not None else None
    if scope_keys is not None and context is not None:
        raise errors.Invalid("give context_id or scope_keys, not both")
    page = memories_listed(
        key=key,
        context=context,
        scope_keys=scope_keys,
        include_archived=include_archived,
        after=after,
        limit=limit,
    )
    items = [_memory_out(r) for r in page.items]
    return {"items": items, "has_more": page.has_more, "next_cursor": page.next_cursor}


@server.tool(annotations=READ)
async def list_memories(
    ctx: ToolContext,
    context_id: Annotated[
        Id | None, Field(description="the memories this context sees (its own and shared ones)")
    ] = None,
    scope_keys: Annotated[
        JsonObject | None,
        Field(
            description="memories of contexts and key scopes whose keys contain these, e.g. "
            '{"user": "ada"}'
        ),
    ] = None,
    include_archived: Annotated[
        bool, Field(description="also deleted (archived) memories")
    ] = False,
    after: Annotated[
        int | None, Field(ge=0, le=INT64_MAX, description="next_cursor of the previous page")
    ] = None,
    limit: Annotated[int, Field(ge=1, le=200, description="memories per page")] = 20,
) -> dict[str, Any]:
    """List long-term memories with their ids, oldest first, a page at a time (`next_cursor`
    while `has_more`): those a context sees, those about a key subset, or every one this API key
    may see. Needs the 'read' scope."""
    return await run(
        ctx,
        "read",
        _list,
        **drop_none(
            context_id=context_id,
            scope_keys=scope_keys,
            include_archived=include_archived,
            after=after,
            limit=limit,
        ),
    )


def _correct(key, *, memory_id, **fields):
    body = MemoryEditIn(**fields)
    record = memory_change(
        record=memory_for_key(key, memory_id),
        actor=Actor.for_key(key),
        expiry=body.expiry(),
        content=body.content,
        kind=body.kind,
        thinking=body.thinking,
        keywords=body.keywords,
        metadata=body.metadata,
        note=body.note or "",
    )
    return {"memory": _memory_out(record)}


@server.tool(annotations=WRITE)
async def correct_memory(
    ctx: ToolContext,
    memory_id: MemoryIdArg,
    content: Annotated[Text | None, Field(description="the corrected fact")] = None,
    kind: Annotated[Kind | None, Field(description="fact, preference, task or tool")] = None,
    keywords: Annotated[
        Keywords | None, Field(description="words to recall it by (replace the old ones)")
    ] = None,
    thinking: Annotated[Text | None, Field(description="why it is worth keeping")] = None,
    metadata: Annotated[
        JsonObject | None, Field(description="replaces the memory's metadata")
    ] = None,
    ttl_seconds: Annotated[
        int | None,
        Field(ge=1, le=MAX_TTL_SECONDS, description="forget it this many seconds from now"),
    ] = None,
    expires_at: Annotated[
        datetime | None,
        Field(description="forget it after this ISO 8601 time (with a time zone)"),
    ] = None,
    pinned: Annotated[bool | None, Field(description="a pinned memory never expires")] = None,
    note: NoteArg = None,
) -> dict[str, Any]:
    """Correct a long-term memory: the fields given replace the stored ones, the others stay.
    The previous version is kept in the audit trail. An error when another memory of the same
    scope already says the new content. Needs the 'write' scope."""
    return await run(
        ctx,
        "write",
        _correct,
        **drop_none(
            memory_id=memory_id,
            content=content,
            kind=kind,
            keywords=keywords,
            thinking=thinking,
            metadata=metadata,
            ttl_seconds=ttl_seconds,
            expires_at=expires_at,
            pinned=pinned,
            note=note,
        ),
    )


def _delete(key, *, memory_id, purge=False, note=None):
    record = memory_for_key(key, memory_id)
    if purge:
        auth.require_scope(key, "admin")
        event = memory_purge(record=record, actor=Actor.for_key(key), note=note or "")
        return {"id": memory_id, "deleted": "purged", "audit_event_id": event.pk}
    record = memory_set_archived(
        record=record, archived=True, actor=Actor.for_key(key), note=note or ""
    )
    return {"id": memory_id, "deleted": "archived", "memory": _memory_out(record)}


@server.tool(annotations={"readOnlyHint": False, "destructiveHint": True, "openWorldHint": False})
async def delete_memory(
    ctx: ToolContext,
    memory_id: MemoryIdArg,
    purge: Annotated[
        bool,
        Field(description="erase it for good (needs the 'admin' scope) instead of archiving it"),
    ] = False,
    note: NoteArg = None,
) -> dict[str, Any]:
    """Delete a long-term memory: archived (no longer recalled or listed, kept and restorable by
    an operator), or with `purge` erased for good with its vectors. Needs the 'write' scope, and
    'admin' to purge."""
    return await run(
        ctx, "write", _delete, **drop_none(memory_id=memory_id, purge=purge, note=note)
    )
