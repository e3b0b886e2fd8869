"""The runs table: every run across contexts, filtered, sorted, one keyset page at a time.

A page reads runs only (with their context's keys), never their steps: what it lists and sorts
by is kept on the run by the write path (`memory_app.services.runs`). Each order is an index on
(value, id) (`RUN_STARTED`, `RUN_DURATION`, `RUN_COST` in `memory_app.models.runs`), and the
cursor is the last row's (value, id), so page 2,000 costs what page 1 does and rows written
meanwhile never shift a page. Only the error-text filter reads steps: the errors of the runs
being considered, through the partial index of erroneous steps.

Scores and labels filter by their run's own rows (`memory_app.models.scores`), each an
`EXISTS` on the run's context and id (`score_run_name_idx`, `label_name_run_idx`); the page's
scores and labels are read for its runs alone (`memory_app.queries.scores`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Substr

from memory_app.models import (
    RUN_COST,
    RUN_DURATION,
    RUN_STARTED,
    Context,
    Label,
    Run,
    RunStatus,
    Score,
    ScoreKind,
    Step,
)
from memory_app.queries.dashboard import (
    MAX_QUERY_CHARS,
    BadQuery,
    _decode_cursor,
    _encode_cursor,
    _key_match,
)

PAGE_SIZE = 50
TASK_CHARS = 160
# Orders: (label, expression, newest/largest first).
ORDERS: dict[str, tuple[str, Any, bool]] = {
    "started": ("newest first", RUN_STARTED, True),
    "oldest": ("oldest first", RUN_STARTED, False),
    "duration": ("longest first", RUN_DURATION, True),
    "cost": ("costliest first", RUN_COST, True),
}
FAILED = (RunStatus.FAILED, RunStatus.MAX_STEPS_ERROR)
ROW_FIELDS = (
    "id",
    "context_id",
    "context__keys",
    "context__title",
    "client_id",
    "agent_name",
    "framework",
    "status",
    "model_names",
    "started_at",
    "finished_at",
    "created_at",
    "duration",
    "step_count",
    "tool_call_count",
    "error_count",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cost",
)


@dataclass
class RunFilters:
    """What a runs table shows; empty fields filter nothing."""

    statuses: list[str] = field(default_factory=list)
    has_error: bool = False
    error: str = ""
    model: str = ""
    keys: list[tuple[str, str]] = field(default_factory=list)
    # Keys the run's context contains, as JSON (the Agent API's `keys`).
    keys_contain: dict[str, Any] | None = None
    started_after: datetime | None = None
    started_before: datetime | None = None
    min_duration: float | None = None
    min_cost: float | None = None
    # A score of this name on the run itself, with this value (true/false, a number, a category)
    # or within [score_min, score_max].
    score: str = ""
    score_value: str = ""
    score_min: float | None = None
    score_max: float | None = None
    label: str = ""
    # (author, score name): only runs without that author's score of that name (a review queue).
    unscored_by: tuple[str, str] | None = None

    def __post_init__(self):
        unknown = [s for s in self.statuses if s not in RunStatus.values]
        if unknown:
            raise BadQuery(f"status must be among {RunStatus.values}, got {unknown}")
        if len(self.error) > MAX_QUERY_CHARS or len(self.model) > 200:
            raise BadQuery("the filter text is too long")
        if len(self.score) > 100 or len(self.label) > 100 or len(self.score_value) > 200:
            raise BadQuery("a score or label name is at most 100 characters")
        if not self.score and (
            self.score_value or self.score_min is not None or self.score_max is not None
        ):
            raise BadQuery("a score's value or range needs the score's name")

    @property
    def active(self) -> bool:
        return any(
            (
                self.statuses,
                self.has_error,
                self.error,
                self.model,
                self.keys,
                self.keys_contain,
                self.started_after,
                self.started_before,
                self.min_duration is not None,
                self.min_cost is not None,
                self.score,
                self.label,
            )
        )


@dataclass
class RunsTablePage:
    runs: list[Run]
    next_cursor: str | None


def _filtered(filters: RunFilters, contexts: QuerySet[Context] | None) -> QuerySet[Run]:
    qs = Run.objects.all()
    if contexts is not None:
        qs = qs.filter(context__in=contexts.values("pk"))
    if filters.keys or filters.keys_contain:
        chosen = Context.objects.all()
        for key, value in filters.keys:
            chosen = chosen.filter(_key_match(key, value))
        if filters.keys_contain:
            chosen = chosen.filter(keys__contains=filters.keys_contain)
        qs = qs.filter(context__in=chosen.values("pk"))
    if filters.statuses:
        qs = qs.filter(status__in=filters.statuses)
    if filters.has_error:
        qs = qs.filter(error_count__gt=0)
    if filters.model:
        qs = qs.filter(model_names__contains=[filters.model])
    if filters.min_duration is not None:
        qs = qs.filter(duration__gte=filters.min_duration)
    if filters.min_cost is not None:
        qs = qs.filter(cost__gte=filters.min_cost)
    qs = qs.alias(started=RUN_STARTED)
    if filters.started_after is not None:
        qs = qs.filter(started__gte=filters.started_after)
    if filters.started_before is not None:
        qs = qs.filter(started__lt=filters.started_before)
    if filters.score:
        qs = qs.filter(Exists(_run_scores(filters.score).filter(_score_value(filters))))
    if filters.label:
        labels = Label.objects.filter(
            context_id=OuterRef("context_id"),
            run_id=OuterRef("pk"),
            step__isnull=True,
            message__isnull=True,
            name=filters.label,
        )
        qs = qs.filter(Exists(labels))
    if filters.unscored_by is not None:
        author, name = filters.unscored_by
        qs = qs.exclude(Exists(_run_scores(name).filter(author=author)))
    if filters.error:
        text = filters.error
        errors = Step.objects.filter(
            context_id=OuterRef("context_id"), run_id=OuterRef("pk"), error_type__isnull=False
        ).filter(Q(error_type__icontains=text) | Q(error_message__icontains=text))
        qs = qs.filter(error_count__gt=0).filter(Exists(errors))
    return qs


def _run_scores(name: str) -> QuerySet[Score]:
    """Scores of `name` on the outer query's run itself (not its steps or messages)."""
    return Score.objects.filter(
        context_id=OuterRef("context_id"),
        run_id=OuterRef("pk"),
        step__isnull=True,
        message__isnull=True,
        name=name,
    )


