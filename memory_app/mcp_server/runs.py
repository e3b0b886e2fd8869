"""The tools over runs: list a context's runs, read one run with its steps."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.fastmcp import Context as ToolContext
from pydantic import Field

from memory_app import auth
from memory_app.mcp_server.app import READ, ContextIdArg, run, server
from memory_app.queries.lists import runs_list, steps_list
from memory_app.schemas.runs import RunDetailOut, RunPage


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
    return await run(ctx, "read", _list_runs, context_id=context_id, after=after, limit=limit)


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
    return await run(
        ctx, "read", _read_run, run_id=run_id, steps_after=steps_after, steps_limit=steps_limit
    )
