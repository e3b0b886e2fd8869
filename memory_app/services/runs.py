"""Writes of runs, their steps and tool calls: create, update, append steps, finish, reorder.

A step carrying a client id already stored returns the stored step when its content is the
same and raises `Conflict` naming the fields that differ when it is not."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from memory_app import pricing
from memory_app.db import copy_models, draw_ids, model_factory
from memory_app.errors import Conflict, Invalid, differences
from memory_app.models import (
    Context,
    Run,
    RunStatus,
    Step,
    ToolCall,
)
from memory_app.queries.lists import STEP_SPAN, run_span
from memory_app.queries.logbook import metadata_model, run_model, runs_costs
from memory_app.services.messages import MAX_BATCH

RUN_FIELDS = ("task", "system_prompt", "agent_name", "framework", "metadata")


def run_create(
    *,
    context: Context,
    client_id: str | None = None,
    task: str = "",
    system_prompt: str = "",
    agent_name: str = "",
    framework: str = "",
    metadata: dict | None = None,
    started_at=None,
) -> tuple[Run, bool]:
    data = {
        "task": task or "",
        "system_prompt": system_prompt or "",
        "agent_name": agent_name or "",
        "framework": framework or "",
        "metadata": metadata or {},
    }
    with transaction.atomic():
        if client_id:
            stored = Run.objects.filter(context=context, client_id=client_id).first()
            if stored is not None:
                diff = differences({k: getattr(stored, k) for k in RUN_FIELDS}, data)
                if diff:
                    raise Conflict(f"run {client_id!r} already exists with different content", diff)
                return stored, False
        try:
            with transaction.atomic():
                # No started_at unless the agent gives one: the server's clock at this call is not
                # when the agent started (an import arrives long after); run_finish fills it in.
                run = Run.objects.create(
                    context=context,
                    client_id=client_id or None,
                    started_at=started_at,
                    model_names=_with_models([], [metadata_model(data["metadata"])]),
                    **data,
                )
        except IntegrityError:
            # A concurrent writer created it first: answer as a repeat would.
            return run_create(context=context, client_id=client_id, started_at=started_at, **data)
        Context.objects.filter(pk=context.pk).update(
            run_count=F("run_count") + 1, last_activity_at=timezone.now()
        )
    return run, True


def run_update(
    *,
    run: Run,
    task: str | None = None,
    system_prompt: str | None = None,
    agent_name: str | None = None,
    started_at=None,
) -> Run:
    """Fill in a run's description once it is known (a trace tells the task only at its end)."""
    given = {
        "task": task,
        "system_prompt": system_prompt,
        "agent_name": agent_name,
        "started_at": started_at,
    }
    fields = {k: v for k, v in given.items() if v is not None and v != getattr(run, k)}
    if fields:
        Run.objects.filter(pk=run.pk, context_id=run.context_id).update(
            **fields, updated_at=timezone.now()
        )
        for name, value in fields.items():
            setattr(run, name, value)
    return run


STEP_FIELDS = (
    "kind",
    "step_number",
    "task",
    "plan",
    "model_input_messages",
    "model_output_message",
    "model_output",
    "code_action",
    "observations",
    "action_output",
    "error_type",
    "error_message",
    "start_time",
    "end_time",
    "duration",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "model",
    "cost",
    "is_final_answer",
    "payload",
)


TOOL_CALL_FIELDS = ("call_id", "name", "arguments", "output", "success", "duration")


def _step_data(item: dict[str, Any]) -> dict[str, Any]:
    data = {k: item.get(k) for k in STEP_FIELDS}
    data["is_final_answer"] = bool(item.get("is_final_answer"))
    data["model"] = data["model"] or ""
    if data["duration"] is None and data["start_time"] is not None and data["end_time"] is not None:
        data["duration"] = data["end_time"] - data["start_time"]
    if (
        data["total_tokens"] is None
        and data["input_tokens"] is not None
        and data["output_tokens"] is not None
    ):
        data["total_tokens"] = data["input_tokens"] + data["output_tokens"]
    return data


def _tool_call_data(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "call_id": item.get("call_id") or "",
        "name": item["name"],
        "arguments": item.get("arguments"),
        "output": item.get("output"),
        "success": item.get("success"),
        "duration": item.get("duration"),
    }


@dataclass
class StepsResult:
    steps: list[Step]
    created: list[bool] = field(default_factory=list)

    @property
    def any_created(self) -> bool:
        return any(self.created)


