"""smolagents <-> logbook: pure mappings between `AgentMemory.get_full_steps()` dicts and steps.

A step dict is mapped to the keyword dict `steps_append` takes (normalised columns for
the dashboard and the transcripts, tool calls as rows) and kept verbatim in `Step.payload`, so an
export gives back exactly the dict that was imported.

`Step.payload` keeps the dict's key order (`OrderedJSONField`), and smolagents puts
`str([tool_call.dict(), ...])` (a Python repr, key order included) into the "Calling tools:"
message: the repr is computed once at import and kept under the reserved payload key
`_agentmemory`, which export removes. Steps stored before the payload kept its order carry a
key-order skeleton there (`memory_app.interop.key_order`), put back on export, so a rehydrated
agent prints the same tool-call arguments.

No Django, no HTTP here: these functions take and return plain data.
"""

from __future__ import annotations

from typing import Any

from memory_app.interop import key_order

FRAMEWORK = "smolagents"
RESERVED_KEY = "_agentmemory"
INT32_MAX = 2**31 - 1
# Epoch seconds a run's dates can be made from (year 1970 to 9999).
MAX_EPOCH = 253_402_300_799
SHORT = 200  # the length of the step's error type and the tool call's id and name columns

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


# Field checks: smolagents writes these with fixed types (TokenUsage ints, Timing floats, ...);
# anything else is refused here, before the database would refuse it less politely.


def _object(value: Any, name: str) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise StepFormatError(f"{name} must be an object or null, got {type(value).__name__}")
    return value


def _int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT32_MAX:
        raise StepFormatError(f"{name} must be an integer from 0 to {INT32_MAX}, got {value!r:.40}")
    return value


def _seconds(value: Any, name: str, *, epoch: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StepFormatError(f"{name} must be a number of seconds, got {value!r:.40}")
    if epoch and not 0 <= value <= MAX_EPOCH:
        raise StepFormatError(
            f"{name} must be Unix epoch seconds (0 to {MAX_EPOCH}), got {value!r}"
        )
    return float(value)


def _string(value: Any, name: str, *, max_length: int | None = None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise StepFormatError(f"{name} must be a string or null, got {type(value).__name__}")
    if max_length is not None and len(value) > max_length:
        raise StepFormatError(f"{name} is longer than {max_length} characters")
    return value


def _usage(d: Any) -> tuple[int | None, int | None, int | None]:
    d = _object(d, "token_usage")
    if d is None:
        return None, None, None
    return tuple(
        _int(d.get(k), f"token_usage.{k}")
        for k in ("input_tokens", "output_tokens", "total_tokens")
    )


def _timing(d: Any) -> tuple[float | None, float | None, float | None]:
    d = _object(d, "timing")
    if d is None:
        return None, None, None
    return (
        _seconds(d.get("start_time"), "timing.start_time", epoch=True),
        _seconds(d.get("end_time"), "timing.end_time", epoch=True),
        _seconds(d.get("duration"), "timing.duration", epoch=False),
    )


def _bool(value: Any, name: str) -> bool:
    if value is not None and not isinstance(value, bool):
        raise StepFormatError(f"{name} must be true or false, got {value!r:.40}")
    return bool(value)


def step_to_logbook(step: dict[str, Any], *, client_id: str | None = None) -> dict[str, Any]:
    """A smolagents step dict -> the item `steps_append` takes (incl. tool calls)."""
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
        item["task"] = _string(step.get("task"), "task")
    elif kind == "planning":
        item["plan"] = _string(step.get("plan"), "plan")
        item["model_input_messages"] = _messages(step.get("model_input_messages"))
        item["model_output_message"] = _object(
            step.get("model_output_message"), "model_output_message"
        )
    elif kind == "final_answer":
        item["action_output"] = step.get("output")
        item["is_final_answer"] = True
    else:
        error = _object(step.get("error"), "error") or {}
        calls = step.get("tool_calls") or []
        if not isinstance(calls, list):
            raise StepFormatError("tool_calls must be a list")
        item.update(
            step_number=_int(step.get("step_number"), "step_number"),
            model_input_messages=_messages(step.get("model_input_messages")),
            model_output_message=_object(step.get("model_output_message"), "model_output_message"),
            model_output=step.get("model_output"),
            code_action=_string(step.get("code_action"), "code_action"),
            observations=_string(step.get("observations"), "observations"),
            action_output=step.get("action_output"),
            error_type=_string(error.get("type"), "error.type", max_length=SHORT),
            error_message=_string(error.get("message"), "error.message"),
            is_final_answer=_bool(step.get("is_final_answer"), "is_final_answer"),
        )
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not function.get("name"):
                raise StepFormatError(
                    "each tool call needs {id, type, function: {name, arguments}}"
                )
            item["tool_calls"].append(
                {
                    "call_id": _string(call.get("id"), "tool call id", max_length=SHORT) or "",
                    "name": _string(function["name"], "tool call name", max_length=SHORT),
                    "arguments": function.get("arguments"),
                    # One call per step is the common case: its observation is its output.
                    "output": item["observations"] if len(calls) == 1 else None,
                    "success": not error,
                }
            )
        if calls:
            # Computed from the dict as it arrived (the transcript prints it as it is).
            payload[RESERVED_KEY] = {"calling_tools": calling_tools_text(calls)}
    return item


def _messages(value: Any) -> list | None:
    if value is not None and not isinstance(value, list):
        raise StepFormatError("model_input_messages must be a list or null")
    return value


def run_timing(steps: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """The agent's own start and end (epoch seconds): its first step's start, its last end.

    Only meaningful after `step_to_logbook` has checked every step's timing."""
    starts, ends = [], []
    for s in steps:
        timing = s.get("timing") if isinstance(s, dict) else None
        if isinstance(timing, dict):
            if timing.get("start_time") is not None:
                starts.append(float(timing["start_time"]))
            if timing.get("end_time") is not None:
                ends.append(float(timing["end_time"]))
    start = min(starts) if starts else None
    end = max(ends) if ends else None
    if start is not None and (end is None or end < start):
        end = max(starts)
    return start, end


def run_steps_to_logbook(
    steps: list[dict[str, Any]], *, run_client_id: str | None
) -> list[dict[str, Any]]:
    """Map a whole `get_full_steps()` list; step client ids derive from the run's, for retries."""
    if not isinstance(steps, list):
        raise StepFormatError("steps must be a list of step objects")
    return [
        step_to_logbook(s, client_id=f"{run_client_id}:{i}" if run_client_id else None)
        for i, s in enumerate(steps, start=1)
    ]


def run_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """What a finished run's own row says: task, final answer, status, token totals."""
    task = next((s.get("task") for s in steps if step_kind(s) == "task"), "") or ""
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
        order = (payload.get(RESERVED_KEY) or {}).get("key_order")
        return key_order.restore({k: v for k, v in payload.items() if k != RESERVED_KEY}, order)
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
        error = {
            "type": columns.get("error_type") or "AgentError",
            "message": columns.get("error_message") or "",
        }
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
