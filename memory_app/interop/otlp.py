"""OpenTelemetry traces (OTLP/HTTP) -> logbook steps: decoding and pure mappings.

Two halves, both without Django:

1. `decode_request` turns an OTLP `ExportTraceServiceRequest` (binary protobuf or the OTLP JSON
   encoding, decoded with `opentelemetry-proto`) into plain span dicts with their resource
   attributes, and refuses anything PostgreSQL could not store.
2. The mappings read spans that follow the OpenInference semantic conventions
   (`openinference.span.kind` AGENT / CHAIN / LLM / TOOL, `llm.token_count.*`, `tool.name`,
   `input.value` / `output.value`, exception events) or the OpenTelemetry GenAI conventions
   (`gen_ai.operation.name`, `gen_ai.usage.*`, `gen_ai.tool.*`) and build the items
   `steps_append` takes.

How a trace becomes a run (one trace = one run):
- the root span (no parent) is the run: an AGENT / `invoke_agent` root gives the task, the
  agent name, the final answer (`output.value`), the status and the token totals;
- a CHAIN span is an action step (openinference-instrumentation-smolagents names them
  `Step <n>`); the LLM and TOOL spans under it give its model input/output, token usage and
  tool calls; its `output.value` is the observations, an exception event its error;
- an LLM span directly under the run: a planning step when the run also has CHAIN steps
  (smolagents plans outside its steps), otherwise (GenAI-style flat traces: `chat` and
  `execute_tool` spans side by side) an action step that takes the TOOL spans started after it.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status as RpcStatus
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Status

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

# Span roles.
AGENT, STEP, LLM, TOOL, OTHER = "agent", "step", "llm", "tool", "other"
_OPENINFERENCE_ROLES = {"AGENT": AGENT, "CHAIN": STEP, "LLM": LLM, "TOOL": TOOL}
_GENAI_ROLES = {
    "invoke_agent": AGENT,
    "create_agent": AGENT,
    "chat": LLM,
    "text_completion": LLM,
    "generate_content": LLM,
    "execute_tool": TOOL,
}
CONTEXT_PREFIX = "agentmemory.context."
_STEP_NAME = re.compile(r"^Step (\d+)$")
NS = 1_000_000_000
INT64_MAX = 2**63 - 1


class TraceFormatError(ValueError):
    """A request body that is not a valid OTLP trace export."""


# --- decoding ---------------------------------------------------------------------------------


def decode_request(body: bytes, *, content_type: str) -> list[dict[str, Any]]:
    """The spans of an OTLP export request, each a plain dict (see `_span`)."""
    request = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        try:
            request.ParseFromString(body)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise TraceFormatError(
                f"body is not an OTLP protobuf ExportTraceServiceRequest: {exc}"
            ) from None
    elif content_type == JSON:
        try:
            data = json.loads(body, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise TraceFormatError(f"body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise TraceFormatError("body must be a JSON object {resourceSpans: [...]}")
        try:
            # "OTLP/JSON receivers MUST ignore message fields with unknown names" (a newer SDK's
            # fields must not make its spans a 400).
            json_format.ParseDict(_ids_hex_to_base64(data), request, ignore_unknown_fields=True)
        except (
            json_format.ParseError,
            TypeError,
            ValueError,
            AttributeError,
            RecursionError,
        ) as exc:
            raise TraceFormatError(
                f"body is not an OTLP/JSON ExportTraceServiceRequest: {exc}"
            ) from None
    else:
        raise TraceFormatError(f"unsupported content type {content_type!r}")
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(_span(span, resource=resource, scope=scope_spans.scope.name))
    for span in spans:
        _check_storable(span)
    return spans


def encode_response(*, content_type: str, rejected: int = 0, message: str = "") -> bytes:
    """The OTLP success answer in the request's encoding (partial success when spans were
    refused)."""
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if content_type == PROTOBUF:
        return response.SerializeToString()
    return json.dumps(json_format.MessageToDict(response)).encode()


# google.rpc.Code for the HTTP statuses the receiver answers (OTLP clients only log it).
_RPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 409: 10, 413: 8, 415: 3, 422: 3, 500: 13}


def encode_error(*, content_type: str, status: int, message: str) -> tuple[bytes, str]:
    """An error answer as OTLP/HTTP requires it: a `google.rpc.Status` in the request's encoding
    (protobuf for protobuf requests, its JSON mapping otherwise). Returns (body, content type)."""
    error = RpcStatus(code=_RPC_CODES.get(status, 2), message=message)  # 2: UNKNOWN
    if content_type == PROTOBUF:
        return error.SerializeToString(), PROTOBUF
    return json.dumps(json_format.MessageToDict(error)).encode(), JSON


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _ids_hex_to_base64(data: dict) -> dict:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping expects base64."""

    def convert(obj: dict, keys: tuple[str, ...]) -> None:
        for key in keys:
            value = obj.get(key)
            if isinstance(value, str) and value:
                try:
                    obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise TraceFormatError(f"{key} must be hex, got {value[:40]!r}") from None

    for rs in _list(data, "resourceSpans"):
        for ss in _list(rs, "scopeSpans"):
            for span in _list(ss, "spans"):
                convert(span, ("traceId", "spanId", "parentSpanId"))
                for link in _list(span, "links"):
                    convert(link, ("traceId", "spanId"))
    return data


