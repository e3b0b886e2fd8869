"""The memory as Model Context Protocol tools: Streamable HTTP at `/mcp` (official `mcp` SDK).

Agents that speak MCP connect with the same Bearer API keys as the REST API, and get the same
scopes and confinement: no key (or a bad one) is a 401 before any MCP message is read; a tool the
key's scope does not allow answers a tool error naming the scope; ids outside the key's context
keys answer "not found", as unknown ids do.

The tools are thin: they validate their arguments with the REST API's input schemas and call the
domain functions the routers call (auth, services, search, selectors, memories, queries), so an
answer has the REST shape. Django's ORM is synchronous: each tool runs its body in Django's
thread-sensitive executor, between `close_old_connections()` calls as a Django request does.

The server is stateless with JSON responses: any worker process can answer any request (no
session to find), and there is nothing to stream.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DataError, IntegrityError, close_old_connections
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    BearerAuthBackend,
    RequireAuthMiddleware,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.fastmcp import Context as ToolContext
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.fastmcp.server import StreamableHTTPASGIApp
from mcp.server.transport_security import RequestBodyLimitMiddleware, TransportSecuritySettings
from pydantic import ConfigDict, Field, ValidationError
from pydantic_core import to_jsonable_python
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from memory_app import auth, db, errors
from memory_app.json_values import depth_over, finite_float, reject_constant
from memory_app.mcp_unavailable import DATABASE_FAULT, DatabaseUnavailableAnswer
from memory_app.models import ApiKey
from memory_app.queries.lists import runs_list, steps_list
from memory_app.schemas.contexts import ContextOut
from memory_app.schemas.fields import Id, JsonObject, Role, Short, Text
from memory_app.schemas.memories import (
    Keywords,
    Kind,
    MemoryRecordIn,
    MemoryRetrieveIn,
    record,
    recorded_out,
    retrieve_out,
    status_out,
)
from memory_app.schemas.messages import ContentBlock, MessageIn, message_out
from memory_app.schemas.runs import RunDetailOut, RunPage
from memory_app.schemas.selectors import SelectIn, select_out
from memory_app.search.messages import MAX_QUERY_CHARS, search_messages
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append

logger = logging.getLogger(__name__)

PATH = "/mcp"

INSTRUCTIONS = """\
agentmemory keeps an agent's memory: contexts (one conversation or task thread, named by keys
such as {"user": "ada", "chat": "42"}), their messages, runs of the agent with their steps and
tool calls, and long-term memories (facts, preferences) shared by contexts.
Start with open_context to get a context id; append_message to write the conversation;
select_context to choose what goes into the next prompt; search_memory to find past messages;
record_memory / retrieve_memories for long-term facts, memory_status for a proposal's review;
list_runs / read_run to look at runs."""


# --- authentication: the REST API's Bearer keys -------------------------------------------------


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


def _key(ctx: ToolContext) -> ApiKey:
    """The ApiKey of the HTTP request carrying this tool call."""
    request = ctx.request_context.request
    user = request.scope.get("user") if request is not None else None
    if not isinstance(user, AuthenticatedUser) or not isinstance(user.access_token, KeyAccess):
        raise ToolError("not authenticated")  # unreachable behind RequireAuthMiddleware
    return user.access_token.api_key


# --- running a tool: scope check, sync domain call, errors as clear tool errors ------------------


def _message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        parts.append(f"{where}: {error['msg']}")
    return "invalid arguments: " + "; ".join(parts)


def _call(key: ApiKey, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    close_old_connections()
    try:
        return to_jsonable_python(fn(key, **kwargs))
    except errors.Conflict as exc:
        raise ToolError(f"{exc} (differences: {exc.differences})") from exc
    except (errors.DomainError, errors.UnknownTokenizer) as exc:
        raise ToolError(str(exc)) from exc
    except ValidationError as exc:
        raise ToolError(_message(exc)) from exc
    except DataError as exc:
        logger.warning("DataError reached the MCP layer: %s", exc)
        raise ToolError("a value cannot be stored (out of range or invalid)") from exc
    except IntegrityError as exc:
        logger.warning("IntegrityError reached the MCP layer: %s", exc)
        raise ToolError("conflicting concurrent write; retry the call") from exc
    finally:
        close_old_connections()


async def _run(ctx: ToolContext, scope: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
    key = _key(ctx)
    if not auth.has_scope(key, scope):
        raise ToolError(f"this API key lacks the '{scope}' scope")
    try:
        return await sync_to_async(_call, thread_sensitive=True)(key, fn, kwargs)
    except db.DATABASE_FAULTS as exc:
        # The SDK answers any tool exception with a tool error (HTTP 200): marked on the
        # request, DatabaseUnavailableAnswer turns that answer into a 503 the client retries.
        logger.warning("database unavailable (MCP tool): %s", str(exc).strip()[:200])
        request = ctx.request_context.request
        if request is not None:
            request.scope[DATABASE_FAULT] = True
        raise ToolError(db.UNAVAILABLE) from exc


def _drop_none(**kwargs: Any) -> dict[str, Any]:
    """Arguments the caller gave: the schema's defaults apply to the others."""
    return {k: v for k, v in kwargs.items() if v is not None}


