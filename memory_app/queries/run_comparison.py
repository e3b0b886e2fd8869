"""Two runs side by side: their steps aligned, the first place they part, and what each step and
each run cost more or less.

The alignment is a pure function over two step lists (`align`). Steps are matched by their
signature, (kind, the names of the tools they called), with `difflib.SequenceMatcher`, so a step
one run has and the other lacks (a retry, an extra search) leaves the rest paired as they were;
steps in a replaced stretch pair off in order. A pair differs when the tools differ, when their
arguments differ as JSON values (key order and `1` against `1.0` aside; shown as written), when
what the step brought back differs (tool outputs, observations, action output) or when its error
does; the model's own wording is left out, since two runs of a model rarely say the same words.

Each run is read in two queries (its steps, then their tool calls), with long texts cut to a
head and compared by their digests, so a 300-step run costs what a 3-step one does in queries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from django.db.models.functions import MD5, Length, Substr

from memory_app import pricing
from memory_app.models import Run, Step, ToolCall
from memory_app.queries.logbook import run_model

HEAD_CHARS = 240
# Why a pair of steps is not the same step, in the order a reviewer reads them.
DIFFERENCES = {
    "missing": "a step only one run has",
    "kind": "another kind of step",
    "tool": "another tool",
    "arguments": "other arguments",
    "output": "another output",
    "error": "an error",
}


@dataclass
class StepFacts:
    """What the comparison knows of one step: its signature, what it is compared by (digests)
    and what a row shows (heads of long texts, as written)."""

    position: int
    kind: str
    tools: tuple[str, ...] = ()
    arguments: tuple[Any, ...] = ()
    output: Any = None
    error: tuple[str, Any] | None = None
    tokens: int | None = None
    cost: float | None = None
    duration: float | None = None
    pruned: bool = False
    # For display: the arguments as written, the output's and error's first characters.
    arguments_text: str = ""
    arguments_cut: bool = False
    output_head: str = ""
    output_cut: bool = False  # the head is shorter than the text
    output_more: bool = False  # the step brought back more than the row shows
    error_head: str = ""

    @property
    def error_type(self) -> str | None:
        return None if self.error is None else self.error[0]

    @property
    def signature(self) -> tuple[str, tuple[str, ...]]:
        return (self.kind, self.tools)


@dataclass
class AlignedRow:
    a: StepFacts | None
    b: StepFacts | None
    differences: tuple[str, ...] = ()
    tokens_delta: int | None = None
    cost_delta: float | None = None
    duration_delta: float | None = None
    first: bool = False

    @property
    def differs(self) -> bool:
        return bool(self.differences)

    @property
    def reasons(self) -> list[str]:
        return [DIFFERENCES[d] for d in self.differences]


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def semantic(value: Any) -> Any:
    """A JSON value as something equal to another exactly when the two mean the same: objects
    without their key order, numbers by value, booleans apart from numbers."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, dict):
        return ("object", frozenset((k, semantic(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple(semantic(v) for v in value))
    return ("other", repr(value))


def _pair(a: StepFacts, b: StepFacts) -> AlignedRow:
    differences = []
    if a.kind != b.kind:
        differences.append("kind")
    if a.tools != b.tools:
        differences.append("tool")
    elif tuple(map(semantic, a.arguments)) != tuple(map(semantic, b.arguments)):
        differences.append("arguments")
    if a.output != b.output:
        differences.append("output")
    if a.error != b.error:
        differences.append("error")
    return AlignedRow(
        a=a,
        b=b,
        differences=tuple(differences),
        tokens_delta=_delta(a.tokens, b.tokens),
        cost_delta=_delta(a.cost, b.cost),
        duration_delta=_delta(a.duration, b.duration),
    )


def align(a_steps: list[StepFacts], b_steps: list[StepFacts]) -> list[AlignedRow]:
    """The two step lists as rows of (step of A or None, step of B or None), in order; the first
    row that differs is marked `first`."""
    matcher = SequenceMatcher(
        None, [s.signature for s in a_steps], [s.signature for s in b_steps], autojunk=False
    )
    rows: list[AlignedRow] = []
    for tag, a_lo, a_hi, b_lo, b_hi in matcher.get_opcodes():
        paired = min(a_hi - a_lo, b_hi - b_lo) if tag in ("equal", "replace") else 0
        rows.extend(_pair(a_steps[a_lo + i], b_steps[b_lo + i]) for i in range(paired))
        rows.extend(
            AlignedRow(a=s, b=None, differences=("missing",)) for s in a_steps[a_lo + paired : a_hi]
        )
        rows.extend(
            AlignedRow(a=None, b=s, differences=("missing",)) for s in b_steps[b_lo + paired : b_hi]
        )
    first = next((row for row in rows if row.differs), None)
    if first is not None:
        first.first = True
    return rows


@dataclass
class RunSide:
    run: Run
    steps: list[StepFacts]
    tokens: int | None
    cost: float | None
    duration: float | None


@dataclass
class Comparison:
    a: RunSide
    b: RunSide
    rows: list[AlignedRow]
    first: int | None = None  # index of the first row that differs
    tokens_delta: float | None = None
    cost_delta: float | None = None
    duration_delta: float | None = None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def first_row(self) -> AlignedRow | None:
        return None if self.first is None else self.rows[self.first]


STEP_FIELDS = (
    "id",
    "position",
    "kind",
    "error_type",
    "total_tokens",
    "input_tokens",
    "output_tokens",
    "cost",
    "model",
    "duration",
    "action_output",
    "pruned_at",
)


def run_steps(run: Run) -> list[StepFacts]:
    """The run's steps as the comparison sees them: two queries whatever the run's length."""
    rows = list(
        Step.objects.filter(context_id=run.context_id, run=run)
        .order_by("position")
        .values(*STEP_FIELDS)
        .annotate(
            obs_head=Substr("observations", 1, HEAD_CHARS),
            obs_digest=MD5("observations"),
            obs_chars=Length("observations"),
            err_head=Substr("error_message", 1, HEAD_CHARS),
            err_digest=MD5("error_message"),
        )
    )
    calls: dict[int, list[dict[str, Any]]] = {}
    for call in (
        ToolCall.objects.filter(context_id=run.context_id, step_id__in=[r["id"] for r in rows])
        .order_by("step_id", "position")
        .values("step_id", "name", "arguments")
        .annotate(
            out_head=Substr("output", 1, HEAD_CHARS),
            out_digest=MD5("output"),
            out_chars=Length("output"),
        )
    ):
        calls.setdefault(call["step_id"], []).append(call)
    fallback = run_model(run)
    return [_facts(row, calls.get(row["id"], []), fallback) for row in rows]


def _facts(row: dict[str, Any], calls: list[dict[str, Any]], fallback_model: str) -> StepFacts:
    arguments = tuple(c["arguments"] for c in calls)
    action = row["action_output"]
    outputs = [c for c in calls if c["out_head"] is not None]
    # What a row shows: the observations, else the first tool output, else the action output
    # (its head); "more" when that is cut or the step brought back more than it.
    pieces = (row["obs_head"] is not None) + len(outputs) + (action is not None)
    if row["obs_head"] is not None:
        head, chars = row["obs_head"], row["obs_chars"]
    elif outputs:
        head, chars = outputs[0]["out_head"], outputs[0]["out_chars"]
    elif action is not None:
        text = action if isinstance(action, str) else json.dumps(action, ensure_ascii=False)
        head, chars = text[:HEAD_CHARS], len(text)
    else:
        head, chars = "", 0
    arguments_text, arguments_cut = _arguments_text(calls)
    error = None
    if row["error_type"] is not None:
        error = (row["error_type"], row["err_digest"])
    return StepFacts(
        position=row["position"],
        kind=row["kind"],
        tools=tuple(c["name"] for c in calls),
        arguments=arguments,
        output=(
            row["obs_digest"],
            tuple(c["out_digest"] for c in calls),
            semantic(action),
        ),
        error=error,
        tokens=row["total_tokens"],
        cost=pricing.step_cost(
            model=row["model"] or fallback_model,
            cost=row["cost"],
            input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"],
        ),
        duration=row["duration"],
        pruned=row["pruned_at"] is not None,
        arguments_text=arguments_text,
        arguments_cut=arguments_cut,
        output_head=head,
        output_cut=chars > len(head),
        output_more=chars > len(head) or pieces > 1,
        error_head=(
            f"{row['error_type']}: {row['err_head'] or ''}" if row["error_type"] is not None else ""
        ),
    )


def _arguments_text(calls: list[dict[str, Any]]) -> tuple[str, bool]:
    """Each call's arguments as written (JSON in its own key order), one a line, cut short."""
    parts = []
    for call in calls:
        args = call["arguments"]
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        parts.append(text)
    joined = "\n".join(parts)
    if len(joined) <= HEAD_CHARS:
        return joined, False
    return joined[: HEAD_CHARS - 1] + "…", True


def compare_runs(a: Run, b: Run) -> Comparison:
    """Run `a` (the baseline) against run `b`: aligned steps, first divergence, deltas (b − a)."""
    sides = [
        RunSide(run=r, steps=run_steps(r), tokens=r.total_tokens, cost=r.cost, duration=r.duration)
        for r in (a, b)
    ]
    rows = align(sides[0].steps, sides[1].steps)
    first = next((i for i, row in enumerate(rows) if row.first), None)
    counts = {name: sum(1 for row in rows if name in row.differences) for name in DIFFERENCES}
    return Comparison(
        a=sides[0],
        b=sides[1],
        rows=rows,
        first=first,
        tokens_delta=_delta(sides[0].tokens, sides[1].tokens),
        cost_delta=_delta(sides[0].cost, sides[1].cost),
        duration_delta=_delta(sides[0].duration, sides[1].duration),
        counts={k: v for k, v in counts.items() if v},
    )


def previous_run(run: Run) -> int | None:
    """The id of the run of the same context created just before this one, if any."""
    earlier = Run.objects.filter(context_id=run.context_id, created_at__lte=run.created_at).exclude(
        pk=run.pk
    )
    # Runs created in the same instant are told apart by id.
    earlier = earlier.exclude(created_at=run.created_at, pk__gt=run.pk)
    return earlier.order_by("-created_at", "-pk").values_list("pk", flat=True).first()
