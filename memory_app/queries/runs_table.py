"""The runs table: every run across contexts, filtered, sorted, one keyset page at a time.

A page reads runs only (with their context's keys), never their steps: what it lists and sorts
by is kept on the run by the write path (`memory_app.services.runs`). Each order is an index on
(value, id) (`RUN_STARTED`, `RUN_DURATION`, `RUN_COST` in `memory_app.models.runs`), and the
cursor is the last row's (value, id), so page 2,000 costs what page 1 does and rows written
meanwhile never shift a page.

Filters on other rows than the run's own (a score, a label, an error's text, "not yet scored by
me") are answered in two ways, because no estimate tells a common value from a rare one (an
error text's `ILIKE` is estimated at a few rows whatever it matches). A page first walks the next
`WALK` runs in its order and probes each for those rows (one index lookup a run, the walk stopping
at the page's last row); only when the walk finds too few does it read the matching rows first
(`EXISTS` on the run's context and id: `score_run_name_idx`, `label_name_run_idx`,
`step_run_errors_idx`) for the runs beyond it. A common value costs a short walk, a rare one a
short read of its few rows. The page's scores and labels are read for its runs alone
(`memory_app.queries.scores`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery
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
# Runs a page probes in its order before it reads the rarer matches of other rows' filters first.
WALK = 2000
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
    """Every run the filters hold."""
    return _matched(_on_run(filters, contexts), _elsewhere(filters))


def _on_run(filters: RunFilters, contexts: QuerySet[Context] | None) -> QuerySet[Run]:
    """The filters on the run's own columns and its context."""
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
    if filters.has_error or filters.error:
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
    return qs


def _elsewhere(filters: RunFilters) -> list[tuple[QuerySet, bool]]:
    """The filters on other rows: (those rows of the outer query's run, whether the run must have
    one or must have none)."""
    found: list[tuple[QuerySet, bool]] = []
    if filters.score:
        found.append((_run_scores(filters.score).filter(_score_value(filters)), True))
    if filters.label:
        labels = Label.objects.filter(
            context_id=OuterRef("context_id"),
            run_id=OuterRef("pk"),
            step__isnull=True,
            message__isnull=True,
            name=filters.label,
        )
        found.append((labels, True))
    if filters.unscored_by is not None:
        author, name = filters.unscored_by
        found.append((_run_scores(name).filter(author=author), False))
    if filters.error:
        text = filters.error
        errors = Step.objects.filter(
            context_id=OuterRef("context_id"), run_id=OuterRef("pk"), error_type__isnull=False
        ).filter(Q(error_type__icontains=text) | Q(error_message__icontains=text))
        found.append((errors, True))
    return found


def _matched(qs: QuerySet[Run], elsewhere: list[tuple[QuerySet, bool]]) -> QuerySet[Run]:
    """`qs` with the other rows' filters as `EXISTS`, which the planner may turn into joins that
    read the matching rows first."""
    for rows, wanted in elsewhere:
        qs = qs.filter(Exists(rows)) if wanted else qs.exclude(Exists(rows))
    return qs


def _probed(qs: QuerySet[Run], elsewhere: list[tuple[QuerySet, bool]]) -> QuerySet[Run]:
    """`qs` with the other rows' filters as a count per run: a scalar subquery stays a lookup
    run by run in the walk's order, where `EXISTS` may become a join over every matching row.
    (An aggregate rather than `LIMIT 1`, which Citus cannot push down in a correlated
    subquery.)"""
    for n, (rows, wanted) in enumerate(elsewhere):
        count = Subquery(rows.order_by().values("context_id").annotate(n=Count("pk")).values("n"))
        qs = qs.alias(**{f"elsewhere_{n}": count}).filter(**{f"elsewhere_{n}__isnull": not wanted})
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
    qs = _on_run(filters, contexts).alias(sort_value=expression)
    if cursor:
        value, pk = _decode_cursor(cursor, 2)
        try:
            value = (
                datetime.fromisoformat(value) if order in ("started", "oldest") else float(value)
            )
            pk = int(pk)
        except (TypeError, ValueError) as exc:
            raise BadQuery("the page cursor is not valid; start again from the first page") from exc
        qs = _beyond(qs, value, pk, desc)
    ordering = ("-sort_value", "-id") if desc else ("sort_value", "id")

    def read(page_qs: QuerySet[Run], n: int) -> list[Run]:
        return list(
            page_qs.order_by(*ordering)
            .select_related("context")
            .only(*ROW_FIELDS, *(("task",) if full_task else ()))
            .annotate(task_head=Substr("task", 1, TASK_CHARS), sort_key=expression)[:n]
        )

    elsewhere = _elsewhere(filters)
    if not elsewhere:
        rows = read(qs, limit + 1)
    else:
        # The walk's last run: the walk goes through it, the matching rows' read beyond it.
        edge = qs.annotate(sort_key=expression).order_by(*ordering)
        edge = edge.values_list("sort_key", "id")[WALK - 1 : WALK]
        edge = next(iter(edge), None)
        walked = _probed(qs, elsewhere)
        rows = read(walked if edge is None else _through(walked, *edge, desc), limit + 1)
        if edge is not None and len(rows) <= limit:
            rows += read(_beyond(_matched(qs, elsewhere), *edge, desc), limit + 1 - len(rows))
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1]
        value = last.sort_key
        next_cursor = _encode_cursor(
            value.isoformat() if isinstance(value, datetime) else value, last.pk
        )
    return RunsTablePage(runs=rows, next_cursor=next_cursor)


def _beyond(qs: QuerySet[Run], value: Any, pk: int, desc: bool) -> QuerySet[Run]:
    """The runs after (value, id) in the order."""
    return _side(qs, value, pk, below=desc, inclusive=False)


def _through(qs: QuerySet[Run], value: Any, pk: int, desc: bool) -> QuerySet[Run]:
    """The runs up to and including (value, id) in the order."""
    return _side(qs, value, pk, below=not desc, inclusive=True)


def _side(qs: QuerySet[Run], value: Any, pk: int, *, below: bool, inclusive: bool):
    """The runs whose (value, id) lies below (or above) this one, itself included or not; the
    bound on the value alone lets the index scan start there."""
    strict = "lt" if below else "gt"
    tie = f"{strict}e" if inclusive else strict
    return qs.filter(**{f"sort_value__{strict}e": value}).filter(
        Q(**{f"sort_value__{strict}": value}) | Q(sort_value=value, **{f"id__{tie}": pk})
    )


def runs_needing_attention(*, limit: int = 10) -> dict[str, list[Run]]:
    """The latest failed and running runs, for the home page."""
    return {
        "failed": runs_table(filters=RunFilters(statuses=list(FAILED)), limit=limit).runs,
        "running": runs_table(filters=RunFilters(statuses=[RunStatus.RUNNING]), limit=limit).runs,
    }
