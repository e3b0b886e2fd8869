"""Reads for the API and the dashboard: list, filter, paginate.

Pagination is by cursor, never by offset: a cursor is the last id / seq / position seen, so a
page costs one index range scan however deep it lies, and concurrent appends never shift pages.
Each list function returns a `Page` with `has_more` and the `next_cursor` to pass back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from django.db.models import Count, F, Max, Min, Prefetch, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from memory_app.models import Context, ContextKey, Message, Run, Step, ToolCall, keys_digest

T = TypeVar("T")
MAX_LIMIT = 1000


@dataclass
class Page(Generic[T]):
    items: list[T]
    has_more: bool
    next_cursor: int | None


def _clamp(limit: int) -> int:
    return max(1, min(int(limit), MAX_LIMIT))


def _page_forward(qs: QuerySet, *, limit: int, cursor_field: str) -> Page:
    rows = list(qs[: limit + 1])
    has_more = len(rows) > limit
    rows = rows[:limit]
    return Page(
        items=rows,
        has_more=has_more,
        next_cursor=getattr(rows[-1], cursor_field) if has_more else None,
    )


def contexts_list(
    *,
    within: QuerySet | None = None,
    keys: dict[str, Any] | None = None,
    after: int | None = None,
    limit: int = 50,
) -> Page[Context]:
    """Contexts by ascending id; `keys` filters by containment (`keys @> {...}`)."""
    qs = Context.objects.all() if within is None else within
    if keys:
        qs = qs.filter(keys__contains=keys)
    if after is not None:
        qs = qs.filter(pk__gt=after)
    page = _page_forward(qs.order_by("pk"), limit=_clamp(limit), cursor_field="pk")
    with_live_counts(page.items)
    return page


def with_live_counts(contexts: list[Context]) -> list[Context]:
    """Set `live_count`, `live_tokens` and `pruned_count` on each context: what its messages
    count once pruned ones are left out. The stored counters (`message_count`, `token_count`)
    count every stored message; pruned rows are summed on their own partial index, one query for
    all the contexts, as cheap as the number of pruned messages."""
    pruned = {}
    # A context holding no message has nothing pruned (a new one above all): not asked.
    holding = [c for c in contexts if c.message_count]
    if holding:
        pruned = {
            row["context"]: row
            for row in Message.objects.filter(context__in=holding, pruned_at__isnull=False)
            .values("context")
            .annotate(n=Count("id"), tokens=Sum("token_count"))
            .order_by()
        }
    for c in contexts:
        row = pruned.get(c.pk, {})
        c.pruned_count = row.get("n", 0)
        c.live_count = c.message_count - c.pruned_count
        c.live_tokens = c.token_count - (row.get("tokens") or 0)
    return contexts


def context_by_keys(*, within: QuerySet, keys: dict[str, Any]) -> Context | None:
    """The context named by exactly `keys` (in any order) among `within`, or None: the one
    `context_get_or_create` would return, found without creating it."""
    # Two routed reads (the digest's row, then the context by id), never a join of the two.
    target = context_id_of_digest(keys_digest(keys))
    return None if target is None else within.filter(pk=target).first()


def context_id_of_digest(digest: str) -> int | None:
    """The id of the context whose keys have this digest (`ContextKey`), or None."""
    return ContextKey.objects.filter(digest=digest).values_list("target_id", flat=True).first()


def messages_list(
    *,
    context: Context,
    after: int | None = None,
    before: int | None = None,
    limit: int = 100,
    include_pruned: bool = False,
) -> Page[Message]:
    """Messages in seq order.

    With `after` (or nothing): the first `limit` messages after that seq; `next_cursor` is the
    `after` of the next page. With only `before`: the `limit` messages just before it, still in
    ascending order; `next_cursor` is the `before` of the previous page. Both: the range between.
    """
    limit = _clamp(limit)
    qs = Message.objects.filter(context=context)
    if not include_pruned:
        qs = qs.filter(pruned_at__isnull=True)
    if after is not None:
        qs = qs.filter(seq__gt=after)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    if before is not None and after is None:
        rows = list(qs.order_by("-seq")[: limit + 1])
        has_more = len(rows) > limit
        rows = rows[:limit][::-1]
        return Page(items=rows, has_more=has_more, next_cursor=rows[0].seq if has_more else None)
    return _page_forward(qs.order_by("seq"), limit=limit, cursor_field="seq")


def runs_list(*, context: Context, after: int | None = None, limit: int = 50) -> Page[Run]:
    qs = Run.objects.filter(context=context)
    if after is not None:
        qs = qs.filter(pk__gt=after)
    return _page_forward(qs.order_by("pk"), limit=_clamp(limit), cursor_field="pk")


def _with_tool_calls(qs: QuerySet, context_id: int | None = None) -> QuerySet:
    """Prefetch each step's tool calls, within the steps' context when the caller knows it."""
    calls = ToolCall.objects.order_by("position")
    if context_id is not None:
        calls = calls.filter(context_id=context_id)
    return qs.prefetch_related(Prefetch("tool_calls", queryset=calls))


def steps_list(
    *, run: Run, after: int | None = None, limit: int = 100, include_pruned: bool = True
) -> Page[Step]:
    """A run's steps by position (cursor = position), each with its tool calls prefetched."""
    qs = Step.objects.filter(context_id=run.context_id, run=run)
    if not include_pruned:
        qs = qs.filter(pruned_at__isnull=True)
    if after is not None:
        qs = qs.filter(position__gt=after)
    return _page_forward(
        _with_tool_calls(qs.order_by("position"), run.context_id),
        limit=_clamp(limit),
        cursor_field="position",
    )


def step_with_tool_calls(
    *, step_id: int, within: QuerySet | None = None, context_id: int | None = None
) -> Step | None:
    qs = Step.objects.all() if within is None else within
    if context_id is not None:
        qs = qs.filter(context_id=context_id)
    return _with_tool_calls(qs.filter(pk=step_id), context_id).first()


def steps_by_ids(*, ids: list[int], context_id: int) -> list[Step]:
    """Steps of one context in the order of `ids`, each with its tool calls (one query for all,
    not one each)."""
    steps = Step.objects.filter(context_id=context_id, pk__in=ids)
    by_id = {s.pk: s for s in _with_tool_calls(steps, context_id)}
    return [by_id[i] for i in ids]


# The steps' own timing span (Unix seconds on the agent's clock); a step with a start and a
# duration but no end still counts to its start + duration.
STEP_SPAN = {
    "first_start": Min("start_time"),
    "last_end": Max(Coalesce("end_time", F("start_time") + F("duration"), "start_time")),
}


def run_span(*, started_at, finished_at, first_start, last_end, created_at):
    """(start, end) of a run: the agent's stated times, else its steps' span, else the server's."""
    if started_at is None:
        started_at = _from_epoch(first_start) or created_at or timezone.now()
    if finished_at is None:
        finished_at = _from_epoch(last_end) or timezone.now()
    return started_at, max(finished_at, started_at)


def _from_epoch(value: float | None):
    return datetime.fromtimestamp(value, tz=UTC) if value is not None else None
