"""smolagents <-> logbook: pure mappings between `AgentMemory.get_full_steps()` dicts and steps.

A step dict is mapped to the keyword dict `logbook.steps_append` takes (normalised columns for
the dashboard and the transcripts, tool calls as rows) and kept verbatim in `Step.payload`, so an
export gives back exactly the dict that was imported.

One detail needs care: `Step.payload` is PostgreSQL `jsonb`, which does not keep the key order of
objects, yet smolagents puts `str([tool_call.dict(), ...])` (a Python repr, key order included)
into the "Calling tools:" message. The repr is therefore computed once at import, from the dict
as it arrived, and kept under the reserved payload key `_agentmemory`, which export removes.

No Django, no HTTP here: these functions take and return plain data.
"""

from __future__ import annotations

from typing import Any

FRAMEWORK = "smolagents"
RESERVED_KEY = "_agentmemory"

# Key order of smolagents' own dicts, used when a dict has to be rebuilt from columns.
TOOL_CALL_KEYS = ("id", "type", "function")


class StepFormatError(ValueError):
    """A step dict that is not a smolagents TaskStep / PlanningStep / ActionStep dict."""


def step_kind(step: dict[str, Any]) -> str:
    """The logbook kind of a smolagents step dict (they carry no type tag: keys tell them apart)."""
    if not isinstance(step, dict):
        raise StepFormatError(f"a step must be a JSON object, got {type(step).__name__}")
    if "step_number" in step:
        return "action"
    if "plan" in step:
        return "planning"
    if "task" in step:
        return "task"
    if "output" in step:
        return "final_answer"
    raise StepFormatError(f"not a smolagents step: keys {sorted(step)[:8]}")


def calling_tools_text(tool_calls: list[dict[str, Any]]) -> str:
    """The exact text of smolagents' tool-call message: a Python repr of the tool-call dicts."""
    return "Calling tools:\n" + str(tool_calls)


def _usage(d: dict | None) -> tuple[int | None, int | None, int | None]:
    if not isinstance(d, dict):
        return None, None, None
    return d.get("input_tokens"), d.get("output_tokens"), d.get("total_tokens")


def _timing(d: dict | None) -> tuple[float | None, float | None, float | None]:
    if not isinstance(d, dict):
        return None, None, None
    return d.get("start_time"), d.get("end_time"), d.get("duration")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def step_to_logbook(step: dict[str, Any], *, client_id: str | None = None) -> dict[str, Any]:
    """A smolagents step dict -> the item `logbook.steps_append` takes (incl. tool calls)."""
    kind = step_kind(step)
    payload = {k: v for k, v in step.items() if k != RESERVED_KEY}
    start, end, duration = _timing(step.get("timing"))
    inp, out, total = _usage(step.get("token_usage"))
    item: dict[str, Any] = {
        "client_id": client_id,
        "kind": kind,
        "start_time": start,
        "end_time": end,
        "duration": duration,
        "input_tokens": inp,
        "output_tokens": out,
        "total_tokens": total,
        "payload": payload,
        "tool_calls": [],
    }
    if kind == "task":
        item["task"] = _text(step.get("task"))
    elif kind == "planning":
        item["plan"] = _text(step.get("plan"))
        item["model_input_messages"] = step.get("model_input_messages")
        item["model_output_message"] = step.get("model_output_message")
    elif kind == "final_answer":
        item["action_output"] = step.get("output")
        item["is_final_answer"] = True
    else:
        error = step.get("error")
        if error is not None and not isinstance(error, dict):
            raise StepFormatError("error must be an object {type, message} or null")
        calls = step.get("tool_calls") or []
        if not isinstance(calls, list):
            raise StepFormatError("tool_calls must be a list")
        item.update(
            step_number=step.get("step_number"),
            model_input_messages=step.get("model_input_messages"),
            model_output_message=step.get("model_output_message"),
            model_output=step.get("model_output"),
            code_action=_text(step.get("code_action")),
            observations=_text(step.get("observations")),
            action_output=step.get("action_output"),
            error_type=(error or {}).get("type"),
            error_message=_text((error or {}).get("message")),
            is_final_answer=bool(step.get("is_final_answer")),
        )
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not function.get("name"):
                raise StepFormatError("each tool call needs {id, type, function: {name, arguments}}")
            item["tool_calls"].append(
                {
                    "call_id": str(call.get("id") or ""),
                    "name": str(function["name"]),
                    "arguments": function.get("arguments"),
                    # One call per step is the common case: its observation is its output.
                    "output": item["observations"] if len(calls) == 1 else None,
                    "success": error is None,
                }
            )
        if calls:
            # Computed from the dict as it arrived, before jsonb reorders the keys.
            payload[RESERVED_KEY] = {"calling_tools": calling_tools_text(calls)}
    return item


