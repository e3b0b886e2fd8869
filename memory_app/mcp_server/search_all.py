"""The tool that searches everything the key may see: messages, step outputs, errors and tool
calls across contexts."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.fastmcp import Context as ToolContext
from pydantic import Field

from memory_app import auth
from memory_app.errors import Invalid
from memory_app.mcp_server.app import READ, run, server
from memory_app.queries.dashboard import MAX_QUERY_CHARS
from memory_app.queries.search_all import KINDS, BadQuery, SearchFilters, search_all
from memory_app.schemas.search_all import HitKind, page_out


def _search(key, *, query, kinds, keys, cursor, limit):
    try:
        found = search_all(
            filters=SearchFilters(q=query, kinds=kinds or [], keys_contain=keys),
            cursor=cursor,
            limit=limit,
            contexts=auth.visible_contexts(key) if key.context_keys else None,
        )
    except BadQuery as exc:
        raise Invalid(str(exc)) from None
    return page_out(found)


@server.tool(annotations=READ)
async def search_everything(
    ctx: ToolContext,
    query: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_QUERY_CHARS,
            description='web-search syntax: words (all of them), "a phrase", -excluded, or',
        ),
    ],
    kinds: Annotated[
        list[HitKind] | None,
        Field(description=f"any of {list(KINDS)} (output: step outputs); none: all"),
    ] = None,
    keys: Annotated[
        dict[str, Any] | None,
        Field(description="only contexts whose keys contain these"),
    ] = None,
    cursor: Annotated[
        str | None, Field(max_length=500, description="next_cursor of the previous page")
    ] = None,
    limit: Annotated[int, Field(ge=1, le=100, description="hits per page")] = 20,
) -> dict[str, Any]:
    """Full-text search over the messages, step outputs, errors and tool calls of every
    context the key may see, best first: each hit names its context, run and step or message,
    with a snippet and the offsets of the matched words. Needs the 'read' scope."""
    return await run(
        ctx, "read", _search, query=query, kinds=kinds, keys=keys, cursor=cursor, limit=limit
    )
