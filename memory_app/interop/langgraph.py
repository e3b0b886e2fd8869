"""LangGraph super-steps -> logbook items. A super-step is the tasks run from one checkpoint to
the next; their pending writes, as `AgentMemorySaver` summarised them, become one action step:
the nodes that ran, what each wrote, the tool calls its AI messages asked for, the model's text,
tokens and model name. Pure: no Django, no database.

A write's summary is `{"message": m}`, `{"messages": [m, ...]}` or `{"value": v}`, where a
message `m` has `type`, `content` and, when present, `tool_calls` (`id`, `name`, `args`),
`tool_call_id`, `name`, `usage` (`input_tokens`, `output_tokens`, `total_tokens`) and `model`.
"""

from __future__ import annotations

import json
from typing import Any

PULL = "~__pregel_pull, "
# LangGraph's own channels: routing (`branch:to:<node>`), and the resume value a Command gives.
HIDDEN_PREFIXES = ("branch:to:", "__resume__", "__pregel_")
ERROR = "__error__"
INTERRUPT = "__interrupt__"


def node_of(task_path: str) -> str:
    """The node a task ran: a pull task's path names it; a `Send` (push) task's does not."""
    if task_path.startswith(PULL):
        return task_path[len(PULL) :].split(", ", 1)[0]
    return "send" if task_path else ""


def messages_of(summary: Any) -> list[dict[str, Any]]:
    if not isinstance(summary, dict):
        return []
    if isinstance(summary.get("message"), dict):
        return [summary["message"]]
    found = summary.get("messages")
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def _shown(summary: Any) -> Any:
    if isinstance(summary, dict) and "value" in summary:
        return summary["value"]
    return summary


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b.get("text", "") if isinstance(b, dict) else str(b)
            for b in content
            if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")
        )
    return json.dumps(content, ensure_ascii=False)


def _usage(messages: list[dict[str, Any]], name: str) -> int | None:
    values = [
        m["usage"][name]
        for m in messages
        if isinstance(m.get("usage"), dict) and isinstance(m["usage"].get(name), int)
    ]
    return sum(values) if values else None


def tool_outputs(writes: list[dict[str, Any]]) -> dict[str, str]:
    """The text of each tool message written, by the id of the tool call it answers."""
    return {
        str(m["tool_call_id"]): _text(m.get("content"))
        for w in writes
        for m in messages_of(w["summary"])
        if m.get("type") == "tool" and m.get("tool_call_id")
    }


def superstep_item(
    *,
    writes: list[dict[str, Any]],
    step: int | None,
    client_id: str,
    payload: dict[str, Any],
    start_time: float | None,
    end_time: float | None,
) -> dict[str, Any]:
    """One action step for the super-step whose pending `writes` (each `task_path`, `channel`,
    `summary`, in the order stored) led to the next checkpoint."""
    nodes: list[str] = []
    written: list[dict[str, Any]] = []
    ai: list[dict[str, Any]] = []
    lines: list[str] = []
    for w in writes:
        channel = w["channel"]
        if not w["task_path"] or channel.startswith(HIDDEN_PREFIXES):
            continue
        node = node_of(w["task_path"])
        if node not in nodes:
            nodes.append(node)
        value = _shown(w["summary"])
        written.append({"node": node, "channel": channel, "value": value})
        lines.append(f"{node} → {channel}: {json.dumps(value, ensure_ascii=False)}")
        ai.extend(m for m in messages_of(w["summary"]) if m.get("type") == "ai")
    answers = tool_outputs(writes)
    tool_calls = [
        {
            "call_id": str(call.get("id") or ""),
            "name": str(call.get("name") or "tool"),
            "arguments": call.get("args"),
            "output": answers.get(str(call.get("id") or "")),
        }
        for m in ai
        for call in m.get("tool_calls") or []
        if isinstance(call, dict)
    ]
    models = [m["model"] for m in ai if isinstance(m.get("model"), str) and m["model"]]
    return {
        "client_id": client_id,
        "kind": "action",
        "step_number": step,
        "model_output": "\n".join(_text(m.get("content")) for m in ai) if ai else None,
        "observations": "\n".join(lines) or None,
        "action_output": {"nodes": nodes, "writes": written},
        "tool_calls": tool_calls,
        "input_tokens": _usage(ai, "input_tokens"),
        "output_tokens": _usage(ai, "output_tokens"),
        "total_tokens": _usage(ai, "total_tokens"),
        "model": models[-1] if models else "",
        "start_time": start_time,
        "end_time": end_time,
        "payload": {"langgraph": {"nodes": nodes, **payload}},
    }


def error_item(*, writes: list[dict[str, Any]], client_id: str, payload: dict) -> dict[str, Any]:
    """The step of a task that raised: LangGraph writes its error to `__error__`."""
    errors = [w for w in writes if w["channel"] == ERROR]
    nodes = list(dict.fromkeys(node_of(w["task_path"]) for w in errors))
    message = "\n".join(json.dumps(_shown(w["summary"]), ensure_ascii=False) for w in errors)
    return {
        "client_id": client_id,
        "kind": "action",
        "error_type": "LangGraphError",
        "error_message": message,
        "observations": f"{', '.join(nodes)} raised",
        "payload": {"langgraph": {"nodes": nodes, **payload}},
    }
