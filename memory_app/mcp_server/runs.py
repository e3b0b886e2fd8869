"""The tools over runs: list a context's runs, read one run with its steps, a page within a
token budget at a time."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.fastmcp import Context as ToolContext
from pydantic import Field
from pydantic_core import to_jsonable_python

from memory_app import auth
from memory_app.mcp_server.app import READ, ContextIdArg, compact_json, run, server
from memory_app.queries.lists import runs_list, steps_list
from memory_app.schemas.runs import RunDetailOut, RunPage
from memory_app.tokens import count_tokens

# A page of a run's steps an agent can read and still have room to think (a long run's steps
# all at once can fill a model's whole context).
DEFAULT_MAX_TOKENS = 8000


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
    limit: Annotated[int, Field(ge=1, le=200, description="runs per page")] = 20,
) -> dict[str, Any]:
    """The runs of a context (oldest first): status, task, final answer, token totals.
    Needs the 'read' scope."""
    return await run(ctx, "read", _list_runs, context_id=context_id, after=after, limit=limit)


def _within_budget(answer: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The answer with as many leading steps as keep its text (compact JSON) within
    `max_tokens`, counted with the server's tokenizer; the cursor then points after the last
    step kept. A first step larger than the budget comes alone: the caller still moves on."""
    steps = answer["steps"]
    items = steps["items"]
    # The frame with the widest cursor a page can carry: no count below it under-estimates.
    frame = {**answer, "steps": {"items": [], "has_more": True, "next_cursor": 2**31 - 1}}
    counts = count_tokens([compact_json(frame), *(compact_json(i) for i in items)])
    total, keep = counts[0], 0
    for count in counts[1:]:
        if keep and total + count + 1 > max_tokens:
            break
        total += count + 1  # and the comma between two steps
        keep += 1

    def page(n: int) -> dict[str, Any]:
        if n == len(items):
            return answer
        cut = {"items": items[:n], "has_more": True, "next_cursor": items[n - 1]["position"]}
        return {**answer, "steps": cut}

    # Tokens do not always add up across the joins: count the whole page and give back steps
    # while it is over.
    while keep > 1 and count_tokens([compact_json(page(keep))])[0] > max_tokens:
        keep -= 1
    return page(keep)


def _read_run(key, *, run_id, steps_after, steps_limit, max_tokens):
    run = auth.run_for_key(key, run_id)
    steps = steps_list(run=run, after=steps_after, limit=steps_limit)
    answer = to_jsonable_python(RunDetailOut.from_orm({"run": run, "steps": steps}).dict())
    return _within_budget(answer, max_tokens)


@server.tool(annotations=READ)
async def read_run(
    ctx: ToolContext,
    run_id: Annotated[int, Field(ge=1, le=2**63 - 1, description="the run's id")],
    steps_after: Annotated[
        int | None,
        Field(ge=0, le=2**31 - 1, description="steps.next_cursor of the previous answer"),
    ] = None,
    max_tokens: Annotated[
        int,
        Field(
            ge=1000,
            le=1_000_000,
            description="the most tokens one answer takes (the server's tokenizer, cl100k_base "
            "unless configured): fewer steps come, and steps.next_cursor gives the rest",
        ),
    ] = DEFAULT_MAX_TOKENS,
    steps_limit: Annotated[
        int, Field(ge=1, le=1000, description="the most steps one answer holds")
    ] = 100,
) -> dict[str, Any]:
    """A run with a page of its steps in order, each with its tool calls (name, arguments,
    output), observations, errors and token counts, as compact JSON within `max_tokens`. While
    `steps.has_more`, call again with `steps_after` = `steps.next_cursor`. Needs the 'read'
    scope."""
    return await run(
        ctx,
        "read",
        _read_run,
        run_id=run_id,
        steps_after=steps_after,
        steps_limit=steps_limit,
        max_tokens=max_tokens,
    )
