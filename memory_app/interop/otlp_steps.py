"""OpenTelemetry spans -> logbook items: reading OpenInference and GenAI attributes (messages,
tool calls, token usage, errors, timing) and mapping a trace's spans to task, planning and
action steps and a run's task, outcome and system prompt. Pure: no Django, no database.

A span may carry `logs`: the log events of the span (`memory_app.interop.otlp.decode_logs`).
GenAI instrumentations send a model call's messages there by default: one event per input
message (`gen_ai.user.message`, ...) and per choice (`gen_ai.choice`), or all of them in one
`gen_ai.client.inference.operation.details` event."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from memory_app.interop.otlp import LANGCHAIN_SCOPE, LLM, NS, span_role

_STEP_NAME = re.compile(r"^Step (\d+)$")


def _seconds(ns: int | None) -> float | None:
    return ns / NS if ns else None


# What a JSON text can begin with, after its leading whitespace (the standard library reads NaN
# and Infinity too): a text that begins otherwise is prose, returned without a parse that fails.
_JSON_STARTS = frozenset('{["-0123456789tfnNI')


def _json(value: Any) -> Any:
    """A JSON text attribute read, else the value as it is. orjson first (several texts a span),
    the standard library for what orjson refuses and it reads (NaN, integers past 64 bits)."""
    if isinstance(value, str):
        if value[:1] not in _JSON_STARTS and value.lstrip(" \t\n\r")[:1] not in _JSON_STARTS:
            return value
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _indexed(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenInference flattens lists: `<prefix>.<i>.<rest>` -> [{rest: value}, ...] by index."""
    items: dict[int, dict[str, Any]] = {}
    prefix += "."
    start = len(prefix)
    for name, value in attrs.items():
        if not name.startswith(prefix):
            continue
        index, _, rest = name[start:].partition(".")
        if index.isdigit() and rest:
            items.setdefault(int(index), {})[rest] = value
    return [items[i] for i in sorted(items)]


def _message_text(message: dict[str, Any]) -> str | None:
    """A flattened OpenInference message's text: `message.content`, else its text contents."""
    if isinstance(message.get("message.content"), str):
        return message["message.content"]
    texts = [
        c["message_content.text"]
        for c in _indexed(message, "message.contents")
        if isinstance(c.get("message_content.text"), str)
    ]
    return "\n".join(texts) if texts else None