def steps_append(*, run: Run, items: list[dict[str, Any]]) -> StepsResult:
    """Append steps (each with its tool calls) to a run, all or nothing, positions in order."""
    if len(items) > MAX_BATCH:
        raise Invalid(f"at most {MAX_BATCH} steps per request, got {len(items)}")
    client_ids = [i.get("client_id") for i in items if i.get("client_id")]
    if len(set(client_ids)) != len(client_ids):
        raise Invalid("client ids repeat within the batch")
    with transaction.atomic():
        locked = (
            Run.objects.select_for_update()
            .only("id", "last_position", "context_id", "metadata", "model_names")
            .get(pk=run.pk, context_id=run.context_id)
        )
        existing = (
            {
                s.client_id: s
                for s in Step.objects.filter(
                    context_id=locked.context_id, run=run, client_id__in=client_ids
                )
            }
            if client_ids
            else {}
        )
        results: list[Step] = []
        created: list[bool] = []
        new_steps: list[tuple[Step, list[dict]]] = []
        for item in items:
            data = _step_data(item)
            calls = [_tool_call_data(c) for c in item.get("tool_calls") or []]
            cid = item.get("client_id")
            if cid and cid in existing:
                stored = existing[cid]
                diff = differences({k: getattr(stored, k) for k in STEP_FIELDS}, data)
                stored_calls = [
                    {k: getattr(tc, k) for k in TOOL_CALL_FIELDS}
                    for tc in stored.tool_calls.filter(context_id=run.context_id).order_by(
                        "position"
                    )
                ]
                if stored_calls != calls:
                    diff["tool_calls"] = {"stored": stored_calls, "sent": calls}
                if diff:
                    raise Conflict(f"step {cid!r} already exists with different content", diff)
                results.append(stored)
                created.append(False)
                continue
            step = Step(run_id=run.pk, context_id=locked.context_id, client_id=cid or None, **data)
            new_steps.append((step, calls))
            results.append(step)
            created.append(True)
        if new_steps:
            for offset, (step, _) in enumerate(new_steps, start=1):
                step.position = locked.last_position + offset
            Step.objects.bulk_create([s for s, _ in new_steps])
            ToolCall.objects.bulk_create(
                [
                    ToolCall(step=s, context_id=s.context_id, position=i, **c)
                    for s, calls in new_steps
                    for i, c in enumerate(calls, start=1)
                ]
            )
            errors = sum(1 for s, _ in new_steps if s.error_type)
            counters = {}
            added = _steps_cost(locked, [s for s, _ in new_steps])
            if added is not None:
                counters["cost"] = Coalesce(F("cost"), 0.0) + added
            # By id and context: on Citus the context routes the counters' UPDATE to one shard.
            Run.objects.filter(pk=run.pk, context_id=run.context_id).update(
                last_position=F("last_position") + len(new_steps),
                step_count=F("step_count") + len(new_steps),
                error_count=F("error_count") + errors,
                tool_call_count=F("tool_call_count") + sum(len(c) for _, c in new_steps),
                model_names=_with_models(locked.model_names, [s.model for s, _ in new_steps]),
                **counters,
            )
            Context.objects.filter(pk=locked.context_id).update(last_activity_at=timezone.now())
    return StepsResult(steps=results, created=created)


# What a step made from a trace may lack when it is written: a model call's messages, sent as
# log events, can arrive after its span (and the task is read from them).
FILLABLE_FIELDS = ("task", "model_input_messages", "model_output_message", "model_output")


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == []


def step_fill(*, run: Run, item: dict[str, Any]) -> bool:
    """Complete the run's step with the item's client id from content that came after it was
    written: its empty fields (`FILLABLE_FIELDS`) take the item's values, tool calls the item
    adds to a step that had none are appended, and stored calls without arguments take those of
    the same call in the item. Nothing written changes. Answers whether anything was filled."""
    with transaction.atomic():
        step = (
            Step.objects.select_for_update()
            .filter(context_id=run.context_id, run=run, client_id=item["client_id"])
            .first()
        )
        if step is None:
            return False
        data = _step_data(item)
        fields = [f for f in FILLABLE_FIELDS if _empty(getattr(step, f)) and not _empty(data[f])]
        for name in fields:
            setattr(step, name, data[name])
        if fields:
            step.save(update_fields=fields)
        calls = [_tool_call_data(c) for c in item.get("tool_calls") or []]
        stored = list(step.tool_calls.filter(context_id=step.context_id).order_by("position"))
        filled = bool(fields)
        if not stored and calls:
            ToolCall.objects.bulk_create(
                ToolCall(step=step, context_id=step.context_id, position=i, **c)
                for i, c in enumerate(calls, start=1)
            )
            Run.objects.filter(pk=run.pk, context_id=run.context_id).update(
                tool_call_count=F("tool_call_count") + len(calls)
            )
            return True
        for call, new in zip(stored, calls, strict=False):
            same = (call.call_id, call.name) == (new["call_id"], new["name"])
            if same and call.arguments is None and new["arguments"] is not None:
                call.arguments = new["arguments"]
                call.save(update_fields=["arguments"])
                filled = True
    return filled


