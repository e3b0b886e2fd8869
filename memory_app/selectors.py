"""Message selectors: what an agent will see next.

One implementation serves the API (`POST /api/v1/contexts/{id}/select`) and the dashboard's
selector playground: call `select(context=..., spec=...)` with one of the spec dataclasses below.
Every selector reads live messages only (pruned ones never appear) and returns them oldest-first,
each with the reason it was chosen, plus totals.

Steamship semantics (`semantics="steamship"`) follow `steamship.agents.schema.message_selectors`
as described in reference/frameworks.md §2.5. Steamship keeps roles in block tags; here the
stored role says the same thing:

- user / assistant / system messages are Steamship's chat-role messages;
- a *function selection* (the assistant choosing a tool) is role `tool-call`, or an assistant
  message tagged `function-selection` (the tag kind Steamship writes);
- a *function result* is role `function`, `tool` or `tool-response`;
- status messages (role `agent` or `llm`, or tagged `status-message`) are never selected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from django.db import router
from django.db.models import Q

from memory_app import db, pipelines, scale_out, tokens
from memory_app.errors import Invalid
from memory_app.models import Context, Message
from memory_app.search.messages import search_messages

MAX_K = 1000
SCAN_CHUNK = 500
# The first read of a backward scan is small: a token window of a few thousand tokens usually
# needs a few dozen messages, and fetching 500 full rows for it cost more than the selection.
FIRST_SCAN_CHUNK = 50
# A skip scan can pass over thousands of oversized messages: name the first few only.
MAX_SKIP_NOTES = 20

FUNCTION_RESULT_ROLES = frozenset({"function", "tool", "tool-response"})
STATUS_ROLES = frozenset({"agent", "llm"})


# --- specs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowSpec:
    """The last `k` messages; with `semantics="steamship"`, the last `k` user/assistant turns
    (MessageWindowMessageSelector: k*2 conversation messages, function blocks after a user
    message ride along uncounted, a trailing user message is the current prompt and left out)."""

    k: int
    semantics: Literal["plain", "steamship"] = "plain"
    kind: Literal["window"] = "window"


@dataclass(frozen=True)
class TokenWindowSpec:
    """The most recent messages whose token counts stay strictly below `max_tokens`.

    `policy="contiguous"` stops at the first message that does not fit; `policy="skip"` skips it
    and keeps scanning older messages (Steamship's TokenWindowMessageSelector). With
    `semantics="steamship"` only conversation messages are considered (user, and assistant
    messages that are not function selections) and a trailing user message is left out.
    """

    max_tokens: int
    policy: Literal["contiguous", "skip"] = "contiguous"
    tokenizer: str | None = None
    semantics: Literal["plain", "steamship"] = "plain"
    kind: Literal["token_window"] = "token_window"


@dataclass(frozen=True)
class SearchSpec:
    """Top `k` messages by relevance to `query` (see `memory_app.search`)."""

    query: str
    k: int = 5
    mode: Literal["auto", "keyword", "semantic", "hybrid"] = "auto"
    model: str | None = None
    query_vector: tuple[float, ...] | None = None
    # "prompt": the hits in conversation order (oldest first), as a prompt takes them; "rank":
    # best first, for a caller that reads the ranking itself.
    order: Literal["prompt", "rank"] = "prompt"
    kind: Literal["search"] = "search"


@dataclass(frozen=True)
class CompositeSpec:
    """Steamship FunctionsBasedAgent's prompt: system message, search hits for the last user
    message (that message excluded), the recent window, ordered and de-duplicated by id, then the
    last user message, then the function calls recorded since it."""

    window: WindowSpec | TokenWindowSpec = field(
        default_factory=lambda: WindowSpec(k=2, semantics="steamship")
    )
    search_k: int = 3
    search_mode: Literal["auto", "keyword", "semantic", "hybrid", "off"] = "auto"
    kind: Literal["composite"] = "composite"


SelectorSpec = WindowSpec | TokenWindowSpec | SearchSpec | CompositeSpec


# --- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selected:
    message: Message
    reason: str
    tokens: int
    score: float | None = None


@dataclass
class Selection:
    selector: str
    items: list[Selected]
    tokenizer: str
    max_tokens: int | None = None
    scanned: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def messages(self) -> list[Message]:
        return [i.message for i in self.items]

    @property
    def ids(self) -> list[int]:
        return [i.message.pk for i in self.items]

    @property
    def total_tokens(self) -> int:
        return sum(i.tokens for i in self.items)

    @property
    def count(self) -> int:
        return len(self.items)


# --- message classes (Steamship's predicates, on stored roles) ---------------------------------


def is_status(m: Message) -> bool:
    return m.role in STATUS_ROLES or "status-message" in (m.tags or [])


# Steamship gives a status message no chat role, so none of the predicates below holds for it
# (a `tool` message tagged status-message is a status, not a function result).


def is_user(m: Message) -> bool:
    return m.role == "user" and not is_status(m)


def is_function_selection(m: Message) -> bool:
    return not is_status(m) and (
        m.role == "tool-call" or (m.role == "assistant" and "function-selection" in (m.tags or []))
    )


def is_function_result(m: Message) -> bool:
    return m.role in FUNCTION_RESULT_ROLES and not is_status(m)


def is_conversation(m: Message) -> bool:
    """Steamship's `is_user_history_message`: a user message, or an assistant message that is
    not a function selection."""
    if is_status(m):
        return False
    return is_user(m) or (m.role == "assistant" and not is_function_selection(m))


# --- reading ----------------------------------------------------------------------------------


def _live(context: Context):
    return Message.objects.filter(context=context, pruned_at__isnull=True)


_NEWEST_SQL = (
    f"SELECT {db.select_columns(Message, 'm')} FROM memory_app_message m"  # noqa: S608 - constant
    " WHERE m.context_id = %s AND m.pruned_at IS NULL ORDER BY m.seq DESC LIMIT %s"
)


def _newest(context_id: int, k: int) -> list[Message]:
    """The last `k` live messages, oldest first: one read, no query compiled (the window is an
    agent's most frequent read), on the database the router names for reads; a request's
    deferred key read goes with it (`pipelines.read_rows`).

    On one node the read is prepared and runs on its generic plan, one for any context and k:
    an index of the context's messages walked newest first (on a large store the live
    messages' index, which holds no pruned row). Planning it for each call's values costs the
    server more than running it."""
    return _newest_first(context_id, k)[::-1]


def _newest_first(context_id: int, k: int) -> list[Message]:
    """`_newest`'s read, newest first."""
    one_plan = not scale_out.table_is_distributed(Message._meta.db_table)
    return _read_messages(_NEWEST_SQL, [context_id, k], prepared=one_plan, generic=one_plan)


def _read_messages(sql: str, params: list, **options) -> list[Message]:
    """The messages one plain statement reads (`pipelines.read_rows`, `options` as there), on
    the database the router names for reads, built as the ORM builds them."""
    using = router.db_for_read(Message)
    rows = pipelines.read_rows(sql, params, using=using, **options)
    return [db.from_row(Message, row, using) for row in rows]


def _not_status() -> Q:
    return ~Q(role__in=STATUS_ROLES) & ~Q(tags__contains=["status-message"])


# The live messages before a seq, newest first (`_scan_backwards`' chunks after the first); with
# `_FITTING`, only those a token window may still take. Plain reads, planned for their values:
# a chunk's rows are read through the context's index either way.
_OLDER_SQL = (
    f"SELECT {db.select_columns(Message, 'm')} FROM memory_app_message m"  # noqa: S608 - constant
    " WHERE m.context_id = %s AND m.pruned_at IS NULL AND m.seq < %s{narrow}"
    " ORDER BY m.seq DESC LIMIT %s"
)
_FITTING = " AND m.token_count < %s"
_FITTING_OR_RECOUNTED = " AND (m.token_count < %s OR m.tokenizer = ANY(%s))"


def _scan_backwards(
    context: Context,
    *,
    before_seq: int | None = None,
    narrow: Callable[[], tuple[int, list[str]]] | None = None,
) -> Iterator[Message]:
    """Live messages newest first, read in chunks so long histories are never loaded at once.

    `narrow`, when given, is asked before each chunk after the first for the rows still worth
    reading (it may tighten as the caller consumes rows): those under a token count, and those
    whose count was made under one of the tokenizers it names.
    """
    cursor = before_seq
    size = FIRST_SCAN_CHUNK
    while True:
        if cursor is None:
            # The newest chunk is the window's own read (one prepared statement, a request's
            # deferred key read in its round trip): a token window is mostly answered by it.
            chunk = _newest_first(context.pk, size)
        else:
            shape, fitting = "", []
            if narrow is not None:
                under, recounted = narrow()
                shape, fitting = _FITTING, [under]
                if recounted:
                    shape, fitting = _FITTING_OR_RECOUNTED, [under, recounted]
            params = [context.pk, cursor, *fitting, size]
            chunk = _read_messages(_OLDER_SQL.format(narrow=shape), params)
        yield from chunk
        if len(chunk) < size:
            return
        cursor = chunk[-1].seq
        size = min(size * 4, SCAN_CHUNK)


_RECOUNTED_SQL = (
    "SELECT DISTINCT m.tokenizer FROM memory_app_message m"
    " WHERE m.context_id = %s AND m.pruned_at IS NULL"
    " AND (m.tokenizer < %s OR m.tokenizer > %s OR (m.tokenizer > %s AND m.tokenizer < %s))"
    " ORDER BY m.tokenizer"
)


def _tokenizers_needing_recount(context: Context, name: str) -> list[str]:
    """Tokenizer names stored on the context's live messages whose counts are not `name`'s.

    Written as ranges around the trusted names (one or two) so the (context, tokenizer) index
    answers it without reading the context's rows: normally every row is trusted and this is
    empty. A plain read: no query compiled.
    """
    trusted = sorted({name, ""} if name == tokens.default_tokenizer_name() else {name})
    low, high = trusted[0], trusted[-1]
    rows = pipelines.read_rows(
        _RECOUNTED_SQL, [context.pk, low, high, low, high], using=router.db_for_read(Message)
    )
    return [tokenizer for (tokenizer,) in rows]


class _TokenCounter:
    """Token counts under one tokenizer (see `tokens.message_token_counts`)."""

    def __init__(self, name: str | None):
        self.name = name or tokens.default_tokenizer_name()
        tokens.get_encoding(self.name)  # unknown name -> UnknownTokenizer before any work

    def __call__(self, m: Message) -> int:
        return tokens.message_token_counts([m], tokenizer=self.name)[0]

    def many(self, messages: list[Message]) -> list[int]:
        return tokens.message_token_counts(messages, tokenizer=self.name)


def _check_k(k: int, name: str = "k") -> None:
    if not isinstance(k, int) or k < 1 or k > MAX_K:
        raise Invalid(f"{name} must be an integer between 1 and {MAX_K}")


# --- selectors --------------------------------------------------------------------------------


def select_window(*, context: Context, spec: WindowSpec) -> Selection:
    _check_k(spec.k)
    counter = _TokenCounter(None)
    if spec.semantics == "plain":
        newest = _newest(context.pk, spec.k)
        n = len(newest)
        items = [
            Selected(m, f"window: {n - i} of the last {spec.k} messages", count)
            for i, (m, count) in enumerate(zip(newest, counter.many(newest), strict=True))
        ]
        return Selection(selector="window", items=items, tokenizer=counter.name, scanned=n)
    if spec.semantics != "steamship":
        raise Invalid("semantics must be 'plain' or 'steamship'")
    return _steamship_window(context=context, k=spec.k, counter=counter)


def _steamship_window(*, context: Context, k: int, counter: _TokenCounter) -> Selection:
    # The oldest live message is the last the backward scan reads: no read of its own.
    scan = _marking_the_last(_scan_backwards(context))
    newest, newest_is_oldest = next(scan, (None, False))
    if newest is None:
        return Selection(
            selector="window", items=[], tokenizer=counter.name, notes=["empty history"]
        )
    notes: list[str] = []
    seen_user = False
    pending: list[tuple[Message, bool]] = [(newest, newest_is_oldest)]
    if is_user(newest):
        seen_user = True
        pending = []
        notes.append(
            f"message #{newest.seq} is the current prompt (trailing user message): left out"
        )
    limit = k * 2
    counted = 0
    picked: list[tuple[Message, str]] = []
    scanned = 0

    def candidates() -> Iterator[tuple[Message, bool]]:
        yield from pending
        yield from scan

    for m, oldest in candidates():
        if counted >= limit:
            break
        # Steamship walks `while index > 0`: the oldest message is never examined.
        if oldest:
            notes.append(f"message #{m.seq} is the oldest message, never examined (Steamship)")
            break
        scanned += 1
        if is_user(m):
            seen_user = True
        if is_conversation(m):
            counted += 1
            picked.append((m, f"window: conversation message {counted} of {limit} ({k} turns)"))
        elif seen_user and (is_function_selection(m) or is_function_result(m)):
            picked.append((m, "window: function call of an earlier turn (not counted)"))
    picked.reverse()
    counts = counter.many([m for m, _ in picked])
    items = [Selected(m, reason, n) for (m, reason), n in zip(picked, counts, strict=True)]
    return Selection(
        selector="window", items=items, tokenizer=counter.name, scanned=scanned, notes=notes
    )


def _marking_the_last(messages: Iterator[Message]) -> Iterator[tuple[Message, bool]]:
    """Each message, and whether it is the last (read one ahead)."""
    current = next(messages, None)
    while current is not None:
        following = next(messages, None)
        yield current, following is None
        current = following


def select_token_window(*, context: Context, spec: TokenWindowSpec) -> Selection:
    if not isinstance(spec.max_tokens, int) or spec.max_tokens < 1:
        raise Invalid("max_tokens must be a positive integer")
    if spec.policy not in ("contiguous", "skip"):
        raise Invalid("policy must be 'contiguous' or 'skip'")
    if spec.semantics not in ("plain", "steamship"):
        raise Invalid("semantics must be 'plain' or 'steamship'")
    counter = _TokenCounter(spec.tokenizer)
    steamship = spec.semantics == "steamship"
    budget = spec.max_tokens
    used = 0
    picked: list[Selected] = []
    notes: list[str] = []
    scanned = 0
    first = True
    narrow = None
    if spec.policy == "skip":
        # Under the strict `n + used < budget` rule `used` never reaches the budget, so a skip
        # scan would read the whole history. Only rows with token_count < budget - used can
        # still be taken: read on only those (plus rows whose stored count was made under
        # another tokenizer, which are recounted). The same messages are selected.
        recount = _tokenizers_needing_recount(context, counter.name)

        def narrow() -> tuple[int, list[str]]:
            return budget - used, recount

    skipped = 0
    for m in _scan_backwards(context, narrow=narrow):
        if first:
            first = False
            if steamship and is_user(m):
                notes.append(
                    f"message #{m.seq} is the current prompt (trailing user message): left out"
                )
                continue
        if steamship and not is_conversation(m):
            continue
        if used >= budget:
            break
        scanned += 1
        n = counter(m)
        # Strictly below the budget, as Steamship's TokenWindowMessageSelector.
        if n + used < budget:
            used += n
            picked.append(Selected(m, f"token_window: {n} tokens, {used}/{budget} used", n))
        elif spec.policy == "contiguous":
            notes.append(
                f"stopped at message #{m.seq} ({n} tokens would reach {n + used}/{budget})"
            )
            break
        else:
            skipped += 1
            if skipped <= MAX_SKIP_NOTES:
                notes.append(
                    f"skipped message #{m.seq}: {n} tokens would reach {n + used}/{budget}"
                )
    if skipped > MAX_SKIP_NOTES:
        notes.append(f"... and {skipped - MAX_SKIP_NOTES} more skipped messages")
    picked.reverse()
    return Selection(
        selector="token_window",
        items=picked,
        tokenizer=counter.name,
        max_tokens=budget,
        scanned=scanned,
        notes=notes,
    )


def select_search(*, context: Context, spec: SearchSpec) -> Selection:

    _check_k(spec.k)
    result = search_messages(
        context=context,
        query=spec.query,
        k=spec.k,
        mode=spec.mode,
        model=spec.model,
        query_vector=list(spec.query_vector) if spec.query_vector is not None else None,
    )
    counter = _TokenCounter(None)
    if spec.order not in ("prompt", "rank"):
        raise Invalid("order must be 'prompt' or 'rank'")
    hits = result.hits if spec.order == "rank" else sorted(result.hits, key=lambda h: h.message.seq)
    counts = counter.many([h.message for h in hits])
    items = [
        Selected(h.message, f"search: rank {h.rank} ({h.explain})", n, h.score)
        for h, n in zip(hits, counts, strict=True)
    ]
    return Selection(
        selector="search",
        items=items,
        tokenizer=counter.name,
        scanned=len(result.hits),
        notes=[f"mode {result.mode}" + (f", model {result.model}" if result.model else "")]
        + result.notes,
    )


def select_composite(*, context: Context, spec: CompositeSpec) -> Selection:

    counter = _TokenCounter(getattr(spec.window, "tokenizer", None))
    system = _live(context).filter(_not_status(), role="system").order_by("-seq").first()
    last_user = _live(context).filter(_not_status(), role="user").order_by("-seq").first()
    notes: list[str] = []
    chosen: dict[int, tuple[Message, str, float | None]] = {}

    if last_user is not None and spec.search_mode != "off" and last_user.text.strip():
        _check_k(spec.search_k, "search_k")
        # Status messages are never selected (Steamship does not even index them): ask for more
        # hits than needed and keep the first search_k that are not statuses.
        result = search_messages(
            context=context,
            query=last_user.text,
            k=min(spec.search_k * 4, MAX_K),
            mode=spec.search_mode,
            exclude_ids=[last_user.pk],
            match="any",
        )
        notes.append(f"search mode {result.mode}")
        notes += result.notes
        for h in [h for h in result.hits if not is_status(h.message)][: spec.search_k]:
            chosen.setdefault(
                h.message.pk,
                (
                    h.message,
                    f"search hit {h.rank} for the last user message ({h.explain})",
                    h.score,
                ),
            )
    window = select(context=context, spec=spec.window)
    notes += window.notes
    # A plain window takes the last messages whatever they are; the composite still never
    # selects a status message.
    statuses = [item.message for item in window.items if is_status(item.message)]
    if statuses:
        notes.append(
            f"status messages left out of the window: {', '.join(f'#{m.seq}' for m in statuses)}"
        )
    for item in window.items:
        if not is_status(item.message):
            chosen.setdefault(item.message.pk, (item.message, item.reason, None))

    excluded = {m.pk for m in (system, last_user) if m is not None}
    middle = sorted((v for pk, v in chosen.items() if pk not in excluded), key=lambda v: v[0].seq)
    ordered: list[tuple[Message, str, float | None]] = []
    if system is not None:
        ordered.append((system, "system message", None))
    ordered += middle
    if last_user is not None:
        ordered.append((last_user, "last user message (the current prompt)", None))
        since = _live(context).filter(seq__gt=last_user.seq).order_by("seq")
        ordered += [
            (m, "function call since the last user message", None)
            for m in since
            if is_function_selection(m) or is_function_result(m)
        ]
    items = [
        Selected(m, reason, n, score)
        for (m, reason, score), n in zip(
            ordered, counter.many([o[0] for o in ordered]), strict=True
        )
    ]
    return Selection(
        selector="composite", items=items, tokenizer=counter.name, scanned=len(chosen), notes=notes
    )


def select(*, context: Context, spec: SelectorSpec) -> Selection:
    """Run the selector `spec` describes on `context`.

    Raises `Invalid` for bad parameters and `errors.UnknownTokenizer` for a tokenizer this
    server cannot load (both 422 at the API); `errors.SemanticUnavailable` when semantic search is
    asked for with no embedding provider and no query vector.
    """
    if isinstance(spec, WindowSpec):
        return select_window(context=context, spec=spec)
    if isinstance(spec, TokenWindowSpec):
        return select_token_window(context=context, spec=spec)
    if isinstance(spec, SearchSpec):
        return select_search(context=context, spec=spec)
    if isinstance(spec, CompositeSpec):
        return select_composite(context=context, spec=spec)
    raise Invalid(f"unknown selector spec {type(spec).__name__}")
