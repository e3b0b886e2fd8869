"""Reads for the dashboard: bounded, index-friendly, never a whole context or a whole run.

Every function returns at most one page of rows (keyset pagination on indexed columns), so a
context of 100,000 messages or a run of 2,000 steps costs the same to show as a small one.
Bad input (a broken cursor, a malformed key chip) raises `BadQuery`, which views answer with 400.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.postgres.search import SearchQuery
from django.db.models import F, FilteredRelation, Q, QuerySet

from memory_app.models import (
    FTS_CONFIG,
    Context,
    Message,
    MessageRole,
    MessageSearch,
    Run,
)
from memory_app.queries.lists import with_live_counts
from memory_app.search import fulltext

PAGE_SIZE = 50
RUNS_PAGE_SIZE = 20
MAX_QUERY_CHARS = 500


class BadQuery(ValueError):
    """A query parameter the dashboard cannot use; the message says which and why."""


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
    """Set `live_count`, `pruned_count` and `live_tokens` on each context (pruned messages are
    counted on their own, never in a total: `lists.with_live_counts`)."""
    return with_live_counts(contexts)


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
    # After a jump to a seq the window does not show: "pruned" (shown with "show pruned"),
    # "filtered" (left out by the filters) or "missing" (no message has that seq).
    target_hidden: str = ""

    @property
    def first_seq(self) -> int | None:
        return self.messages[0].seq if self.messages else None

    @property
    def last_seq(self) -> int | None:
        return self.messages[-1].seq if self.messages else None


def messages_for_history() -> QuerySet[Message]:
    """Messages as the history shows them: with the position of the step they belong to (for
    the link to it)."""
    # The step is joined by its id and its context (the message's): on Citus a join by id
    # alone is refused beside a routed filter ("complex joins"), and with the context both
    # tables are read on the message's shard.
    same_context = FilteredRelation("step", condition=Q(step__context_id=F("context_id")))
    return Message.objects.annotate(step_here=same_context, step_position=F("step_here__position"))


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
        # which have no stored vector (memory_app.search.fulltext).
        indexed = MessageSearch.objects.filter(context_id=context.pk, search_vector=query).values(
            "seq"
        )
        parsed = Q(seq__gt=context.search_seq) | Q(pruned_at__isnull=False)
        qs = qs.alias(text_vector=fulltext.text_vector()).filter(
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
        if not any(m.seq == around for m in window.messages):
            window.target_hidden = _why_hidden(context, filters, around)
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


def _why_hidden(context: Context, filters: HistoryFilters, seq: int) -> str:
    pruned_at = Message.objects.filter(context=context, seq=seq).values_list(
        "pruned_at", flat=True
    )[:1]
    if not pruned_at:
        return "missing"
    return "pruned" if pruned_at[0] is not None and not filters.show_pruned else "filtered"


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