def step_replace(*, run: Run, client_id: str, item: dict[str, Any]) -> Step | None:
    """Write a step's content and tool calls again, in its place, for a writer that derives the
    step from records that arrive out of order (LangGraph's pending writes); the run's counters
    are counted again. None when the run has no step with this client id."""
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run.pk, context_id=run.context_id).first()
        step = Step.objects.filter(context_id=run.context_id, run=run, client_id=client_id).first()
        if step is None:
            return None
        data = _step_data(item)
        Step.objects.filter(pk=step.pk, context_id=run.context_id).update(**data)
        ToolCall.objects.filter(context_id=run.context_id, step=step).delete()
        ToolCall.objects.bulk_create(
            [
                ToolCall(step=step, context_id=run.context_id, position=i, **_tool_call_data(c))
                for i, c in enumerate(item.get("tool_calls") or [], start=1)
            ]
        )
        runs_recount(runs=[(run.context_id, run.pk)])
    return step


MODEL_NAME_CHARS = 200
# Runs per UPDATE of a recount: its CASE has a branch per run, tried for each of its rows.
RECOUNT_BATCH = 500


def _with_models(known: list[str], more: list[str]) -> list[str]:
    """The distinct names of `known` and `more`, sorted (so every path that writes them, and a
    restore, gives the same list)."""
    return sorted({name[:MODEL_NAME_CHARS] for name in [*known, *more] if name})


def _steps_cost(run: Run, steps: list[Step]) -> float | None:
    """What `steps` cost (as `run_cost` counts it), or None when no step's cost is known."""
    fallback = run_model(run)
    costs = [
        pricing.step_cost(
            model=s.model or fallback,
            cost=s.cost,
            input_tokens=s.input_tokens,
            output_tokens=s.output_tokens,
        )
        for s in steps
    ]
    known = [c for c in costs if c is not None]
    return sum(known) if known else None


def runs_recount(*, runs: Iterable[tuple[int, int]]) -> None:
    """Count again, from their steps, what the runs table reads on each run (steps, errors, tool
    calls, models, cost): after steps were purged or restored from a backup. `runs`: (context,
    run) pairs; each context's runs are read and written together in that context, so every
    statement goes to its shard on Citus. Positions stay as they are (a purged step leaves its
    number unused)."""
    by_context: dict[int, set[int]] = {}
    for context_id, run_id in runs:
        by_context.setdefault(context_id, set()).add(run_id)
    for context_id, run_ids in sorted(by_context.items()):
        _context_runs_recount(context_id, run_ids)


def _context_runs_recount(context_id: int, run_ids: set[int]) -> None:
    """The runs of one context of `runs_recount`: each count one read grouped by run, and one
    update of them all."""
    runs = list(
        Run.objects.filter(context_id=context_id, pk__in=run_ids)
        .only("id", "context_id", "metadata")
        .order_by("pk")
    )
    if not runs:
        return
    steps = Step.objects.filter(context_id=context_id, run_id__in=[r.pk for r in runs]).order_by()
    counts = {
        row["run_id"]: row
        for row in steps.values("run_id").annotate(
            n=Count("pk"),
            errors=Count("pk", filter=Q(error_type__isnull=False) & ~Q(error_type="")),
        )
    }
    models: dict[int, list[str]] = {}
    for run_id, model in steps.exclude(model="").values_list("run_id", "model").distinct():
        models.setdefault(run_id, []).append(model)
    # The tool calls' join names the steps' context too: on Citus both tables then go to one
    # shard (a join on the step's id alone is a cross-shard one).
    calls = dict(
        ToolCall.objects.filter(
            context_id=context_id, step__context_id=context_id, step__run_id__in=run_ids
        )
        .order_by()
        .values("step__run_id")
        .annotate(n=Count("pk"))
        .values_list("step__run_id", "n")
    )
    costs = runs_costs(context_id=context_id, runs=runs)
    for run in runs:
        run.step_count = counts.get(run.pk, {}).get("n", 0)
        run.error_count = counts.get(run.pk, {}).get("errors", 0)
        run.tool_call_count = calls.get(run.pk, 0)
        run.model_names = _with_models([metadata_model(run.metadata)], models.get(run.pk, []))
        run.cost = costs[run.pk].total
    Run.objects.filter(context_id=context_id).bulk_update(
        runs,
        ["step_count", "error_count", "tool_call_count", "model_names", "cost"],
        batch_size=RECOUNT_BATCH,
    )


