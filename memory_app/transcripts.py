"""Transcript builders: stored memory back into LLM input.

- `run_messages`: a run as smolagents' `agent.write_memory_to_messages(summary_mode)` returns it,
  as `ChatMessage.dict()` dicts (role, content blocks, tool_calls, raw, token_usage), with
  pruned steps left out. The texts are smolagents' own, byte for byte (`memory.py`
  `ActionStep/PlanningStep/TaskStep/SystemPromptStep.to_messages`).
- `context_tool_input`: the AgentKit `ToolInputSchema` object for a context, and its
  `standard_query_format` text (see `memory_app.interop.agentkit`).

Images (task_images, observations_images) are not stored, so their blocks never appear.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models.fields.json import KT

from memory_app.interop import agentkit
from memory_app.interop.smolagents import RESERVED_KEY, calling_tools_text, tool_call_dict
from memory_app.models import Context, Message, MessageRole, Run, Step, ToolCall

RETRY_TEXT = (
    "\nNow let's retry: take care not to repeat previous errors! "
    "If you have retried several times, try a completely different approach.\n"
)
PLAN_FOLLOW_UP = "Now proceed and carry out this plan."


def _chat_message(role: str, text: str) -> dict[str, Any]:
    """The dict `ChatMessage(role, content=[text block]).dict()` gives."""
    return {
        "role": role,
        "content": [{"type": "text", "text": text}],
        "tool_calls": None,
        "raw": None,
        "token_usage": None,
    }


@dataclass(frozen=True, slots=True)
class StepRow:
    """The columns of a step a transcript reads (no model input, no full payload)."""

    pk: int
    kind: str
    task: str | None
    plan: str | None
    model_output: Any
    observations: str | None
    error_type: str | None
    error_message: str | None
    calling_tools: str | None  # the exact "Calling tools:" text kept at import, if any


@dataclass(frozen=True, slots=True)
class CallRow:
    call_id: str
    name: str
    arguments: Any


def step_messages(
    step: StepRow, tool_calls: list[CallRow], *, summary_mode: bool
) -> list[dict[str, Any]]:
    """One stored step as smolagents' `MemoryStep.to_messages(summary_mode)`."""
    if step.kind == "task":
        return [_chat_message("user", f"New task:\n{step.task or ''}")]
    if step.kind == "planning":
        if summary_mode:
            return []
        return [
            _chat_message("assistant", (step.plan or "").strip()),
            _chat_message("user", PLAN_FOLLOW_UP),
        ]
    if step.kind != "action":
        return []  # FinalAnswerStep has no messages (and smolagents never keeps it in memory)
    out = []
    if step.model_output is not None and not summary_mode:
        text = (
            step.model_output.strip() if isinstance(step.model_output, str) else step.model_output
        )
        out.append(_chat_message("assistant", text))
    # smolagents checks `tool_calls is not None`; its dict() turns None into [], so an empty list
    # stored here is the None of a step whose call never parsed.
    if tool_calls:
        text = step.calling_tools or calling_tools_text(
            [
                tool_call_dict({"call_id": t.call_id, "name": t.name, "arguments": t.arguments})
                for t in tool_calls
            ]
        )
        out.append(_chat_message("tool-call", text))
    if step.observations is not None:
        out.append(_chat_message("tool-response", f"Observation:\n{step.observations}"))
    if step.error_type is not None or step.error_message is not None:
        prefix = f"Call id: {tool_calls[0].call_id}\n" if tool_calls else ""
        out.append(
            _chat_message(
                "tool-response", prefix + "Error:\n" + (step.error_message or "") + RETRY_TEXT
            )
        )
    return out


def run_messages(
    *,
    run: Run,
    summary_mode: bool = False,
    upto_position: int | None = None,
    include_pruned: bool = False,
) -> list[dict[str, Any]]:
    """The run as `write_memory_to_messages(summary_mode)`; pruned steps are left out unless
    `include_pruned` (what the model saw before an operator pruned them).

    `upto_position` gives the memory as it stood after that step (the dashboard's "transcript
    after this step"). Reads plain rows of the columns used: a 1,000-step run is two queries
    and no model instances (the verbatim payload, which holds the model input, stays in the
    database; only the kept "Calling tools:" text is extracted from it there).
    """
    messages: list[dict[str, Any]] = []
    if not summary_mode and run.system_prompt:
        messages.append(_chat_message("system", run.system_prompt))
    live = Step.objects.filter(context_id=run.context_id, run=run)
    if not include_pruned:
        live = live.filter(pruned_at__isnull=True)
    if upto_position is not None:
        live = live.filter(position__lte=upto_position)
    steps = [
        StepRow(*row)
        for row in live.order_by("position").values_list(
            "pk",
            "kind",
            "task",
            "plan",
            "model_output",
            "observations",
            "error_type",
            "error_message",
            KT(f"payload__{RESERVED_KEY}__calling_tools"),
        )
    ]
    calls: dict[int, list[CallRow]] = {}
    call_rows = ToolCall.objects.filter(context_id=run.context_id, step__in=live).order_by(
        "step_id", "position"
    )
    for step_id, call_id, name, arguments in call_rows.values_list(
        "step_id", "call_id", "name", "arguments"
    ):
        calls.setdefault(step_id, []).append(CallRow(call_id, name, arguments))
    for step in steps:
        messages.extend(step_messages(step, calls.get(step.pk, []), summary_mode=summary_mode))
    return messages


# --- AgentKit -----------------------------------------------------------------------------------


def _history_turns(messages: Iterable[Message]) -> list[tuple[str, str]]:
    turns = []
    for m in messages:
        if m.role in (MessageRole.USER, "human"):
            turns.append(("human", m.text))
        elif m.role in (MessageRole.ASSISTANT, MessageRole.AGENT, MessageRole.LLM):
            turns.append(("ai", m.text))
    return turns


def context_tool_input(
    *, context: Context, run: Run | None = None, limit: int | None = None
) -> dict[str, Any]:
    """The AgentKit `ToolInputSchema` for the context's latest user message.

    As AgentKit's SimpleRouterAgent builds it: the chat history is every user/assistant message
    before the latest user message (the last `limit` of them when given); when a run's tool
    outputs are asked for, they become `intermediate_steps` and the chat history stays empty.
    `user_settings` comes from the context's metadata (`{"user_settings": {"data", "version"}}`).
    """
    live = Message.objects.filter(context=context, pruned_at__isnull=True)
    latest = live.filter(role=MessageRole.USER).order_by("-seq").first()
    latest_text = latest.text if latest else ""
    intermediate: dict[str, Any] = {}
    if run is not None:
        rows = (
            ToolCall.objects.filter(
                context_id=run.context_id, step__run=run, step__pruned_at__isnull=True
            )
            .order_by("step__position", "position")
            .values_list("name", "output")
        )
        for name, output in rows:
            intermediate[name] = output
    history: list[tuple[str, str]] = []
    if not intermediate:
        before = live.filter(seq__lt=latest.seq) if latest else live
        rows = (
            list(before.order_by("-seq")[: limit or None])
            if limit
            else list(before.order_by("-seq"))
        )
        history = _history_turns(reversed(rows))
    settings = (context.metadata or {}).get("user_settings")
    return agentkit.tool_input(
        chat_history=history,
        latest_human_message=latest_text,
        user_settings=settings,
        intermediate_steps=intermediate,
    )