def run_steps_to_logbook(steps: list[dict[str, Any]], *, run_client_id: str | None) -> list[dict[str, Any]]:
    """Map a whole `get_full_steps()` list; step client ids derive from the run's, for retries."""
    if not isinstance(steps, list):
        raise StepFormatError("steps must be a list of step objects")
    return [
        step_to_logbook(s, client_id=f"{run_client_id}:{i}" if run_client_id else None)
        for i, s in enumerate(steps, start=1)
    ]


def run_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """What a finished run's own row says: task, final answer, status, token totals."""
    task = next((s.get("task") for s in steps if "task" in s and "step_number" not in s), "") or ""
    final = None
    status = "success"
    for s in steps:
        if "step_number" in s and s.get("is_final_answer"):
            final = s.get("action_output")
            if final is None and s.get("tool_calls"):
                # ToolCallingAgent leaves action_output empty; the answer is the final_answer call.
                args = (s["tool_calls"][-1].get("function") or {}).get("arguments")
                final = args.get("answer") if isinstance(args, dict) and "answer" in args else args
    last = steps[-1] if steps else {}
    if isinstance(last.get("error"), dict) and last["error"].get("type") == "AgentMaxStepsError":
        status = "max_steps_error"
        final = last.get("action_output")
    return {"task": task, "final_answer": final, "status": status}


def step_from_stored(
    *, payload: dict[str, Any] | None, columns: dict[str, Any], tool_calls: list[dict[str, Any]]
) -> dict[str, Any]:
    """A stored step -> the smolagents dict: the verbatim payload when there is one, else rebuilt.

    `columns` are the Step model fields; `tool_calls` the ToolCall rows as dicts, in order.
    """
    if payload:
        return {k: v for k, v in payload.items() if k != RESERVED_KEY}
    timing = {
        "start_time": columns.get("start_time"),
        "end_time": columns.get("end_time"),
        "duration": columns.get("duration"),
    }
    usage = None
    if columns.get("input_tokens") is not None or columns.get("output_tokens") is not None:
        usage = {
            "input_tokens": columns.get("input_tokens") or 0,
            "output_tokens": columns.get("output_tokens") or 0,
            "total_tokens": columns.get("total_tokens")
            if columns.get("total_tokens") is not None
            else (columns.get("input_tokens") or 0) + (columns.get("output_tokens") or 0),
        }
    kind = columns.get("kind")
    if kind == "task":
        return {"task": columns.get("task") or "", "task_images": None}
    if kind == "planning":
        return {
            "model_input_messages": columns.get("model_input_messages") or [],
            "model_output_message": columns.get("model_output_message"),
            "plan": columns.get("plan") or "",
            "timing": timing,
            "token_usage": usage,
        }
    if kind == "final_answer":
        return {"output": columns.get("action_output")}
    error = None
    if columns.get("error_type") or columns.get("error_message"):
        error = {"type": columns.get("error_type") or "AgentError", "message": columns.get("error_message") or ""}
    return {
        "step_number": columns.get("step_number"),
        "timing": timing,
        "model_input_messages": columns.get("model_input_messages"),
        "tool_calls": [tool_call_dict(tc) for tc in tool_calls],
        "error": error,
        "model_output_message": columns.get("model_output_message"),
        "model_output": columns.get("model_output"),
        "code_action": columns.get("code_action"),
        "observations": columns.get("observations"),
        "observations_images": None,
        "action_output": columns.get("action_output"),
        "token_usage": usage,
        "is_final_answer": bool(columns.get("is_final_answer")),
    }


def tool_call_dict(tc: dict[str, Any]) -> dict[str, Any]:
    """A ToolCall row as smolagents' `ToolCall.dict()` (its key order)."""
    return {
        "id": tc.get("call_id") or "",
        "type": "function",
        "function": {"name": tc.get("name"), "arguments": tc.get("arguments")},
    }