def _list(obj: Any, key: str) -> list:
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None:
        return []
    if not isinstance(value, list):
        raise TraceFormatError(f"{key} must be a list")
    return [v for v in value if isinstance(v, dict)]


def _value(any_value) -> Any:
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(any_value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(any_value.bytes_value).decode()
    if kind == "double_value" and not math.isfinite(any_value.double_value):
        return str(any_value.double_value)  # JSON (and jsonb) has no NaN or infinity
    return getattr(any_value, kind)


def _attributes(key_values) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


def _span_id(raw: bytes, size: int, what: str, *, required: bool = True) -> str:
    if not raw and not required:
        return ""
    if len(raw) != size or not any(raw):
        raise TraceFormatError(f"{what} must be {size} bytes and not all zero")
    return binascii.hexlify(raw).decode()


_STATUS = {Status.STATUS_CODE_OK: "ok", Status.STATUS_CODE_ERROR: "error"}


def _span(span, *, resource: dict, scope: str) -> dict[str, Any]:
    if max(span.start_time_unix_nano, span.end_time_unix_nano) > INT64_MAX:
        raise TraceFormatError("span times must be nanoseconds since the epoch below 2**63")
    return {
        "trace_id": _span_id(span.trace_id, 16, "traceId"),
        "span_id": _span_id(span.span_id, 8, "spanId"),
        "parent_span_id": _span_id(span.parent_span_id, 8, "parentSpanId", required=False),
        "name": span.name,
        "start_ns": span.start_time_unix_nano,
        "end_ns": span.end_time_unix_nano,
        "status": _STATUS.get(span.status.code, "unset"),
        "status_message": span.status.message,
        "attributes": _attributes(span.attributes),
        "events": [
            {"name": e.name, "time_ns": e.time_unix_nano, "attributes": _attributes(e.attributes)}
            for e in span.events
        ],
        "resource": resource,
        "scope": scope,
    }


def _check_storable(value: Any) -> None:
    """PostgreSQL text and jsonb cannot hold NUL characters: refuse the request, store nothing."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise TraceFormatError(
                    "a span holds a NUL character (\\u0000), which cannot be stored"
                )
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


# --- span roles and context keys -----------------------------------------------------------------


def span_role(span: dict[str, Any]) -> str:
    attrs = span["attributes"]
    kind = attrs.get("openinference.span.kind")
    if isinstance(kind, str) and kind.upper() in _OPENINFERENCE_ROLES:
        return _OPENINFERENCE_ROLES[kind.upper()]
    return _GENAI_ROLES.get(attrs.get("gen_ai.operation.name"), OTHER)


def context_keys(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """The context the spans of one trace belong to.

    `agentmemory.context.<key>` attributes, on the resource (OTEL_RESOURCE_ATTRIBUTES) or on any
    span of the trace (span wins), give the keys. Without any: `{"service": service.name}` plus
    `{"session": ...}` from `session.id` (OpenInference) or `gen_ai.conversation.id` (GenAI) of
    the first span that has one.
    """
    keys: dict[str, Any] = {}
    # Every span's resource first, then the spans' own attributes over them.
    for attrs in [s["resource"] for s in spans] + [s["attributes"] for s in spans]:
        for name, value in attrs.items():
            if name.startswith(CONTEXT_PREFIX) and len(name) > len(CONTEXT_PREFIX):
                keys[name[len(CONTEXT_PREFIX) :]] = value
    if keys:
        return keys
    keys["service"] = spans[0]["resource"].get("service.name") or "unknown_service"
    for span in spans:
        session = span["attributes"].get("session.id") or span["attributes"].get(
            "gen_ai.conversation.id"
        )
        if session:
            keys["session"] = session
            break
    return keys


def framework(span: dict[str, Any]) -> str:
    """`smolagents` for openinference.instrumentation.smolagents; else `opentelemetry`."""
    scope = span.get("scope") or ""
    if scope.startswith("openinference.instrumentation."):
        return scope.removeprefix("openinference.instrumentation.")[:50]
    return "opentelemetry"


# --- attribute readers ---------------------------------------------------------------------------


def _seconds(ns: int | None) -> float | None:
    return ns / NS if ns else None


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _indexed(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenInference flattens lists: `<prefix>.<i>.<rest>` -> [{rest: value}, ...] by index."""
    items: dict[int, dict[str, Any]] = {}
    for name, value in attrs.items():
        if not name.startswith(prefix + "."):
            continue
        index, _, rest = name[len(prefix) + 1 :].partition(".")
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


def input_messages(span: dict[str, Any]) -> list[dict[str, Any]] | None:
    """An LLM span's input as chat messages `{role, content: [{type: text, text}]}`."""
    attrs = span["attributes"]
    out = []
    for m in _indexed(attrs, "llm.input_messages"):
        text = _message_text(m)
        out.append(
            {
                "role": m.get("message.role") or "user",
                "content": [{"type": "text", "text": text}] if text is not None else [],
            }
        )
    if not out:
        for m in _genai_messages(attrs, "gen_ai.input.messages"):
            text = _genai_text(m)
            out.append(
                {
                    "role": m.get("role") or "user",
                    "content": [{"type": "text", "text": text}] if text is not None else [],
                }
            )
    return out or None


def output_text(span: dict[str, Any]) -> str | None:
    attrs = span["attributes"]
    for m in _indexed(attrs, "llm.output_messages")[:1]:
        return _message_text(m)
    for m in _genai_messages(attrs, "gen_ai.output.messages")[:1]:
        return _genai_text(m)
    return None


def requested_tool_calls(span: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool calls an LLM span's output asks for: [{call_id, name, arguments}]."""
    attrs = span["attributes"]
    calls = []
    for m in _indexed(attrs, "llm.output_messages")[:1]:
        for tc in _indexed(m, "message.tool_calls"):
            if tc.get("tool_call.function.name"):
                calls.append(
                    {
                        "call_id": str(tc.get("tool_call.id") or ""),
                        "name": str(tc["tool_call.function.name"]),
                        "arguments": _json(tc.get("tool_call.function.arguments")),
                    }
                )
    for m in _genai_messages(attrs, "gen_ai.output.messages")[:1]:
        for part in m.get("parts") or []:
            if isinstance(part, dict) and part.get("type") == "tool_call" and part.get("name"):
                calls.append(
                    {
                        "call_id": str(part.get("id") or ""),
                        "name": str(part["name"]),
                        "arguments": _json(part.get("arguments")),
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


def _tool_output(span: dict[str, Any]) -> str | None:
    attrs = span["attributes"]
    value = attrs.get("gen_ai.tool.call.result", attrs.get("output.value"))
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


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


# --- spans -> logbook items ----------------------------------------------------------------------


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
        call_id = tool["attributes"].get("gen_ai.tool.call.id")
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
            if ran["arguments"] in (None, "", {}):
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


def task_step(root: dict[str, Any]) -> dict[str, Any]:
    start = _seconds(root["start_ns"])
    return {
        "client_id": f"{root['span_id']}:task",
        "kind": "task",
        "task": run_task(root),
        "start_time": start,
        "payload": None,
    }


def run_task(root: dict[str, Any]) -> str:
    attrs = root["attributes"]
    if isinstance(attrs.get("smolagents.task"), str):
        return attrs["smolagents.task"]
    value = _json(attrs.get("input.value"))
    if isinstance(value, dict) and isinstance(value.get("task"), str):
        return value["task"]
    for m in _genai_messages(attrs, "gen_ai.input.messages"):
        if m.get("role") == "user" and (text := _genai_text(m)):
            return text
    return value if isinstance(value, str) else ""


def run_agent_name(root: dict[str, Any]) -> str:
    attrs = root["attributes"]
    name = (
        attrs.get("gen_ai.agent.name")
        or attrs.get("agent.name")
        or root["name"].removesuffix(".run")
    )
    return str(name)[:200]


def run_outcome(root: dict[str, Any]) -> dict[str, Any]:
    """What the run row says once its root span has ended: status, final answer, token totals."""
    attrs = root["attributes"]
    answer = attrs.get("output.value")
    if isinstance(answer, str) and attrs.get("output.mime_type") == "application/json":
        answer = _json(answer)
    if answer is None:
        answer = next(
            (_genai_text(m) for m in _genai_messages(attrs, "gen_ai.output.messages")), None
        )
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
        for m in input_messages(llm) or []:
            if m["role"] == "system":
                return "\n".join(c["text"] for c in m["content"])
    return ""