def _genai_messages(attrs: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = _json(attrs.get(key))
    return [m for m in value if isinstance(m, dict)] if isinstance(value, list) else []


def _genai_text(message: dict[str, Any]) -> str | None:
    texts = [
        p.get("content")
        for p in message.get("parts") or []
        if isinstance(p, dict) and p.get("type") == "text"
    ]
    texts = [t for t in texts if isinstance(t, str)]
    return "\n".join(texts) if texts else None


def _genai_tool_responses(message: dict[str, Any]) -> str | None:
    """What a tool message answered: its `tool_call_response` parts' responses, as text (a
    structured response as its JSON)."""
    texts = [
        p["response"] if isinstance(p["response"], str) else json.dumps(p["response"])
        for p in message.get("parts") or []
        if isinstance(p, dict) and p.get("type") == "tool_call_response" and "response" in p
    ]
    return "\n".join(texts) if texts else None


_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
_MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


def _genai_attributes(span: dict[str, Any]) -> dict[str, Any]:
    """The span's attributes with those of its operation-details event under them (the latest
    GenAI conventions put the messages there when content goes to events)."""
    attrs: dict[str, Any] = {}
    for log in span.get("logs") or []:
        if log["name"] == _DETAILS_EVENT:
            attrs.update(log["attributes"])
    return {**attrs, **span["attributes"]}


def _body(log: dict[str, Any]) -> dict[str, Any]:
    return log["body"] if isinstance(log.get("body"), dict) else {}


def _event_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        texts = [
            p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
        return "\n".join(texts) if texts else None
    return None


def _openai_tool_calls(calls: Any) -> list[dict[str, Any]]:
    """Tool calls in the OpenAI shape an event body carries them, arguments as sent."""
    out = []
    for tc in calls if isinstance(calls, list) else []:
        function = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(function, dict) and function.get("name"):
            out.append(
                {
                    "id": str(tc.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(function["name"]),
                        "arguments": _json(function.get("arguments")),
                    },
                }
            )
    return out


def _message(role: str, text: str | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": role,
        "content": [{"type": "text", "text": text}] if text is not None else [],
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _openinference_tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    return _openai_tool_calls(
        [
            {
                "id": tc.get("tool_call.id"),
                "function": {
                    "name": tc.get("tool_call.function.name"),
                    "arguments": tc.get("tool_call.function.arguments"),
                },
            }
            for tc in _indexed(message, "message.tool_calls")
        ]
    )


def input_messages(span: dict[str, Any]) -> list[dict[str, Any]] | None:
    """An LLM span's input as chat messages `{role, content: [{type: text, text}]}`, with the
    `tool_calls` an assistant message made."""
    attrs = span["attributes"]
    out = [
        _message(m.get("message.role") or "user", _message_text(m), _openinference_tool_calls(m))
        for m in _indexed(attrs, "llm.input_messages")
    ]
    if not out:
        for m in _genai_messages(_genai_attributes(span), "gen_ai.input.messages"):
            calls = [
                {"id": p.get("id"), "function": p}
                for p in m.get("parts") or []
                if isinstance(p, dict) and p.get("type") == "tool_call"
            ]
            text = _genai_text(m)
            if text is None:
                text = _genai_tool_responses(m)
            out.append(_message(m.get("role") or "user", text, _openai_tool_calls(calls)))
    if not out:
        for log in span.get("logs") or []:
            if log["name"] in _MESSAGE_EVENTS:
                body = _body(log)
                out.append(
                    _message(
                        str(body.get("role") or _MESSAGE_EVENTS[log["name"]]),
                        _event_text(body.get("content")),
                        _openai_tool_calls(body.get("tool_calls")),
                    )
                )
    return out or None


def _choice(span: dict[str, Any]) -> dict[str, Any] | None:
    """The message of the first `gen_ai.choice` event of a span (GenAI v1.30 conventions)."""
    for log in span.get("logs") or []:
        if log["name"] == "gen_ai.choice" and _body(log).get("index", 0) == 0:
            message = _body(log).get("message")
            return message if isinstance(message, dict) else {}
    return None


def output_text(span: dict[str, Any]) -> str | None:
    attrs = span["attributes"]
    for m in _indexed(attrs, "llm.output_messages")[:1]:
        return _message_text(m)
    for m in _genai_messages(_genai_attributes(span), "gen_ai.output.messages")[:1]:
        return _genai_text(m)
    if (choice := _choice(span)) is not None:
        return _event_text(choice.get("content"))
    return None


def requested_tool_calls(span: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool calls an LLM span's output asks for: [{call_id, name, arguments}]."""
    attrs = span["attributes"]
    calls = []
    for m in _indexed(attrs, "llm.output_messages")[:1]:
        for tc in _openinference_tool_calls(m):
            calls.append(
                {
                    "call_id": tc["id"],
                    "name": tc["function"]["name"],
                    "arguments": tc["function"]["arguments"],
                }
            )
    for m in _genai_messages(_genai_attributes(span), "gen_ai.output.messages")[:1]:
        for part in m.get("parts") or []:
            if isinstance(part, dict) and part.get("type") == "tool_call" and part.get("name"):
                calls.append(
                    {
                        "call_id": str(part.get("id") or ""),
                        "name": str(part["name"]),
                        "arguments": _json(part.get("arguments")),
                    }
                )
    if not calls and (choice := _choice(span)) is not None:
        for tc in _openai_tool_calls(choice.get("tool_calls")):
            calls.append(
                {
                    "call_id": tc["id"],
                    "name": tc["function"]["name"],
                    "arguments": tc["function"]["arguments"],
                }
            )
    if not calls and isinstance(out := _json(attrs.get("output.value")), dict):
        # smolagents passes dict arguments, which OpenInference leaves out of the flattened
        # message; its output.value is the whole ChatMessage.
        for tc in out.get("tool_calls") or []:
            function = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(function, dict) and function.get("name"):
                calls.append(
                    {
                        "call_id": str(tc.get("id") or ""),
                        "name": str(function["name"]),
                        "arguments": _json(function.get("arguments")),
                    }
                )
    return calls


def token_usage(span: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    attrs = span["attributes"]

    def number(*names):
        for name in names:
            value = attrs.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return int(value)
        return None

    inp = number("llm.token_count.prompt", "gen_ai.usage.input_tokens")
    out = number("llm.token_count.completion", "gen_ai.usage.output_tokens")
    total = number("llm.token_count.total")
    if total is None and inp is not None and out is not None:
        total = inp + out
    return inp, out, total


def _error(span: dict[str, Any]) -> tuple[str, str] | None:
    """(type, message) of a span's failure: its exception event, a smolagents recovery event,
    or an ERROR status with its message."""
    for event in reversed(span["events"]):
        attrs = event["attributes"]
        if event["name"] == "exception":
            kind = str(attrs.get("exception.type") or "Exception")
            return kind.rsplit(".", 1)[-1], str(attrs.get("exception.message") or "")
        if event["name"] == "agent.step_recovery":
            return str(attrs.get("type") or "AgentError"), str(attrs.get("message") or "")
    if span["status"] == "error":
        return str(span["attributes"].get("error.type") or "Error"), span["status_message"]
    return None


def _tool_arguments(span: dict[str, Any]) -> Any:
    attrs = span["attributes"]
    if "gen_ai.tool.call.arguments" in attrs:
        return _json(attrs["gen_ai.tool.call.arguments"])
    value = _json(attrs.get("input.value"))
    # openinference-instrumentation-smolagents records Tool.__call__'s bound arguments.
    if (
        isinstance(value, dict)
        and "kwargs" in value
        and set(value) <= {"args", "kwargs", "sanitize_inputs_outputs"}
    ):
        return value["kwargs"] if not value.get("args") else value
    return value


def _tool_message(span: dict[str, Any]) -> dict[str, Any] | None:
    """The LangChain ToolMessage a TOOL span's output is (openinference-instrumentation-langchain
    records `{"type": "tool", "data": {...}}`), or None."""
    value = _json(span["attributes"].get("output.value"))
    if isinstance(value, dict) and value.get("type") == "tool":
        data = value.get("data")
        return data if isinstance(data, dict) else None
    return None


def _tool_output(span: dict[str, Any]) -> str | None:
    attrs = span["attributes"]
    if (message := _tool_message(span)) is not None:
        content = message.get("content")
        return content if isinstance(content, str) else json.dumps(content)
    value = attrs.get("gen_ai.tool.call.result", attrs.get("output.value"))
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _tool_call_id(span: dict[str, Any]) -> str | None:
    call_id = span["attributes"].get("gen_ai.tool.call.id")
    if not call_id and (message := _tool_message(span)) is not None:
        call_id = message.get("tool_call_id")
    return str(call_id) if call_id else None


def _tool_name(span: dict[str, Any]) -> str:
    attrs = span["attributes"]
    return str(attrs.get("tool.name") or attrs.get("gen_ai.tool.name") or span["name"])[:200]


def _timing(span: dict[str, Any]) -> dict[str, Any]:
    start, end = _seconds(span["start_ns"]), _seconds(span["end_ns"])
    return {
        "start_time": start,
        "end_time": end,
        "duration": end - start if start is not None and end is not None else None,
    }


def _sum_usage(llms: list[dict[str, Any]]) -> dict[str, int | None]:
    usage = [token_usage(s) for s in llms]

    def total(i):
        values = [u[i] for u in usage if u[i] is not None]
        return sum(values) if values else None

    return {"input_tokens": total(0), "output_tokens": total(1), "total_tokens": total(2)}


def _tool_calls(llms: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requested calls of the step's LLM spans matched (by name, in order) with the TOOL spans
    that ran them; a TOOL span nobody asked for is a call of its own."""
    requested = [c for s in llms for c in requested_tool_calls(s)]
    calls = [dict(c, output=None, success=None, duration=None) for c in requested]
    used: set[int] = set()
    for tool in tools:
        name = _tool_name(tool)
        error = _error(tool)
        ran = {
            "arguments": _tool_arguments(tool),
            "output": _tool_output(tool) if error is None else None,
            "success": error is None,
            "duration": _timing(tool)["duration"],
        }
        call_id = _tool_call_id(tool)
        match = next(
            (
                i
                for i, c in enumerate(calls)
                if i not in used and c["name"] == name and (not call_id or c["call_id"] == call_id)
            ),
            None,
        )
        if match is None:
            calls.append({"call_id": str(call_id or ""), "name": name, **ran})
            used.add(len(calls) - 1)
        else:
            used.add(match)
            # The arguments the model wrote, where it wrote any: a tool span records the tool's
            # own view of them (LangChain: a lone argument as a bare string).
            if calls[match]["arguments"] not in (None, "", {}):
                ran["arguments"] = calls[match]["arguments"]
            calls[match].update(ran)
    return calls


def _model_output_message(llm: dict[str, Any] | None) -> Any:
    if llm is None:
        return None
    value = _json(llm["attributes"].get("output.value"))
    if isinstance(value, dict) and "role" in value:
        return value
    text = output_text(llm)
    return {"role": "assistant", "content": text} if text is not None else None


def action_step(
    step: dict[str, Any], *, llms: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    """An action step from a CHAIN span and the LLM / TOOL spans under it."""
    out = step["attributes"].get("output.value")
    observations = out if isinstance(out, str) or out is None else json.dumps(out)
    return _action(step, llms=llms, tools=tools, observations=observations, error=_error(step))


MODEL_NAME_KEYS = ("llm.model_name", "gen_ai.response.model", "gen_ai.request.model")


def model_name(llms: list[dict[str, Any]]) -> str:
    """The model of the step's last LLM call (the one that wrote its output), or ""."""
    for span in reversed(llms):
        for key in MODEL_NAME_KEYS:
            value = span["attributes"].get(key)
            if isinstance(value, str) and value:
                return value[:200]
    return ""


def _action(step, *, llms, tools, observations, error) -> dict[str, Any]:
    llms = sorted(llms, key=lambda s: s["start_ns"])
    tools = sorted(tools, key=lambda s: s["start_ns"])
    last = llms[-1] if llms else None
    calls = _tool_calls(llms, tools)
    match = _STEP_NAME.match(step["name"])
    return {
        "client_id": step["span_id"],
        "kind": "action",
        "step_number": int(match.group(1)) if match else None,
        **_timing(step),
        **_sum_usage(llms),
        "model": model_name(llms),
        "model_input_messages": input_messages(llms[0]) if llms else None,
        "model_output_message": _model_output_message(last),
        "model_output": output_text(last) if last else None,
        "observations": observations,
        "error_type": error[0][:200] if error else None,
        "error_message": error[1] if error else None,
        "is_final_answer": any(c["name"] == "final_answer" for c in calls),
        "tool_calls": calls,
        "payload": None,
    }


def planning_step(llm: dict[str, Any]) -> dict[str, Any]:
    return {
        "client_id": llm["span_id"],
        "kind": "planning",
        **_timing(llm),
        **_sum_usage([llm]),
        "model": model_name([llm]),
        "plan": output_text(llm),
        "model_input_messages": input_messages(llm),
        "model_output_message": _model_output_message(llm),
        "payload": None,
    }


def flat_step(anchor: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A GenAI-style step: one LLM call (or a tool call no model call preceded) and the tool
    calls that ran after it; their outputs are the observations, the first failure the error."""
    tools = sorted(tools, key=lambda s: s["start_ns"])
    llms = [anchor] if span_role(anchor) == LLM else []
    outputs = [o for o in map(_tool_output, tools) if o is not None]
    error = next((e for e in map(_error, [*llms, *tools]) if e is not None), None)
    return _action(
        anchor,
        llms=llms,
        tools=tools,
        observations="\n".join(outputs) if outputs else None,
        error=error,
    )


def task_step(root: dict[str, Any], task: str) -> dict[str, Any]:
    start = _seconds(root["start_ns"])
    return {
        "client_id": f"{root['span_id']}:task",
        "kind": "task",
        "task": task,
        "start_time": start,
        "payload": None,
    }


def _last_user_text(span: dict[str, Any]) -> str | None:
    for m in reversed(input_messages(span) or []):
        if m["role"] in ("user", "human"):
            texts = [c["text"] for c in m["content"] if isinstance(c.get("text"), str)]
            if texts:
                return "\n".join(texts)
    return None


def run_task(root: dict[str, Any], llms: list[dict[str, Any]] = ()) -> str:
    """The task: smolagents' own, else the last user message of the run's input (the root's,
    else the first model call's); a plain-text input of the root comes before the model's."""
    attrs = root["attributes"]
    if isinstance(attrs.get("smolagents.task"), str):
        return attrs["smolagents.task"]
    value = _json(attrs.get("input.value"))
    if isinstance(value, dict) and isinstance(value.get("task"), str):
        return value["task"]
    if text := _last_user_text(root):
        return text
    if isinstance(value, str) and value:
        return value
    first = sorted(llms, key=lambda s: s["start_ns"])[:1]
    return (_last_user_text(first[0]) if first else None) or ""


def run_agent_name(root: dict[str, Any]) -> str:
    attrs = root["attributes"]
    name = (
        attrs.get("gen_ai.agent.name")
        or attrs.get("agent.name")
        or root["name"].removesuffix(".run")
    )
    return str(name)[:200]


def _state_answer(value: Any) -> Any:
    """A LangGraph state's answer: the text of its last message (the agent's reply)."""
    messages = value.get("messages") if isinstance(value, dict) else None
    if not (isinstance(messages, list) and messages and isinstance(messages[-1], dict)):
        return value
    last = messages[-1]
    data = last.get("data") if isinstance(last.get("data"), dict) else last
    content = data.get("content")
    text = _event_text(content)
    return text if text is not None else value


def run_outcome(root: dict[str, Any], llms: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """What the run row says once its root span has ended: status, final answer, token totals.

    The answer of a run that is one model call is the model's text, not its raw response; a
    LangGraph run's is its last message; a root without an output takes its last model call's."""
    attrs = root["attributes"]
    if root.get("role", span_role(root)) == LLM:
        answer = output_text(root)
    else:
        answer = attrs.get("output.value")
        if isinstance(answer, str) and attrs.get("output.mime_type") == "application/json":
            answer = _json(answer)
            if root.get("scope") == LANGCHAIN_SCOPE:
                answer = _state_answer(answer)
        if answer is None:
            answer = next(
                (_genai_text(m) for m in _genai_messages(attrs, "gen_ai.output.messages")), None
            )
        if answer is None and llms:
            answer = output_text(max(llms, key=lambda s: s["start_ns"]))
    inp, out, total = token_usage(root)
    return {
        "status": "failed" if root["status"] == "error" else "success",
        "final_answer": answer,
        "input_tokens": inp,
        "output_tokens": out,
        "total_tokens": total,
    }


def system_prompt(llms: list[dict[str, Any]]) -> str:
    """The system message of the first LLM call that has one (smolagents' system prompt)."""
    for llm in sorted(llms, key=lambda s: s["start_ns"]):
        if not _may_name_system(llm):
            continue
        for m in input_messages(llm) or []:
            if m["role"] == "system":
                return "\n".join(c["text"] for c in m["content"])
    return ""


def _may_name_system(span: dict[str, Any]) -> bool:
    """Whether the span's input messages can hold a system message: only if the word is written
    in the span (an attribute, a JSON text, a log event's name) or a JSON text in it escapes
    characters (`\\u0073ystem` reads as the word). One C-level pass over the span, where
    building its messages to look (every model call of a run with no system prompt) cost as
    much as the steps' own."""
    try:
        text = orjson.dumps(span)
    except (orjson.JSONEncodeError, TypeError):
        return True
    return b"system" in text or b"\\u" in text
