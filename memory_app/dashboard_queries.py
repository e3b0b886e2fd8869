"""Reads for the dashboard: bounded, index-friendly, never a whole context or a whole run.

Every function returns at most one page of rows (keyset pagination on indexed columns), so a
context of 100,000 messages or a run of 2,000 steps costs the same to show as a small one.
Bad input (a broken cursor, a malformed key chip) raises `BadQuery`, which views answer with 400.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.postgres.search import SearchQuery, SearchVector
from django.db.models import Count, F, Max, Min, Q, QuerySet, Sum

from memory_app import pricing, transcripts
from memory_app.models import (
    FTS_CONFIG,
    Context,
    Message,
    MessageRole,
    MessageSearch,
    Run,
    Step,
    ToolCall,
)
from memory_app.queries import STEP_SPAN

PAGE_SIZE = 50
RUNS_PAGE_SIZE = 20
STEP_RADIUS = 15
TIMELINE_MAX_BARS = 200
LIVE_MAX_STEPS = 100
TRANSCRIPT_MAX_MESSAGES = 200
MAX_QUERY_CHARS = 500


class BadQuery(ValueError):
    """A query parameter the dashboard cannot use; the message says which and why."""


# --- cursors ----------------------------------------------------------------------------------


def _encode_cursor(*parts: Any) -> str:
    raw = json.dumps(list(parts), separators=(",", ":"), default=str)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, size: int) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        parts = json.loads(base64.urlsafe_b64decode(padded.encode()).decode())
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise BadQuery("the page cursor is not valid; start again from the first page") from exc
    if not isinstance(parts, list) or len(parts) != size:
        raise BadQuery("the page cursor is not valid; start again from the first page")
    return parts


# --- contexts ---------------------------------------------------------------------------------

CONTEXT_ORDERS = {"recent": "most recent activity first", "oldest": "least recent activity first"}


def parse_key_chips(values: list[str]) -> list[tuple[str, str]]:
    """`["user=ada", "chat=42"]` -> `[("user", "ada"), ("chat", "42")]`."""
    chips = []
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            raise BadQuery(f"a key filter looks like key=value, got {value!r}")
        chips.append((key.strip(), val.strip()))
    return chips


def _key_match(key: str, value: str) -> Q:
    # Keys are arbitrary JSON and the dashboard writes non-string values as JSON (`true`, `42`,
    # `null`, `{"a": 1}`): "42" may be stored as a string or a number, "true" as a boolean.
    q = Q(keys__contains={key: value})
    try:
        parsed = json.loads(value)
    except ValueError:
        return q
    if not isinstance(parsed, str):
        q |= Q(keys__contains={key: parsed})
    return q


@dataclass
class ContextPage:
    contexts: list[Context]
    next_cursor: str | None


def contexts_page(
    *,
    chips: list[tuple[str, str]],
    text: str = "",
    order: str = "recent",
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
) -> ContextPage:
    if order not in CONTEXT_ORDERS:
        raise BadQuery(f"sort must be one of {sorted(CONTEXT_ORDERS)}")
    if len(text) > MAX_QUERY_CHARS:
        raise BadQuery(f"the search text is longer than {MAX_QUERY_CHARS} characters")
    qs = Context.objects.all()
    for key, value in chips:
        qs = qs.filter(_key_match(key, value))
    if text:
        qs = qs.filter(Q(title__icontains=text) | Q(keys__icontains=text))
    desc = order == "recent"
    if cursor:
        at, pk = _decode_cursor(cursor, 2)
        try:
            at = datetime.fromisoformat(at)
            pk = int(pk)
        except (TypeError, ValueError) as exc:
            raise BadQuery("the page cursor is not valid; start again from the first page") from exc
        if desc:
            qs = qs.filter(Q(last_activity_at__lt=at) | Q(last_activity_at=at, id__lt=pk))
        else:
            qs = qs.filter(Q(last_activity_at__gt=at) | Q(last_activity_at=at, id__gt=pk))
    qs = qs.order_by(*(("-last_activity_at", "-id") if desc else ("last_activity_at", "id")))
    rows = list(qs[: limit + 1])
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        next_cursor = _encode_cursor(last.last_activity_at.isoformat(), last.pk)
    with_message_counts(rows)
    return ContextPage(contexts=rows, next_cursor=next_cursor)


def with_message_counts(contexts: list[Context]) -> list[Context]:
    """Set `live_count` and `pruned_count` on each context. `message_count` counts every stored
    message, pruned ones included; pruned rows are counted on their own partial index (one query
    for the whole page, as cheap as the number of pruned messages)."""
    pruned = dict(
        Message.objects.filter(context__in=contexts, pruned_at__isnull=False)
        .values("context")
        .annotate(n=Count("id"))
        .values_list("context", "n")
    ) if contexts else {}
    for c in contexts:
        c.pruned_count = pruned.get(c.pk, 0)
        c.live_count = c.message_count - c.pruned_count
    return contexts


# --- chat history -----------------------------------------------------------------------------


@dataclass
class HistoryFilters:
    role: str = ""
    tag: str = ""
    text: str = ""
    show_pruned: bool = False

    def __post_init__(self):
        if self.role and self.role not in MessageRole.values:
            raise BadQuery(f"role must be one of {MessageRole.values}")
        if len(self.text) > MAX_QUERY_CHARS or len(self.tag) > 200:
            raise BadQuery("the filter text is too long")

    @property
    def active(self) -> bool:
        return bool(self.role or self.tag or self.text)


@dataclass
class HistoryWindow:
    messages: list[Message]
    has_earlier: bool = False
    has_later: bool = False

    @property
    def first_seq(self) -> int | None:
        return self.messages[0].seq if self.messages else None

    @property
    def last_seq(self) -> int | None:
        return self.messages[-1].seq if self.messages else None


def messages_for_history() -> QuerySet[Message]:
    """Messages as the history shows them: with the position of the step they belong to (for
    the link to it)."""
    return Message.objects.annotate(step_position=F("step__position"))


def _history_qs(context: Context, filters: HistoryFilters) -> QuerySet[Message]:
    qs = messages_for_history().filter(context=context)
    if not filters.show_pruned:
        qs = qs.filter(pruned_at__isnull=True)
    if filters.role:
        qs = qs.filter(role=filters.role)
    if filters.tag:
        qs = qs.filter(tags__contains=[filters.tag])
    if filters.text:
        query = SearchQuery(filters.text, config=FTS_CONFIG, search_type="websearch")
        # The stored vector (GIN) of live messages up to the context's search_seq; the text
        # itself after it, where the indexer may not have been yet, and of pruned messages,
        # which have no stored vector (memory_app.fulltext).
        indexed = MessageSearch.objects.filter(context_id=context.pk, search_vector=query).values("seq")
        parsed = Q(seq__gt=context.search_seq) | Q(pruned_at__isnull=False)
        qs = qs.alias(text_vector=SearchVector("text", config=FTS_CONFIG)).filter(
            Q(seq__in=indexed) | (parsed & Q(text_vector=query))
        )
    return qs


def history_window(
    *,
    context: Context,
    filters: HistoryFilters,
    before: int | None = None,
    after: int | None = None,
    around: int | None = None,
    limit: int = PAGE_SIZE,
) -> HistoryWindow:
    """One page of a context's chat history in chronological order.

    `before`: the `limit` messages just before that seq (default: the latest ones);
    `after`: the `limit` just after it; `around`: a window centred on it (jump to a seq).
    """
    qs = _history_qs(context, filters)
    if around is not None:
        half = limit // 2
        earlier = list(qs.filter(seq__lt=around).order_by("-seq")[: half + 1])
        later = list(qs.filter(seq__gte=around).order_by("seq")[: limit - half + 1])
        window = HistoryWindow(
            messages=list(reversed(earlier[:half])) + later[: limit - half],
            has_earlier=len(earlier) > half,
            has_later=len(later) > limit - half,
        )
        return window
    if after is not None:
        rows = list(qs.filter(seq__gt=after).order_by("seq")[: limit + 1])
        return HistoryWindow(messages=rows[:limit], has_later=len(rows) > limit, has_earlier=True)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    rows = list(qs.order_by("-seq")[: limit + 1])
    return HistoryWindow(
        messages=list(reversed(rows[:limit])),
        has_earlier=len(rows) > limit,
        has_later=before is not None,
    )


def context_tags(*, context: Context, limit: int = 30) -> list[str]:
    """A few tags used in the context's recent messages, for the filter's suggestions."""
    recent = (
        Message.objects.filter(context=context)
        .order_by("-seq")
        .values_list("tags", flat=True)[:500]
    )
    seen: dict[str, None] = {}
    for tags in recent:
        for tag in tags:
            seen.setdefault(tag, None)
            if len(seen) >= limit:
                return sorted(seen)
    return sorted(seen)


@dataclass
class RunPage:
    runs: list[Run]
    next_before: int | None


def runs_page(
    *, context: Context, before: int | None = None, limit: int = RUNS_PAGE_SIZE
) -> RunPage:
    qs = Run.objects.filter(context=context).defer("system_prompt", "final_answer", "metadata")
    if before is not None:
        qs = qs.filter(id__lt=before)
    rows = list(qs.order_by("-id")[: limit + 1])
    return RunPage(runs=rows[:limit], next_before=rows[limit - 1].pk if len(rows) > limit else None)


# --- run logbook ------------------------------------------------------------------------------

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
    errors = Step.objects.filter(run=run, error_type__isnull=False)
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
        Step.objects.filter(run=run, position__gte=low, position__lte=high)
        .only(*STEP_LIST_FIELDS)
        .order_by("position")
    )
    return StepWindow(
        steps=steps,
        tool_names=_tool_names(steps),
        has_earlier=low > 1,
        has_later=high < run.last_position,
    )


def steps_after(*, run: Run, after: int, limit: int = LIVE_MAX_STEPS) -> StepWindow:
    """Steps written since the page last saw position `after` (a live run's new entries), in
    order; `has_later` says more are waiting beyond `limit` (the next poll brings them)."""
    rows = list(
        Step.objects.filter(run=run, position__gt=after)
        .only(*STEP_LIST_FIELDS)
        .order_by("position")[: limit + 1]
    )
    steps = rows[:limit]
    return StepWindow(steps=steps, tool_names=_tool_names(steps), has_later=len(rows) > limit)


def _tool_names(steps: list[Step]) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for step_id, name in (
        ToolCall.objects.filter(step__in=[s.pk for s in steps])
        .order_by("step_id", "position")
        .values_list("step_id", "name")
    ):
        names.setdefault(step_id, []).append(name)
    return names


def step_detail(*, run: Run, position: int) -> Step | None:
    """The step with its tool calls; its model input and raw payload are left for later reads."""
    step = (
        Step.objects.filter(run=run, position=position)
        .defer("model_input_messages", "payload")
        .first()
    )
    if step is not None:
        step.tool_call_list = list(step.tool_calls.order_by("position"))
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
    model = (run.metadata or {}).get("model") if isinstance(run.metadata, dict) else None
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


def run_cost(*, run: Run) -> RunCost:
    """One GROUP BY over the run's steps (by model): reported costs summed, the rest priced."""
    unreported = Q(cost__isnull=True)
    rows = (
        Step.objects.filter(run=run)
        .values("model")
        .annotate(
            steps=Count("id"),
            reported=Sum("cost"),
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
        .order_by("model")
    )
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
    rows = (
        Step.objects.filter(run=run)
        .annotate(bucket=(F("position") - 1) / per)
        .values("bucket")
        .annotate(
            start=Min("position"),
            end=Max("position"),
            # Not named "duration": STEP_SPAN reads the column of that name.
            busy=Sum("duration"),
            tokens=Sum("total_tokens"),
            errors=Count("error_type"),
            **STEP_SPAN,
        )
        .order_by("bucket")
    )
    bars = [
        TimelineBar(
            start=r["start"],
            end=r["end"],
            duration=r["busy"] or 0.0,
            tokens=r["tokens"] or 0,
            errors=r["errors"],
            first_start=r["first_start"],
            last_end=r["last_end"],
        )
        for r in rows
    ]
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


def step_model_input(*, run: Run, position: int) -> list[dict[str, Any]] | None:
    """What the model saw at that step (smolagents `model_input_messages`), or None."""
    return (
        Step.objects.filter(run=run, position=position)
        .values_list("model_input_messages", flat=True)
        .first()
    )


# --- transcript -----------------------------------------------------------------------------------


def _flat_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b["text"] if isinstance(b, dict) and isinstance(b.get("text"), str) else json.dumps(b, default=str)
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