def run_finish(
    *,
    run: Run,
    status: str,
    final_answer: Any = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    total_tokens: int | None = None,
    finished_at=None,
) -> Run:
    """Mark a run finished; token totals default to the sum over its steps.

    Its start and end are the agent's when known: the times it gave, else the span of its steps'
    own timings, and only then the server's (creation, now): mixing the server's clock with the
    steps' would make an imported run last as long as its upload took, not as long as it ran.
    """
    if status not in RunStatus.values or status == RunStatus.RUNNING:
        raise Invalid(
            f"status must be one of {[s for s in RunStatus.values if s != RunStatus.RUNNING]}"
        )
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk, context_id=run.context_id)
        sums = run.steps.filter(context_id=run.context_id).aggregate(
            i=Sum("input_tokens"), o=Sum("output_tokens"), t=Sum("total_tokens"), **STEP_SPAN
        )
        if input_tokens is None and output_tokens is None and total_tokens is None:
            input_tokens, output_tokens, total_tokens = sums["i"], sums["o"], sums["t"]
        elif total_tokens is None and input_tokens is not None and output_tokens is not None:
            total_tokens = input_tokens + output_tokens
        run.status = status
        run.final_answer = final_answer
        run.input_tokens, run.output_tokens, run.total_tokens = (
            input_tokens,
            output_tokens,
            total_tokens,
        )
        run.started_at, run.finished_at = run_span(
            started_at=run.started_at,
            finished_at=finished_at,
            first_start=sums["first_start"],
            last_end=sums["last_end"],
            created_at=run.created_at,
        )
        run.duration = max(0.0, (run.finished_at - run.started_at).total_seconds())
        run.save()
    return run


def steps_order_by_start(*, run: Run) -> bool:
    """Renumber a run's steps by start time (steps without one keep their place after those
    with one), for writers whose steps arrive out of order (OpenTelemetry spans). True when
    positions changed. Positions stay 1..n; step ids, and the links to them, do not change."""
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run.pk, context_id=run.context_id).first()
        rows = list(
            Step.objects.filter(context_id=run.context_id, run=run).values_list(
                "pk", "position", "start_time"
            )
        )
        wanted = sorted(rows, key=lambda r: (r[2] is None, r[2] or 0.0, r[1]))
        if [r[0] for r in wanted] == [r[0] for r in sorted(rows, key=lambda r: r[1])]:
            return False
        # (run, position) is unique and checked row by row: move every step out of the way first.
        shift = max(r[1] for r in rows)
        Step.objects.filter(context_id=run.context_id, run=run).update(
            position=F("position") + shift
        )
        for position, (pk, _, _) in enumerate(wanted, start=1):
            Step.objects.filter(pk=pk, context_id=run.context_id).update(position=position)
    return True


@dataclass
class NewRun:
    """A run to create with its steps and, once known, its outcome (`runs_create_bulk`)."""

    client_id: str
    framework: str
    metadata: dict
    started_at: Any
    # In the order `steps_append` would number them; renumbered by start as
    # `steps_order_by_start` does.
    items: list[dict[str, Any]]
    # What `run_update` then `run_finish` would write: task, agent_name, system_prompt,
    # started_at, finished_at and the outcome (status, final_answer, token totals); None while
    # the run goes on.
    finish: dict[str, Any] | None = None
    # The run's id when drawn beforehand (rows written before it name it), else drawn here.
    pk: int | None = None


