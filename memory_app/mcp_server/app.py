"""The FastMCP server the tools register on, and how a tool runs: scope check, the domain call
in Django's thread-sensitive executor between `close_old_connections()` calls (as a Django
request does), errors as clear tool errors, a database fault as a 503."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

import pydantic_core
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DataError, IntegrityError, close_old_connections
from mcp.server.fastmcp import Context as ToolContext
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import TextContent
from pydantic import Field, ValidationError
from pydantic_core import to_jsonable_python

from memory_app import auth, db, errors
from memory_app.mcp_server.keys import key_of
from memory_app.mcp_server.schema import callable_by_every_client, without_nulls
from memory_app.mcp_server.unavailable import DATABASE_FAULT
from memory_app.models import ApiKey

logger = logging.getLogger(__name__)

PATH = "/mcp"

INSTRUCTIONS = """\
agentmemory keeps an agent's memory: contexts (one conversation or task thread, named by keys
such as {"user": "ada", "chat": "42"}), their messages, runs of the agent with their steps and
tool calls, and long-term memories (facts, preferences) shared by contexts.
Start with open_context to get a context id (find_contexts finds existing ones without
creating any); append_message to write the conversation; select_context to choose what goes into
the next prompt; search_memory to find past messages; record_memory / retrieve_memories for
long-term facts, list_memories / correct_memory / delete_memory to look after them,
memory_status for what review decided;
list_runs / read_run to look at runs, score to judge a run, step or message. Leaving out an
optional parameter and passing null are the same."""


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


async def run(ctx: ToolContext, scope: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
    key = key_of(ctx)
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


def drop_none(**kwargs: Any) -> dict[str, Any]:
    """Arguments the caller gave: the schema's defaults apply to the others."""
    return {k: v for k, v in kwargs.items() if v is not None}


class Server(FastMCP):
    """FastMCP whose tool schemas every MCP client can call (see `schema`), which takes an
    explicit null for an optional parameter as that parameter left out, and whose text answer
    is compact JSON (the SDK indents it: a third more tokens in an agent's context for nothing).
    """

    def add_tool(self, fn: Callable[..., Any], name: str | None = None, **options: Any) -> None:
        super().add_tool(fn, name=name, **options)
        tool = self._tool_manager.get_tool(name or fn.__name__)
        tool.parameters = callable_by_every_client(tool.parameters)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is not None:
            arguments = without_nulls(tool.parameters, arguments)
        result = await super().call_tool(name, arguments)
        if isinstance(result, tuple) and isinstance(result[1], dict):
            structured = result[1]
            return [TextContent(type="text", text=compact_json(structured))], structured
        return result


def compact_json(value: Any) -> str:
    """The text of a tool's answer: its structured content as JSON without indentation."""
    return pydantic_core.to_json(value, fallback=str).decode()


server = Server(
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
