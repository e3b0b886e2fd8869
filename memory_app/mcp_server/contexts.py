"""The tools over contexts and their messages: open or find a context, append, select what goes
into the next prompt, search past messages."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.fastmcp import Context as ToolContext
from pydantic import Field

from memory_app import auth, errors
from memory_app.mcp_server.app import READ, WRITE, ContextIdArg, drop_none, run, server
from memory_app.queries.lists import context_by_keys, contexts_list
from memory_app.schemas.contexts import ContextOut, ContextPage
from memory_app.schemas.fields import INT64_MAX, Id, JsonObject, Role, Short, Text
from memory_app.schemas.messages import ContentBlock, MessageIn, message_out
from memory_app.schemas.selectors import SelectIn, select_out
from memory_app.search.messages import MAX_QUERY_CHARS, search_messages
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append


def _open_context(key, *, keys, title):
    auth.require_keys_allowed(key, keys)
    context, created = context_get_or_create(keys=keys, title=title)
    return {"context": ContextOut.from_orm(context).dict(), "created": created}


@server.tool(annotations=WRITE)
async def open_context(
    ctx: ToolContext,
    keys: Annotated[
        JsonObject,
        Field(
            min_length=1,
            description='what names the context, e.g. {"user": "ada", "chat": "42"}; the same '
            "keys (in any order) always give the same context",
        ),
    ],
    title: Annotated[Short(500) | None, Field(description="title when it is created")] = None,
) -> dict[str, Any]:
    """Get or create the context named by `keys` and return it with its id (the other tools take
    that id). `created` says whether it is new. Needs the 'write' scope."""
    return await run(ctx, "write", _open_context, keys=keys, title=title)


def _find_contexts(key, *, keys=None, exact=False, after=None, limit=20):
    within = auth.visible_contexts(key)
    if exact:
        if not keys:
            raise errors.Invalid("exact needs keys: the keys that name the context")
        context = context_by_keys(within=within, keys=keys)
        page = {
            "items": [] if context is None else [context],
            "has_more": False,
            "next_cursor": None,
        }
        return ContextPage.from_orm(page).dict()
    return ContextPage.from_orm(
        contexts_list(within=within, keys=keys, after=after, limit=limit)
    ).dict()


@server.tool(annotations=READ)
async def find_contexts(
    ctx: ToolContext,
    keys: Annotated[
        JsonObject | None,
        Field(
            description='contexts whose keys contain these, e.g. {"user": "ada"}; every context '
            "this API key may see when left out"
        ),
    ] = None,
    exact: Annotated[
        bool,
        Field(
            description="only the context named by exactly `keys` (the one open_context would "
            "return), or no item when there is none; nothing is created"
        ),
    ] = False,
    after: Annotated[
        int | None, Field(ge=0, le=INT64_MAX, description="next_cursor of the previous page")
    ] = None,
    limit: Annotated[int, Field(ge=1, le=200, description="contexts per page")] = 20,
) -> dict[str, Any]:
    """Find contexts and their ids without creating any: by exact keys, or every context whose
    keys contain `keys`, oldest first, a page at a time (`next_cursor` while `has_more`). Only
    contexts this API key may use are listed. Needs the 'read' scope."""
    return await run(
        ctx, "read", _find_contexts, **drop_none(keys=keys, exact=exact, after=after, limit=limit)
    )


def _append(key, **fields):
    context = auth.context_for_key(key, fields.pop("context_id"))
    result = messages_append(context=context, items=[MessageIn(**fields).to_new_message()])
    return {"message": message_out(result.messages[0]), "created": result.any_created}


@server.tool(annotations=WRITE)
async def append_message(
    ctx: ToolContext,
    context_id: ContextIdArg,
    role: Annotated[Role, Field(description="who speaks: user, assistant, system, tool, ...")],
    text: Annotated[Text, Field(description="the message's text")] = "",
    name: Annotated[Short(200), Field(description="speaker's name, if any")] = "",
    client_id: Annotated[
        Short(200) | None,
        Field(description="your own id for the message: appending it again changes nothing"),
    ] = None,
    content: Annotated[
        list[ContentBlock] | None,
        Field(max_length=1000, description="structured blocks (text, tool_use, tool_result, ...)"),
    ] = None,
    tags: Annotated[
        list[Short(200)] | None, Field(max_length=1000, description="labels to filter by later")
    ] = None,
    metadata: Annotated[
        JsonObject | None, Field(description="any JSON object, stored and returned as written")
    ] = None,
    run_id: Annotated[Id | None, Field(description="the run this message belongs to")] = None,
    step_id: Annotated[Id | None, Field(description="the step this message belongs to")] = None,
) -> dict[str, Any]:
    """Append one message to a context's conversation; it gets the next `seq`. With a
    `client_id` already stored: the stored message when the content is the same
    (`created: false`), an error naming the differences otherwise. Needs the 'write' scope."""
    return await run(
        ctx,
        "write",
        _append,
        **drop_none(
            context_id=context_id,
            role=role,
            text=text,
            name=name,
            client_id=client_id,
            content=content,
            tags=tags,
            metadata=metadata,
            run_id=run_id,
            step_id=step_id,
        ),
    )


def _select(key, *, context_id, window=None, **options):
    context = auth.context_for_key(key, context_id)
    body = SelectIn(**options, window=window)
    return select_out(context, body)


@server.tool(annotations=READ)
async def select_context(
    ctx: ToolContext,
    context_id: ContextIdArg,
    selector: Annotated[
        Literal["window", "token_window", "search", "composite"],
        Field(
            description="window: the last k messages; token_window: the newest messages under "
            "max_tokens; search: the k best matches for query; composite: a window plus search "
            "hits for the last user message"
        ),
    ],
    k: Annotated[
        int | None, Field(ge=1, le=1000, description="window size, or number of search hits")
    ] = None,
    max_tokens: Annotated[
        int | None, Field(ge=1, le=10_000_000, description="token_window budget (strictly below)")
    ] = None,
    policy: Annotated[
        Literal["contiguous", "skip"],
        Field(description="token_window: stop at the first message that does not fit, or skip it"),
    ] = "contiguous",
    semantics: Annotated[
        Literal["plain", "steamship"],
        Field(description="steamship: k counts user/assistant turns (Steamship's selectors)"),
    ] = "plain",
    tokenizer: Annotated[
        Short(50) | None, Field(description="tiktoken encoding; default cl100k_base")
    ] = None,
    query: Annotated[Text | None, Field(max_length=10_000, description="search: the query")] = None,
    mode: Annotated[
        Literal["auto", "keyword", "semantic", "hybrid"],
        Field(description="search: auto is hybrid when embeddings are on, keyword otherwise"),
    ] = "auto",
    window: Annotated[
        dict[str, Any] | None,
        Field(
            description='composite: the recent window, e.g. {"kind": "window", "k": 4} or '
            '{"kind": "token_window", "max_tokens": 2000}'
        ),
    ] = None,
    search_k: Annotated[int, Field(ge=1, le=100, description="composite: search hits")] = 3,
) -> dict[str, Any]:
    """Choose the messages for your next prompt from a context's live (not pruned) messages:
    returned oldest first, each with why it was chosen and its token count, plus totals.
    Needs the 'read' scope."""
    return await run(
        ctx,
        "read",
        _select,
        **drop_none(
            context_id=context_id,
            selector=selector,
            k=k,
            max_tokens=max_tokens,
            policy=policy,
            semantics=semantics,
            tokenizer=tokenizer,
            query=query,
            mode=mode,
            window=window,
            search_k=search_k,
        ),
    )


def _search(key, *, context_id, query, k, mode):
    context = auth.context_for_key(key, context_id)
    result = search_messages(context=context, query=query, k=k, mode=mode)
    return {
        "hits": [
            {"message": message_out(h.message), "rank": h.rank, "score": h.score, "why": h.explain}
            for h in result.hits
        ],
        "mode": result.mode,
        "notes": result.notes,
    }


@server.tool(annotations=READ)
async def search_memory(
    ctx: ToolContext,
    context_id: ContextIdArg,
    query: Annotated[
        Text,
        Field(
            min_length=1,
            max_length=MAX_QUERY_CHARS,
            description='words to find: any of them matches, "a quoted phrase" as a phrase, '
            "-word excludes; keyword hits are ranked by BM25",
        ),
    ],
    k: Annotated[int, Field(ge=1, le=100, description="how many hits")] = 5,
    mode: Annotated[
        Literal["auto", "keyword", "semantic", "hybrid"],
        Field(description="auto: hybrid when embeddings are on, keyword otherwise"),
    ] = "auto",
) -> dict[str, Any]:
    """Search a context's past messages (full-text, and by meaning when embeddings are on),
    best first, each with its rank, score and why it matched. Needs the 'read' scope."""
    return await run(ctx, "read", _search, context_id=context_id, query=query, k=k, mode=mode)
