"""Reads for a run's logbook in the dashboard: the step list around the current step, live steps,
one step in full, the run's model, cost and timeline, and the transcript after a step."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, connections, router
from django.db.models import Count, Q, Sum

from memory_app import pricing, transcripts
from memory_app.models import (
    Run,
    SpanQueue,
    Step,
    ToolCall,
)
from memory_app.queries.lists import STEP_SPAN

STEP_RADIUS = 15
TIMELINE_MAX_BARS = 200
LIVE_MAX_STEPS = 100
TRANSCRIPT_MAX_MESSAGES = 200
STEP_LIST_FIELDS = (
    "id",
    "run_id",
    "position",
    "kind",
    "step_number",
    "error_type",
    "duration",
    "start_time",
    "total_tokens",
    "is_final_answer",
    "pruned_at",
)


@dataclass
class StepNav:
    position: int
    last: int
    prev: int | None
    next: int | None
    prev_error: int | None
    next_error: int | None


def step_nav(*, run: Run, position: int) -> StepNav:
    errors = Step.objects.filter(context_id=run.context_id, run=run, error_type__isnull=False)
    next_error = (
        errors.filter(position__gt=position).order_by("position").values_list("position", flat=True)
    )
    prev_error = (
        errors.filter(position__lt=position)
        .order_by("-position")
        .values_list("position", flat=True)
    )
    last = run.last_position
    return StepNav(
        position=position,
        last=last,
        prev=position - 1 if position > 1 else None,
        next=position + 1 if position < last else None,
        prev_error=prev_error.first(),
        next_error=next_error.first(),
    )


@dataclass
class StepWindow:
    steps: list[Step]
    tool_names: dict[int, list[str]] = field(default_factory=dict)
    has_earlier: bool = False
    has_later: bool = False


def step_window(*, run: Run, position: int, radius: int = STEP_RADIUS) -> StepWindow:
    """The steps around `position` (a compact list: no payloads, no model input)."""
    low = max(1, position - radius)
    high = position + radius
    if low == 1:
        high = max(high, 2 * radius + 1)
    if high > run.last_position:
        low = max(1, min(low, run.last_position - 2 * radius))
    steps = list(
        Step.objects.filter(
            context_id=run.context_id, run=run, position__gte=low, position__lte=high
        )
        .only(*STEP_LIST_FIELDS)
        .order_by("position")
    )
    return StepWindow(
        steps=steps,
        tool_names=_tool_names(run, steps),
        has_earlier=low > 1,
        has_later=high < run.last_position,
    )


def steps_after(*, run: Run, after: int, limit: int = LIVE_MAX_STEPS) -> StepWindow:
    """Steps written since the page last saw position `after` (a live run's new entries), in
    order; `has_later` says more are waiting beyond `limit` (the next poll brings them)."""
    rows = list(
        Step.objects.filter(context_id=run.context_id, run=run, position__gt=after)
        .only(*STEP_LIST_FIELDS)
        .order_by("position")[: limit + 1]
    )
    steps = rows[:limit]
    return StepWindow(steps=steps, tool_names=_tool_names(run, steps), has_later=len(rows) > limit)


def spans_being_mapped(run: Run) -> bool:
    """Whether spans of the run's trace are acknowledged but still queued for mapping (an OTLP
    run's steps and outcome may not all be written yet)."""
    client_id = run.client_id or ""
    if not client_id.startswith("otel:"):
        return False
    return SpanQueue.objects.filter(
        context_id=run.context_id, error="", trace_ids__contains=[client_id[len("otel:") :]]
    ).exists()


def _tool_names(run: Run, steps: list[Step]) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for step_id, name in (
        ToolCall.objects.filter(context_id=run.context_id, step__in=[s.pk for s in steps])
        .order_by("step_id", "position")
        .values_list("step_id", "name")
    ):
        names.setdefault(step_id, []).append(name)
    return names


def step_detail(*, run: Run, position: int) -> Step | None:
    """The step with its tool calls; its model input and raw payload are left for later reads."""
    step = (
        Step.objects.filter(context_id=run.context_id, run=run, position=position)
        .defer("model_input_messages", "payload")
        .first()
    )
    if step is not None:
        step.tool_call_list = list(
            step.tool_calls.filter(context_id=step.context_id).order_by("position")
        )
        step.model_name = step.model or run_model(run)
        step.price = pricing.step_cost(
            model=step.model_name,
            cost=step.cost,
            input_tokens=step.input_tokens,
            output_tokens=step.output_tokens,
        )
    return step


def run_model(run: Run) -> str:
    """The run's model when its steps do not name theirs (`metadata.model`, as agents send it)."""
    return metadata_model(run.metadata)


def metadata_model(metadata: Any) -> str:
    """The model a run's metadata names (`metadata.model`), or ""."""
    model = metadata.get("model") if isinstance(metadata, dict) else None
    return model if isinstance(model, str) else ""


@dataclass
class ModelUse:
    model: str
    steps: int
    input_tokens: int
    output_tokens: int
    cost: float | None


@dataclass
class RunCost:
    """A run's cost over its steps: `total` is None when no step's cost is known; `partial` says
    some steps used tokens whose cost is unknown (a model with no price), so `total` is a floor."""

    models: list[ModelUse]
    total: float | None
    partial: bool


class _SumInStepOrder(Sum):
    """`sum(... ORDER BY position)`: a group's floats added in its steps' order, whatever order
    the plan reads them in, so one run summed alone (`run_cost`) and among others
    (`runs_costs`) comes to the same last digit."""

    template = '%(function)s(%(distinct)s%(expressions)s ORDER BY "memory_app_step"."position")'


def _cost_rows(steps):
    """`steps` grouped by model (and by whatever they were grouped by before): the sums the
    cost of a run is counted from."""
    unreported = Q(cost__isnull=True)
    return steps.annotate(
        steps=Count("id"),
        reported=_SumInStepOrder("cost"),
        i=Sum("input_tokens"),
        o=Sum("output_tokens"),
        ui=Sum("input_tokens", filter=unreported),
        uo=Sum("output_tokens", filter=unreported),
        unpriceable=Count(
            "id",
            filter=unreported
            & Q(input_tokens__isnull=True, output_tokens__isnull=True, total_tokens__gt=0),
        ),
    )


def run_cost(*, run: Run) -> RunCost:
    """One GROUP BY over the run's steps (by model): reported costs summed, the rest priced."""
    rows = _cost_rows(
        Step.objects.filter(context_id=run.context_id, run=run).values("model")
    ).order_by("model")
    return _cost_of(run, rows)


def runs_costs(*, context_id: int, runs: list[Run]) -> dict[int, RunCost]:
    """`run_cost` of each of the context's `runs`, in one GROUP BY over their steps (by run and
    model), each run's models summed in the order `run_cost` sums them."""
    rows = _cost_rows(
        Step.objects.filter(context_id=context_id, run_id__in=[r.pk for r in runs]).values(
            "run_id", "model"
        )
    ).order_by("run_id", "model")
    by_run: dict[int, list[dict]] = {}
    for row in rows:
        by_run.setdefault(row["run_id"], []).append(row)
    return {run.pk: _cost_of(run, by_run.get(run.pk, [])) for run in runs}


def _cost_of(run: Run, rows) -> RunCost:
    """A run's cost from its steps' sums by model (`_cost_rows`, in model order)."""
    fallback = run_model(run)
    models: dict[str, ModelUse] = {}
    total: float | None = None
    partial = False
    for r in rows:
        name = r["model"] or fallback
        cost = r["reported"]
        if r["ui"] is not None or r["uo"] is not None:
            priced = pricing.tokens_cost(model=name, input_tokens=r["ui"], output_tokens=r["uo"])
            if priced is None:
                partial = True
            else:
                cost = (cost or 0.0) + priced
        partial = partial or r["unpriceable"] > 0
        use = models.setdefault(name, ModelUse(name, 0, 0, 0, None))
        use.steps += r["steps"]
        use.input_tokens += r["i"] or 0
        use.output_tokens += r["o"] or 0
        if cost is not None:
            use.cost = (use.cost or 0.0) + cost
            total = (total or 0.0) + cost
    used = [m for m in models.values() if m.model or m.input_tokens or m.output_tokens]
    return RunCost(models=used, total=total, partial=partial)


@dataclass
class TimelineBar:
    start: int
    end: int
    duration: float
    tokens: int
    errors: int
    first_start: float | None = None
    last_end: float | None = None
    offset: float | None = None
    x: float = 0
    width: float = 0
    duration_height: float = 0
    duration_y: float = 0
    tokens_height: float = 0


@dataclass
class Timeline:
    """Steps on the run's own clock when they carry timings (x = offset from the first step's
    start, width = how long it took), else one slot per step (or per group of steps)."""

    bars: list[TimelineBar]
    width: int = 1000
    duration_track: int = 48
    tokens_track: int = 32
    total_duration: float = 0
    total_tokens: int = 0
    marker_x: float | None = None
    start: float | None = None  # Unix seconds of the first step's start (the run's time zero)
    span: float | None = None  # seconds from the first step's start to the last step's end
    ticks: list[float] = field(default_factory=list)

    @property
    def height(self) -> int:
        return self.duration_track + self.tokens_track + 6

    @property
    def tokens_base(self) -> int:
        return self.duration_track + 6

    @property
    def timed(self) -> bool:
        return self.start is not None


def run_timeline(
    *, run: Run, position: int | None = None, max_bars: int = TIMELINE_MAX_BARS
) -> Timeline:
    """Step timings and token use as bars, steps grouped so there are at most `max_bars`.

    One GROUP BY query whatever the run's length; the template draws it as inline SVG.
    """
    count = run.last_position
    timeline = Timeline(bars=[])
    if count == 0:
        return timeline
    per = math.ceil(count / max_bars)
    bars = _timeline_bars(run=run, per=per, slots=max_bars)
    timeline.bars = bars
    starts = [b.first_start for b in bars if b.first_start is not None]
    if starts:
        timeline.start = min(starts)
        timeline.span = max(b.last_end for b in bars if b.last_end is not None) - timeline.start
    slots = math.ceil(count / per)
    slot_width = timeline.width / slots
    max_duration = max((b.duration for b in bars), default=0) or 1
    max_tokens = max((b.tokens for b in bars), default=0) or 1
    scale = timeline.width / timeline.span if timeline.span else None
    previous_end = 0.0
    for bar in bars:
        if scale is not None:
            # On the clock: where the step began and how long it ran. An untimed step (the task)
            # sits where the previous one ended, as a sliver.
            if bar.first_start is not None:
                bar.offset = bar.first_start - timeline.start
                bar.x = round(bar.offset * scale, 2)
                bar.width = round(max((bar.last_end - bar.first_start) * scale, 1.5), 2)
                previous_end = bar.x + bar.width
            else:
                bar.x, bar.width = round(previous_end, 2), 1.5
        else:
            slot = (bar.start - 1) // per
            bar.x = round(slot * slot_width, 2)
            bar.width = round(max(slot_width * 0.8, 0.5), 2)
        # Tiny but non-zero values stay visible as a 1-unit sliver.
        bar.duration_height = round(
            max(bar.duration / max_duration * timeline.duration_track, 1 if bar.duration else 0), 2
        )
        bar.duration_y = round(timeline.duration_track - bar.duration_height, 2)
        bar.tokens_height = round(
            max(bar.tokens / max_tokens * timeline.tokens_track, 1 if bar.tokens else 0), 2
        )
        timeline.total_duration += bar.duration
        timeline.total_tokens += bar.tokens
    if scale is not None:
        timeline.ticks = [timeline.span * i / 4 for i in range(5)]
        bar = next((b for b in bars if b.start <= (position or 0) <= b.end), None)
        if bar is not None:
            timeline.marker_x = round(bar.x + bar.width / 2, 2)
    elif position is not None:
        timeline.marker_x = round(((position - 1) // per + 0.4) * slot_width, 2)
    return timeline


# One query, windowed: a step's group is its position bucket, split wherever the agent sat idle
# since every earlier step ended for as long as one bar is wide (1/max_bars of the run), so no
# bar covers a stretch of the picture when nothing ran; at most max_bars such splits.
_TIMELINE_SQL = """
WITH s AS (
    SELECT position, duration, total_tokens, error_type, start_time,
           COALESCE(end_time, start_time + duration, start_time) AS stop
    FROM {table} WHERE context_id = %(context)s AND run_id = %(run)s
), p AS (
    SELECT s.*, (position - 1) / %(per)s AS bucket,
           MAX(stop) OVER (ORDER BY position ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
               AS before_end,
           (MAX(stop) OVER () - MIN(start_time) OVER ()) / %(slots)s AS visible
    FROM s
), g AS (
    SELECT p.*, SUM(CASE WHEN start_time - before_end >= visible AND visible > 0 THEN 1 ELSE 0 END)
               OVER (ORDER BY position) AS island
    FROM p
)
SELECT MIN(position), MAX(position), SUM(duration), SUM(total_tokens), COUNT(error_type),
       MIN(start_time), MAX(stop)
FROM g GROUP BY bucket, island ORDER BY MIN(position)
"""


def _timeline_bars(*, run: Run, per: int, slots: int) -> list[TimelineBar]:
    """The run's steps in groups of `per` positions (a group split at an idle stretch), one bar
    per group, in order: summed durations, tokens and errors, and when the group's first step
    began and its last ended."""
    sql = _TIMELINE_SQL.format(table=connection.ops.quote_name(Step._meta.db_table))
    with connections[router.db_for_read(Step)].cursor() as cursor:
        cursor.execute(sql, {"context": run.context_id, "run": run.pk, "per": per, "slots": slots})
        rows = cursor.fetchall()
    return [
        TimelineBar(
            start=start,
            end=end,
            duration=busy or 0.0,
            tokens=tokens or 0,
            errors=errors,
            first_start=first_start,
            last_end=last_end,
        )
        for start, end, busy, tokens, errors, first_start, last_end in rows
    ]


# A running run's timeline is drawn one bar per step and laid out in the browser (app.js), so a
# poll appends the new steps' bars instead of redrawing the picture; past this many steps the
# page draws the grouped picture once and polls leave it be.
LIVE_TIMELINE_MAX_STEPS = 1000


@dataclass
class LiveBar:
    position: int
    offset: float | None  # seconds from the run's time zero; None: the step carries no timing
    end: float | None
    duration: float
    tokens: int
    error: bool


def timeline_totals(*, run: Run) -> Timeline:
    """The timeline's caption and axis (time zero, span, busy time, tokens), without bars."""
    row = Step.objects.filter(context_id=run.context_id, run=run).aggregate(
        busy=Sum("duration"), tokens=Sum("total_tokens"), **STEP_SPAN
    )
    timeline = Timeline(bars=[])
    timeline.total_duration = row["busy"] or 0.0
    timeline.total_tokens = row["tokens"] or 0
    if row["first_start"] is not None:
        timeline.start = row["first_start"]
        timeline.span = row["last_end"] - row["first_start"]
        timeline.ticks = [timeline.span * i / 4 for i in range(5)] if timeline.span else []
    return timeline


def live_bars(*, run: Run, start: float | None, after: int = 0, limit: int | None = None) -> list:
    """One bar per step after position `after`, offsets from `start` (the run's time zero)."""
    rows = (
        Step.objects.filter(context_id=run.context_id, run=run, position__gt=after)
        .order_by("position")
        .values_list("position", "start_time", "end_time", "duration", "total_tokens", "error_type")
    )
    if limit is not None:
        rows = rows[:limit]
    bars = []
    for position, begin, end, duration, tokens, error in rows:
        timed = begin is not None and start is not None
        if timed and end is None:
            end = begin + (duration or 0.0)
        bars.append(
            LiveBar(
                position=position,
                offset=begin - start if timed else None,
                end=end - start if timed else None,
                duration=duration or 0.0,
                tokens=tokens or 0,
                error=error is not None,
            )
        )
    return bars


def _flat_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b["text"]
            if isinstance(b, dict) and isinstance(b.get("text"), str)
            else json.dumps(b, default=str)
            for b in content
        )
    return json.dumps(content, default=str)


def transcript_upto(
    *, run: Run, position: int, summary_mode: bool = False
) -> tuple[list[dict[str, str]], int]:
    """The run's memory after step `position`, as the agent would read it back
    (`transcripts.run_messages`, smolagents' exact texts), flattened to role + text for display.
    Returns the last `TRANSCRIPT_MAX_MESSAGES` messages and how many earlier ones were left out.
    """
    chat = transcripts.run_messages(run=run, summary_mode=summary_mode, upto_position=position)
    messages = [{"role": m["role"], "text": _flat_text(m["content"])} for m in chat]
    omitted = max(0, len(messages) - TRANSCRIPT_MAX_MESSAGES)
    return messages[omitted:], omitted