# Why long: one pass that writes what five per-run calls (create, append, renumber, describe,
# finish) would, for many runs in a few statements, so the counters are computed here as they are.
def runs_create_bulk(*, context: Context, new: list[NewRun]) -> list[Run]:
    """Create runs whose client ids are not taken, each with its steps, tool calls and outcome,
    in the caller's transaction: the rows `run_create`, `steps_append`, `steps_order_by_start`,
    `run_update` and `run_finish` write, in one COPY per table (OpenTelemetry traces mapped in
    bulk, many runs at a time)."""
    runs, steps = [], []
    now = timezone.now()
    new_run, new_step, new_call = _factories()
    for spec in new:
        run = new_run(
            context_id=context.pk,
            client_id=spec.client_id,
            framework=spec.framework or "",
            metadata=spec.metadata,
            started_at=spec.started_at,
            model_names=_with_models([], [metadata_model(spec.metadata)]),
        )
        run.pk = spec.pk
        ordered = sorted(
            enumerate(spec.items),
            key=lambda p: (p[1].get("start_time") is None, p[1].get("start_time") or 0.0, p[0]),
        )
        run_steps = []
        for position, (_, item) in enumerate(ordered, start=1):
            step = new_step(context_id=context.pk, client_id=item.get("client_id") or None)
            for name, value in _step_data(item).items():
                setattr(step, name, value)
            step.position = position
            step_calls = [_tool_call_data(c) for c in item.get("tool_calls") or []]
            run_steps.append((step, step_calls))
        run.last_position = run.step_count = len(run_steps)
        run.error_count = sum(1 for s, _ in run_steps if s.error_type)
        run.tool_call_count = sum(len(c) for _, c in run_steps)
        run.model_names = _with_models(run.model_names, [s.model for s, _ in run_steps])
        run.cost = _steps_cost(run, [s for s, _ in run_steps])
        if spec.finish is not None:
            _finish_new(run, [s for s, _ in run_steps], spec.finish, now)
        runs.append(run)
        steps.append(run_steps)
    if not runs:
        return runs
    all_steps = [s for run_steps in steps for s, _ in run_steps]
    calls = sum(len(c) for run_steps in steps for _, c in run_steps)
    # The three tables' ids drawn in one round trip (copy_models keeps ids already set).
    unnumbered = [run for run in runs if run.pk is None]
    run_ids, step_ids, call_ids = draw_ids(
        [(Run, len(unnumbered)), (Step, len(all_steps)), (ToolCall, calls)]
    )
    for run, pk in zip(unnumbered, run_ids, strict=True):
        run.pk = pk
    copy_models(runs)
    for run, run_steps in zip(runs, steps, strict=True):
        for step, _ in run_steps:
            step.run_id = run.pk
    for step, pk in zip(all_steps, step_ids, strict=True):
        step.pk = pk
    copy_models(all_steps)
    new_calls = [
        new_call(step_id=s.pk, context_id=context.pk, position=i, **c)
        for run_steps in steps
        for s, step_calls in run_steps
        for i, c in enumerate(step_calls, start=1)
    ]
    for call, pk in zip(new_calls, call_ids, strict=True):
        call.pk = pk
    copy_models(new_calls)
    Context.objects.filter(pk=context.pk).update(
        run_count=F("run_count") + len(runs), last_activity_at=now
    )
    return runs


@functools.cache
def _factories():
    """Builders of new runs, steps and tool calls for `runs_create_bulk` (`db.model_factory`),
    made once the app's signal receivers are connected."""
    return model_factory(Run), model_factory(Step), model_factory(ToolCall)


def _finish_new(run: Run, steps: list[Step], finish: dict[str, Any], now) -> None:
    """`run_update` then `run_finish` on a run not written yet, from its steps in memory."""
    for name in ("task", "agent_name", "system_prompt", "started_at"):
        if finish.get(name) is not None:
            setattr(run, name, finish[name])
    outcome = dict(finish["outcome"])
    tokens = ("input_tokens", "output_tokens", "total_tokens")
    if all(outcome.get(k) is None for k in tokens):
        for k in tokens:
            values = [getattr(s, k) for s in steps if getattr(s, k) is not None]
            outcome[k] = sum(values) if values else None
    elif outcome.get("total_tokens") is None and None not in (
        outcome.get("input_tokens"),
        outcome.get("output_tokens"),
    ):
        outcome["total_tokens"] = outcome["input_tokens"] + outcome["output_tokens"]
    run.status = outcome["status"]
    run.final_answer = outcome.get("final_answer")
    run.input_tokens, run.output_tokens, run.total_tokens = (outcome[k] for k in tokens)
    starts = [s.start_time for s in steps if s.start_time is not None]
    ends = [
        e
        for s in steps
        if (
            e := s.end_time
            if s.end_time is not None
            else (
                s.start_time + s.duration
                if s.start_time is not None and s.duration is not None
                else s.start_time
            )
        )
        is not None
    ]
    run.started_at, run.finished_at = run_span(
        started_at=run.started_at,
        finished_at=finish.get("finished_at"),
        first_start=min(starts) if starts else None,
        last_end=max(ends) if ends else None,
        created_at=now,
    )
    run.duration = max(0.0, (run.finished_at - run.started_at).total_seconds())