def _score_value(filters: RunFilters) -> Q:
    """The value a score filter asks for: `true`/`false` match booleans, a number matches
    numeric scores equal to it, any text matches the category; the range, numbers."""
    match = Q()
    text = filters.score_value.strip()
    if text:
        match = Q(category=text)
        if text.lower() in ("true", "false"):
            match |= Q(kind=ScoreKind.BOOLEAN, number=1.0 if text.lower() == "true" else 0.0)
        else:
            try:
                number = float(text)
            except ValueError:
                number = None
            if number is not None and number == number:  # not NaN
                match |= Q(kind=ScoreKind.NUMERIC, number=number)
    if filters.score_min is not None:
        match &= Q(number__gte=filters.score_min)
    if filters.score_max is not None:
        match &= Q(number__lte=filters.score_max)
    return match


def runs_count(*, filters: RunFilters, contexts: QuerySet[Context] | None = None) -> int:
    """How many runs the filters hold (a review queue's progress)."""
    return _filtered(filters, contexts).count()


def runs_table(
    *,
    filters: RunFilters,
    order: str = "started",
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
    contexts: QuerySet[Context] | None = None,
    full_task: bool = False,
) -> RunsTablePage:
    """One page of runs; `contexts` bounds them to those contexts (an API key's confinement).
    Each run's `task_head` is the start of its task; with `full_task`, `task` is all of it."""
    if order not in ORDERS:
        raise BadQuery(f"sort must be one of {sorted(ORDERS)}")
    _, expression, desc = ORDERS[order]
    qs = _filtered(filters, contexts).alias(sort_value=expression)
    if cursor:
        value, pk = _decode_cursor(cursor, 2)
        try:
            value = (
                datetime.fromisoformat(value) if order in ("started", "oldest") else float(value)
            )
            pk = int(pk)
        except (TypeError, ValueError) as exc:
            raise BadQuery("the page cursor is not valid; start again from the first page") from exc
        # The bound on the value alone lets the index scan start at the cursor.
        if desc:
            qs = qs.filter(sort_value__lte=value).filter(
                Q(sort_value__lt=value) | Q(sort_value=value, id__lt=pk)
            )
        else:
            qs = qs.filter(sort_value__gte=value).filter(
                Q(sort_value__gt=value) | Q(sort_value=value, id__gt=pk)
            )
    qs = qs.order_by(*(("-sort_value", "-id") if desc else ("sort_value", "id")))
    rows = list(
        qs.select_related("context")
        .only(*ROW_FIELDS, *(("task",) if full_task else ()))
        .annotate(task_head=Substr("task", 1, TASK_CHARS), sort_key=expression)[: limit + 1]
    )
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        value = last.sort_key
        next_cursor = _encode_cursor(
            value.isoformat() if isinstance(value, datetime) else value, last.pk
        )
    return RunsTablePage(runs=rows, next_cursor=next_cursor)


def runs_needing_attention(*, limit: int = 10) -> dict[str, list[Run]]:
    """The latest failed and running runs, for the home page."""
    return {
        "failed": runs_table(filters=RunFilters(statuses=list(FAILED)), limit=limit).runs,
        "running": runs_table(filters=RunFilters(statuses=[RunStatus.RUNNING]), limit=limit).runs,
    }