# --- the server and its tools -------------------------------------------------------------------

server = FastMCP(
    name="agentmemory",
    instructions=INSTRUCTIONS,
    streamable_http_path=PATH,
    stateless_http=True,
    json_response=True,
    # 413 above the limit every other request has (AGENTMEMORY_MAX_BODY_BYTES).
    max_request_body_size=settings.MAX_REQUEST_BODY_BYTES,
    # Hosts are checked against Django's ALLOWED_HOSTS in agentmemory_site.asgi, for the whole
    # site; a Bearer key (never a cookie) is what a rebinding page would lack anyway.
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
)

READ = {"readOnlyHint": True, "destructiveHint": False, "openWorldHint": False}
WRITE = {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False}

ContextIdArg = Annotated[int, Field(ge=1, le=2**63 - 1, description="the context's id")]


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
    return await _run(ctx, "write", _open_context, keys=keys, title=title)


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
    tags: Annotated[list[Short(200)] | None, Field(max_length=1000)] = None,
    metadata: JsonObject | None = None,
    run_id: Annotated[Id | None, Field(description="the run this message belongs to")] = None,
    step_id: Annotated[Id | None, Field(description="the step this message belongs to")] = None,
) -> dict[str, Any]:
    """Append one message to a context's conversation; it gets the next `seq`. With a
    `client_id` already stored: the stored message when the content is the same
    (`created: false`), an error naming the differences otherwise. Needs the 'write' scope."""
    return await _run(
        ctx,
        "write",
        _append,
        **_drop_none(
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
    return await _run(
        ctx,
        "read",
        _select,
        **_drop_none(
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
            description='words to find; in keyword mode a web-search query ("quoted phrase", -not)',
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
    return await _run(ctx, "read", _search, context_id=context_id, query=query, k=k, mode=mode)


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
    metadata: JsonObject | None = None,
    source_message_id: Annotated[Id | None, Field(description="the message it comes from")] = None,
) -> dict[str, Any]:
    """Remember long-term facts, for one context (`context_id`) or for every context sharing
    `scope_keys`. Content already remembered in that scope is returned as stored
    (`created: false`), so is a live memory nearly identical to it (`near_copy`). A reviewed
    key's memories are `proposed`, recalled once approved. Needs the 'write' scope."""
    return await _run(
        ctx,
        "write",
        _record,
        **_drop_none(
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
    return await _run(
        ctx,
        "read",
        _retrieve,
        **_drop_none(
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
    memory_ids: Annotated[list[Id], Field(min_length=1, max_length=100)],
) -> dict[str, Any]:
    """The memories of `memory_ids` this key may see with their review `status` (proposed, live,
    rejected, merged into `metadata.merged_into`); `missing` lists the others. 'read' scope."""
    return await _run(ctx, "read", status_out, ids=memory_ids)


def _list_runs(key, *, context_id, after, limit):
    context = auth.context_for_key(key, context_id)
    return RunPage.from_orm(runs_list(context=context, after=after, limit=limit)).dict()


@server.tool(annotations=READ)
async def list_runs(
    ctx: ToolContext,
    context_id: ContextIdArg,
    after: Annotated[
        int | None, Field(ge=0, le=2**63 - 1, description="next_cursor of the previous page")
    ] = None,
    limit: Annotated[int, Field(ge=1, le=200)] = 20,
) -> dict[str, Any]:
    """The runs of a context (oldest first): status, task, final answer, token totals.
    Needs the 'read' scope."""
    return await _run(ctx, "read", _list_runs, context_id=context_id, after=after, limit=limit)


def _read_run(key, *, run_id, steps_after, steps_limit):
    run = auth.run_for_key(key, run_id)
    steps = steps_list(run=run, after=steps_after, limit=steps_limit)
    return RunDetailOut.from_orm({"run": run, "steps": steps}).dict()


@server.tool(annotations=READ)
async def read_run(
    ctx: ToolContext,
    run_id: Annotated[int, Field(ge=1, le=2**63 - 1, description="the run's id")],
    steps_after: Annotated[
        int | None,
        Field(ge=0, le=2**31 - 1, description="steps.next_cursor of the previous answer"),
    ] = None,
    steps_limit: Annotated[int, Field(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """A run with its steps in order, each with its tool calls (name, arguments, output),
    observations, errors and token counts. Page on with `steps_after`. Needs the 'read'
    scope."""
    return await _run(
        ctx, "read", _read_run, run_id=run_id, steps_after=steps_after, steps_limit=steps_limit
    )


# --- request bodies: RFC 8259 JSON only ---------------------------------------------------------

# Deeper than any tool's arguments nest, and far below where Python's parsers run out of stack
# (10,000 levels end in RecursionError, which the SDK answers with a 500 and a broken stream).
MAX_DEPTH = 200
PARSE_ERROR = -32700


def body_problem(body: bytes) -> str | None:
    """Why a request body is not JSON the tools can take, or None.

    The SDK parses with `json.loads`, which turns NaN, Infinity and 1e400 into floats that end
    as null (or break a write), and answers invalid UTF-8 and deep nesting with a 500.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "the body is not UTF-8"
    try:
        value = json.loads(text, parse_constant=reject_constant, parse_float=finite_float)
    except RecursionError:
        return f"nested deeper than {MAX_DEPTH} levels"
    except ValueError as exc:  # json.JSONDecodeError too
        return str(exc)
    # Only a body with that many brackets (in strings or not) can nest that deep: one count in C.
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and depth_over(value, MAX_DEPTH):
        return f"nested deeper than {MAX_DEPTH} levels"
    return None


class StrictJsonBody:
    """Answers a POST whose body is not RFC 8259 JSON with a JSON-RPC parse error (400) before
    the SDK reads it; other bodies go on unchanged. Sits behind the SDK's body limit, so the
    whole body is already in memory and arrives as one message."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks, messages = [], []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        problem = body_problem(b"".join(chunks))
        if problem is not None:
            await _parse_error(send, problem)
            return

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _parse_error(send: Send, problem: str) -> None:
    error = {"code": PARSE_ERROR, "message": f"Parse error: {problem}"}
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- the ASGI app -------------------------------------------------------------------------------


def asgi_app() -> Starlette:
    """The ASGI app serving `/mcp`; run its lifespan (it runs the SDK's session manager).

    Built as the SDK's `streamable_http_app()` builds it with a token verifier, minus the OAuth
    metadata routes (operators issue keys; there is no authorization server to point to): the
    SDK's Bearer middleware over our key verifier answers 401 with `WWW-Authenticate` before the
    MCP transport sees a request; then a body over the limit is a 413 and one that is not JSON a
    parse error, before the SDK parses it. Build it once per process: a session manager runs only
    once.
    """
    server.streamable_http_app()  # creates server.session_manager
    manager = server.session_manager
    return Starlette(
        routes=[
            Route(
                PATH,
                endpoint=RequireAuthMiddleware(
                    RequestBodyLimitMiddleware(
                        StrictJsonBody(StreamableHTTPASGIApp(manager)),
                        settings.MAX_REQUEST_BODY_BYTES,
                    ),
                    required_scopes=[],
                ),
            )
        ],
        middleware=[
            Middleware(DatabaseUnavailableAnswer),
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(ApiKeyVerifier())),
            Middleware(AuthContextMiddleware),
        ],
        lifespan=lambda app: manager.run(),
    )
