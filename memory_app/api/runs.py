"""Runs, steps and tool calls: create a run, append steps while it runs, finish it, read it."""

from __future__ import annotations

from django.http import HttpResponse
from ninja import Query, Router, Status
from ninja.errors import HttpError

from memory_app import auth
from memory_app.api.common import (
    WRITE_ERRORS,
    ContextId,
    RunId,
    StepId,
    context_for,
    not_found,
    require_scope,
    responses,
    run_for,
    step_for,
    superseded,
)
from memory_app.api.contexts import parse_keys_filter
from memory_app.queries.lists import (
    MAX_LIMIT,
    runs_list,
    step_with_tool_calls,
    steps_by_ids,
    steps_list,
)
from memory_app.queries.run_comparison import compare_runs
from memory_app.queries.runs_table import BadQuery, RunFilters, runs_table
from memory_app.queries.scores import attach_run_scores
from memory_app.schemas.fields import INT64_MAX
from memory_app.schemas.runs import (
    RunComparisonOut,
    RunDetailOut,
    RunFinishIn,
    RunIn,
    RunOut,
    RunPage,
    RunRowPage,
    RunTableQuery,
    StepOut,
    StepPage,
    StepsAppendOut,
    StepsIn,
)
from memory_app.services import runs as runs_service

router = Router(tags=["runs"])

STEPS_PAGE = 100


@router.post(
    "/contexts/{context_id}/runs",
    response=responses({200: RunOut, 201: RunOut}, WRITE_ERRORS),
    summary="Create a run (idempotent by client id)",
)
def run_create(request, context_id: ContextId, body: RunIn):
    require_scope(request, "write")
    context = context_for(request, context_id)
    run, created = runs_service.run_create(context=context, **body.model_dump())
    return Status(201 if created else 200, run)


@router.get("/contexts/{context_id}/runs", response=responses({200: RunPage}), summary="List runs")
def run_list(
    request,
    context_id: ContextId,
    after: int | None = Query(None, ge=0, le=INT64_MAX, description="cursor: last run id seen"),
    limit: int = Query(50, ge=1, le=MAX_LIMIT),
):
    require_scope(request, "read")
    context = context_for(request, context_id)
    return Status(200, runs_list(context=context, after=after, limit=limit))


# One parameter per filter of the dashboard's runs table, so a view reads the same in both.
@router.get(
    "/runs",
    response=responses({200: RunRowPage}),
    summary="List runs across the contexts the key may see",
)
def run_table(request, params: Query[RunTableQuery]):
    """Newest first by default; a key confined to some context keys sees only the runs of its
    contexts. The cursor is opaque: pass back `next_cursor` with the same filters."""
    key = require_scope(request, "read")
    try:
        filters = RunFilters(
            statuses=list(params.status),
            has_error=params.has_error,
            error=params.error,
            model=params.model,
            keys_contain=parse_keys_filter(params.keys),
            started_after=params.started_after,
            started_before=params.started_before,
            min_duration=params.min_duration,
            min_cost=params.min_cost,
            score=params.score,
            score_value=params.score_value,
            score_min=params.score_min,
            score_max=params.score_max,
            label=params.label,
        )
        found = runs_table(
            filters=filters,
            order=params.sort,
            cursor=params.cursor or None,
            limit=params.limit,
            # An unconfined key sees every context: no filter to join.
            contexts=auth.visible_contexts(key) if key.context_keys else None,
            full_task=True,
        )
    except BadQuery as exc:
        raise HttpError(422, str(exc)) from None
    page = {"items": attach_run_scores(found.runs), "has_more": found.next_cursor is not None}
    return Status(200, {**page, "next_cursor": found.next_cursor})


COMPARED_RUN = Query(..., ge=1, le=INT64_MAX, description="run id", examples=[3])


# Before `/runs/{run_id}`, which would take "compare" for a run id.
@router.get(
    "/runs/compare",
    response=responses({200: RunComparisonOut}),
    summary="Compare two runs: steps aligned, the first divergence, deltas",
)
def run_compare(request, a: int = COMPARED_RUN, b: int = COMPARED_RUN):
    """Run `a` is the baseline; deltas are b − a. Both runs must be visible to the key; they may
    belong to different contexts. Steps are paired by (kind, tool names) as a sequence
    alignment, so a step one run has alone leaves the rest paired."""
    require_scope(request, "read")
    first, second = run_for(request, a), run_for(request, b)
    found = compare_runs(first, second)
    answer = {
        "a": first,
        "b": second,
        "first_divergence": found.first,
        "tokens_delta": found.tokens_delta,
        "cost_delta": found.cost_delta,
        "duration_delta": found.duration_delta,
        "rows": found.rows,
    }
    return Status(200, answer)


# Each by-id route comes twice: under its context (routed to one shard on a distributed store),
# and by id alone, kept for old clients, whose answers name their successor.
def _run_get(request, run_id: int, steps_limit: int, context_id: int | None = None):
    require_scope(request, "read")
    run = run_for(request, run_id, context_id)
    return run, {"run": run, "steps": steps_list(run=run, limit=steps_limit)}


def _step_list(request, run_id: int, context_id: int | None, **page):
    require_scope(request, "read")
    run = run_for(request, run_id, context_id)
    return run, steps_list(run=run, **page)


