"""What the model saw at a step: its input messages, sectioned by source, with tokens per section
and a line diff against the previous model call's input.

Where the input comes from, in this order:
- **stored**: the step's `model_input_messages`, as the framework recorded them (smolagents'
  ActionStep and PlanningStep, the OpenTelemetry GenAI input messages);
- **rebuilt**: a smolagents ActionStep without them gets the input smolagents gave it,
  `agent.write_memory_to_messages()` over the steps before it (`transcripts.run_messages`, the
  framework's own texts; pruned steps included, as the model saw them before an operator pruned
  them). A planning step's input and the last call of a run that hit its step limit come from
  prompt templates the server never receives, so they are not rebuilt;
- otherwise **not recorded**, with the reason; nothing is guessed.

Each message is put in one section by its source: the first system message is the system prompt,
the first user message the task (and so is every later smolagents "New task:"), a later user or
system message whose text is a memory record of the context, the context's compressed summary or
one of its recent messages (not one this run wrote) is a memory or selector hit, assistant
messages and tool calls are earlier steps, tool results are tool outputs. Tokens are counted with
the server's tokenizer (`memory_app.tokens`) over each message's text and structured parts, as
the message tables count them; a provider's own count adds its chat framing.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, Q

from memory_app import rendering, tokens, transcripts
from memory_app.interop.smolagents import FRAMEWORK as SMOLAGENTS
from memory_app.memories import content_hash
from memory_app.models import MemoryRecord, Message, Run, Step, StepKind

SECTIONS = (
    ("system", "System prompt"),
    ("task", "Task"),
    ("memory", "Memory and selector hits"),
    ("steps", "Earlier steps"),
    ("tools", "Tool outputs"),
)
SECTION_LABELS = dict(SECTIONS)
STEP_ROLES = frozenset({"assistant", "tool-call", "ai", "model"})
TOOL_ROLES = frozenset({"tool", "tool-response", "function", "ipython"})
NEW_TASK = "New task:\n"
# A context's recent messages are what its selectors hand an agent; the match reads this many of
# the latest ones by seq (one range of the context's own index), not the whole history.
RECENT_MESSAGES = 20_000
# At most this many earlier steps are looked at for the previous model call.
PREVIOUS_LOOKBACK = 20
# Inputs longer than this (in lines, both sides together) are not compared on the page.
MAX_DIFF_LINES = 40_000
DIFF_CONTEXT = 2


@dataclass
class InputMessage:
    role: str
    text: str
    tool_calls: str = ""
    section: str = "steps"
    tokens: int = 0
    memory_id: int | None = None
    message_seq: int | None = None
    summary: bool = False

    @property
    def section_label(self) -> str:
        return SECTION_LABELS[self.section]


@dataclass
class SectionTotal:
    key: str
    label: str
    messages: int = 0
    tokens: int = 0


@dataclass
class DiffLine:
    mark: str  # "+" added, "-" removed, " " unchanged, "@" a hunk's header
    text: str


@dataclass
class ModelInput:
    position: int
    origin: str  # "stored", "rebuilt" or "none"
    reason: str = ""
    messages: list[InputMessage] = field(default_factory=list)
    sections: list[SectionTotal] = field(default_factory=list)
    total_tokens: int = 0
    tokenizer: str = ""
    previous: int | None = None  # the position of the step compared against
    previous_origin: str = ""
    diff: list[DiffLine] | None = None
    added: int = 0
    removed: int = 0
    token_change: int | None = None
    diff_note: str = ""

    @property
    def recorded(self) -> bool:
        return self.origin != "none"


def _not_rebuilt(run: Run, kind: str, error_type: str | None) -> str:
    """Why a step without stored input gets none ("" when smolagents' rule rebuilds it)."""
    if kind == StepKind.TASK:
        return "a task step is not a model call: the task goes into the next call's input."
    if kind == StepKind.FINAL_ANSWER:
        return "a final answer step is not a model call."
    framework = run.framework or "this run's framework"
    if run.framework != SMOLAGENTS:
        return (
            f"the step has no stored model input, and {framework} gives no rule to rebuild it "
            "from the stored steps."
        )
    if kind == StepKind.PLANNING:
        return (
            "the step has no stored model input, and smolagents builds a planning call from "
            "prompt templates the server never receives."
        )
    if error_type == "AgentMaxStepsError":
        return (
            "the step has no stored model input, and smolagents builds the last call of a run "
            "that reached its step limit from a prompt template the server never receives."
        )
    return ""


def _raw_input(run: Run, row: dict[str, Any]) -> tuple[str, str, list[dict[str, Any]]]:
    """(origin, reason, messages as the framework's dicts) of one step row."""
    stored = row["model_input_messages"]
    if isinstance(stored, list) and stored:
        return "stored", "", [m if isinstance(m, dict) else {"content": m} for m in stored]
    reason = _not_rebuilt(run, row["kind"], row["error_type"])
    if reason:
        return "none", reason, []
    rebuilt = transcripts.run_messages(
        run=run, upto_position=row["position"] - 1, include_pruned=True
    )
    return "rebuilt", "", rebuilt


def _text_parts(content: Any) -> str:
    """The text blocks of a message's content (a string is all text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    return ""


def _messages(raw: list[dict[str, Any]]) -> tuple[list[InputMessage], list[str]]:
    """Display messages and, beside them, the text each is counted by."""
    out, counted = [], []
    for m in raw:
        content = m.get("content")
        calls = m.get("tool_calls")
        role = m.get("role")
        message = InputMessage(
            role=role if isinstance(role, str) else rendering.json_text(role),
            text=rendering.content_text(content),
            tool_calls=rendering.pretty_json(calls) if calls else "",
        )
        text = tokens.token_text(_text_parts(content), content)
        if not isinstance(content, str | list | None):
            text = rendering.json_text(content)
        if calls:
            text += "\n" + json.dumps(calls, ensure_ascii=False, separators=(",", ":"), default=str)
        out.append(message)
        counted.append(text)
    return out, counted


def _classify(run: Run, messages: list[InputMessage]) -> None:
    """Put each message in its section (see the module doc)."""
    seen_system = seen_task = False
    candidates = []
    for m in messages:
        role = m.role.lower()
        role = "user" if role == "human" else role  # LangChain's name for the user
        if role == "system" and not seen_system:
            m.section, seen_system = "system", True
        elif role == "user" and (not seen_task or m.text.startswith(NEW_TASK)):
            m.section, seen_task = "task", True
        elif role in TOOL_ROLES:
            m.section = "tools"
        elif role in ("user", "system"):
            m.section = "system" if role == "system" else "steps"
            candidates.append(m)
        else:
            m.section = "steps"
    if candidates:
        _match_memory(run, candidates)


def _match_memory(run: Run, candidates: list[InputMessage]) -> None:
    """Mark the candidates whose text is a memory record the context sees (scope: the context or
    a key subset of its keys; whitespace as the records' hash ignores it), the context's
    compressed summary, or one of its recent messages from outside this run (a turn the run
    itself wrote is an earlier step, not a hit)."""
    context = run.context
    by_hash: dict[str, list[InputMessage]] = {}
    for m in candidates:
        by_hash.setdefault(content_hash(m.text), []).append(m)
    subsets = Q(context__isnull=True, scope_keys__contained_by=context.keys) & ~Q(scope_keys={})
    records = MemoryRecord.objects.filter(
        Q(context_id=context.pk) | subsets, content_hash__in=list(by_hash)
    ).order_by("pk")
    for digest, pk in records.values_list("content_hash", "pk"):
        for m in by_hash.get(digest, []):
            if m.memory_id is None:
                m.section, m.memory_id = "memory", pk
    summary = context.compressed_summary
    rest = [m for m in candidates if m.memory_id is None]
    for m in rest:
        if summary and content_hash(m.text) == content_hash(summary):
            m.section, m.summary = "memory", True
    rest = [m for m in rest if not m.summary]
    if not rest:
        return
    texts = {t for m in rest for t in (m.text, m.text.strip())}
    hits = dict(
        Message.objects.filter(
            context_id=context.pk,
            seq__gt=context.last_seq - RECENT_MESSAGES,
            text__in=list(texts),
        )
        .exclude(run_id=run.pk)
        .order_by("seq")
        .values_list("text", "seq")
    )
    for m in rest:
        seq = hits.get(m.text, hits.get(m.text.strip()))
        if seq is not None:
            m.section, m.message_seq = "memory", seq


def _diff_lines(messages: list[InputMessage]) -> list[str]:
    lines = []
    for m in messages:
        lines.append(f"── {m.role} ──")
        lines.extend(m.text.splitlines() or [""])
        if m.tool_calls:
            lines.extend(m.tool_calls.splitlines())
    return lines


def _unified_range(start: int, length: int) -> str:
    """A hunk's range as `diff -u` (and difflib.unified_diff) writes it."""
    if length == 1:
        return f"{start + 1}"
    return f"{start + 1 if length else start},{length}"


def line_diff(before: list[str], after: list[str], *, context: int = DIFF_CONTEXT):
    """A unified line diff (difflib) as DiffLines, with the counts of added and removed lines.

    The common head is skipped before matching (a step's input is mostly the previous one plus
    what happened since), so the matcher works on what changed, without its junk heuristic (which
    would treat the repeated role lines as noise).
    """
    head = 0
    for a, b in zip(before, after, strict=False):
        if a != b:
            break
        head += 1
    head = max(0, head - context)
    matcher = difflib.SequenceMatcher(None, before[head:], after[head:], autojunk=False)
    out: list[DiffLine] = []
    added = removed = 0
    for group in matcher.get_grouped_opcodes(context):
        first, last = group[0], group[-1]
        old_range = _unified_range(head + first[1], last[2] - first[1])
        new_range = _unified_range(head + first[3], last[4] - first[3])
        out.append(DiffLine("@", f"@@ -{old_range} +{new_range} @@"))
        for op, i1, i2, j1, j2 in group:
            if op == "equal":
                out.extend(DiffLine(" ", line) for line in before[head + i1 : head + i2])
                continue
            if op in ("replace", "delete"):
                out.extend(DiffLine("-", line) for line in before[head + i1 : head + i2])
                removed += i2 - i1
            if op in ("replace", "insert"):
                out.extend(DiffLine("+", line) for line in after[head + j1 : head + j2])
                added += j2 - j1
    return out, added, removed


def _step_rows(run: Run, **where):
    return Step.objects.filter(context_id=run.context_id, run=run, **where).values(
        "position", "kind", "error_type", "model_input_messages"
    )


def _has_input(run: Run, row: dict[str, Any]) -> bool:
    return row["has_input"] or not _not_rebuilt(run, row["kind"], row["error_type"])


def _previous(run: Run, position: int) -> dict[str, Any] | None:
    """The nearest earlier step that was a model call whose input is stored or rebuilt."""
    rows = (
        Step.objects.filter(
            context_id=run.context_id,
            run=run,
            position__lt=position,
            kind__in=(StepKind.ACTION, StepKind.PLANNING),
        )
        .annotate(
            has_input=ExpressionWrapper(
                Q(model_input_messages__isnull=False), output_field=BooleanField()
            )
        )
        .order_by("-position")
        .values("position", "kind", "error_type", "has_input")[:PREVIOUS_LOOKBACK]
    )
    found = next((r for r in rows if _has_input(run, r)), None)
    if found is None:
        return None
    return _step_rows(run, position=found["position"]).first()


def model_input(*, run: Run, position: int) -> ModelInput | None:
    """The step's model input, sectioned and compared with the previous call's (None: no step)."""
    row = _step_rows(run, position=position).first()
    if row is None:
        return None
    origin, reason, raw = _raw_input(run, row)
    result = ModelInput(position=position, origin=origin, reason=reason)
    if origin == "none":
        return result
    messages, counted = _messages(raw)
    for m, n in zip(messages, tokens.count_tokens(counted), strict=True):
        m.tokens = n
    _classify(run, messages)
    totals = {key: SectionTotal(key, label) for key, label in SECTIONS}
    for m in messages:
        totals[m.section].messages += 1
        totals[m.section].tokens += m.tokens
    result.messages = messages
    result.sections = list(totals.values())
    result.total_tokens = sum(m.tokens for m in messages)
    result.tokenizer = tokens.default_tokenizer_name()
    _compare(run, result)
    return result


def _compare(run: Run, result: ModelInput) -> None:
    previous = _previous(run, result.position)
    if previous is None:
        result.diff_note = "No earlier step of this run was a model call with a known input."
        return
    origin, _, raw = _raw_input(run, previous)
    result.previous, result.previous_origin = previous["position"], origin
    if origin == "none":
        result.diff_note = f"Step {previous['position']}'s model input is not recorded."
        return
    before, counted = _messages(raw)
    result.token_change = result.total_tokens - sum(tokens.count_tokens(counted))
    old, new = _diff_lines(before), _diff_lines(result.messages)
    if len(old) + len(new) > MAX_DIFF_LINES:
        result.diff_note = (
            f"The two inputs have {len(old) + len(new):,} lines together: too long to compare "
            "on this page."
        )
        return
    result.diff, result.added, result.removed = line_diff(old, new)