def _steps_append(request, run_id: int, body: StepsIn, context_id: int | None = None):
    require_scope(request, "write")
    run = run_for(request, run_id, context_id)
    result = runs_service.steps_append(run=run, items=[s.to_item() for s in body.steps])
    steps = steps_by_ids(ids=[s.pk for s in result.steps], context_id=run.context_id)
    answer = {"steps": steps, "created": result.created}
    return run, Status(201 if result.any_created else 200, answer)


def _run_finish(request, run_id: int, body: RunFinishIn, context_id: int | None = None):
    require_scope(request, "write")
    run = run_for(request, run_id, context_id)
    return runs_service.run_finish(run=run, **body.model_dump())


def _step_get(request, step_id: int, context_id: int | None = None):
    require_scope(request, "read")
    step = step_for(request, step_id, context_id)
    full = step_with_tool_calls(step_id=step.pk, context_id=step.context_id)
    if full is None:
        raise not_found("step", step_id)
    return full


STEPS_AFTER = Query(None, ge=0, le=2**31 - 1, description="cursor: last position seen")
STEPS_LIMIT = Query(STEPS_PAGE, ge=1, le=MAX_LIMIT)
WITH_PRUNED = Query(True, description="include pruned steps (shown greyed)")


@router.get(
    "/contexts/{context_id}/runs/{run_id}",
    response=responses({200: RunDetailOut}),
    summary="Get a run with the first page of its steps",
)
def context_run_get(request, context_id: ContextId, run_id: RunId, steps_limit: int = STEPS_LIMIT):
    return Status(200, _run_get(request, run_id, steps_limit, context_id)[1])


@router.get(
    "/contexts/{context_id}/runs/{run_id}/steps",
    response=responses({200: StepPage}),
    summary="List a run's steps",
)
def context_step_list(
    request,
    context_id: ContextId,
    run_id: RunId,
    after: int | None = STEPS_AFTER,
    limit: int = STEPS_LIMIT,
    include_pruned: bool = WITH_PRUNED,
):
    page = {"after": after, "limit": limit, "include_pruned": include_pruned}
    return Status(200, _step_list(request, run_id, context_id, **page)[1])


@router.post(
    "/contexts/{context_id}/runs/{run_id}/steps",
    response=responses({200: StepsAppendOut, 201: StepsAppendOut}, WRITE_ERRORS),
    summary="Append steps (with their tool calls) to a run, all or nothing",
)
def context_steps_append(request, context_id: ContextId, run_id: RunId, body: StepsIn):
    """Positions follow the order sent. Steps with a known client id and the same content are
    returned as stored (200 when all are repeats); different content is a 409."""
    return _steps_append(request, run_id, body, context_id)[1]


@router.post(
    "/contexts/{context_id}/runs/{run_id}/finish",
    response=responses({200: RunOut}, WRITE_ERRORS),
    summary="Finish a run",
)
def context_run_finish(request, context_id: ContextId, run_id: RunId, body: RunFinishIn):
    """Sets status, final answer and token totals (summed over the steps when not given)."""
    return Status(200, _run_finish(request, run_id, body, context_id))


@router.get(
    "/contexts/{context_id}/steps/{step_id}",
    response=responses({200: StepOut}),
    summary="Get a step with its tool calls",
)
def context_step_get(request, context_id: ContextId, step_id: StepId):
    return Status(200, _step_get(request, step_id, context_id))


SUPERSEDED = " (by id alone; superseded by the route with its context)"


@router.get(
    "/runs/{run_id}",
    response=responses({200: RunDetailOut}),
    summary="Get a run with the first page of its steps" + SUPERSEDED,
    deprecated=True,
)
def run_get(request, run_id: RunId, response: HttpResponse, steps_limit: int = STEPS_LIMIT):
    run, answer = _run_get(request, run_id, steps_limit)
    superseded(response, run, "runs")
    return Status(200, answer)


@router.get(
    "/runs/{run_id}/steps",
    response=responses({200: StepPage}),
    summary="List a run's steps" + SUPERSEDED,
    deprecated=True,
)
def step_list(
    request,
    run_id: RunId,
    response: HttpResponse,
    after: int | None = STEPS_AFTER,
    limit: int = STEPS_LIMIT,
    include_pruned: bool = WITH_PRUNED,
):
    page = {"after": after, "limit": limit, "include_pruned": include_pruned}
    run, answer = _step_list(request, run_id, None, **page)
    superseded(response, run, "runs", "steps")
    return Status(200, answer)


@router.post(
    "/runs/{run_id}/steps",
    response=responses({200: StepsAppendOut, 201: StepsAppendOut}, WRITE_ERRORS),
    summary="Append steps to a run" + SUPERSEDED,
    deprecated=True,
)
def steps_append(request, run_id: RunId, body: StepsIn, response: HttpResponse):
    run, answer = _steps_append(request, run_id, body)
    superseded(response, run, "runs", "steps")
    return answer


@router.post(
    "/runs/{run_id}/finish",
    response=responses({200: RunOut}, WRITE_ERRORS),
    summary="Finish a run" + SUPERSEDED,
    deprecated=True,
)
def run_finish(request, run_id: RunId, body: RunFinishIn, response: HttpResponse):
    run = _run_finish(request, run_id, body)
    superseded(response, run, "runs", "finish")
    return Status(200, run)


@router.get(
    "/steps/{step_id}",
    response=responses({200: StepOut}),
    summary="Get a step with its tool calls" + SUPERSEDED,
    deprecated=True,
)
def step_get(request, step_id: StepId, response: HttpResponse):
    step = _step_get(request, step_id)
    superseded(response, step, "steps")
    return Status(200, step)
