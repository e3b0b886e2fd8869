"""OpenTelemetry traces (OTLP/HTTP) -> logbook steps: decoding here, the mappings in
`memory_app.interop.otlp_steps`.

Two halves, both without Django:

1. `decode_request` turns an OTLP `ExportTraceServiceRequest` (binary protobuf or the OTLP JSON
   encoding, decoded with `opentelemetry-proto`) into plain span dicts with their resource
   attributes, and refuses anything PostgreSQL could not store. `decode_logs` does the same for
   an `ExportLogsServiceRequest`: the GenAI instrumentations (opentelemetry-instrumentation-
   openai-v2) send the messages of a model call as log events of its span, not as attributes.
2. The mappings read spans that follow the OpenInference semantic conventions
   (`openinference.span.kind` AGENT / CHAIN / LLM / TOOL, `llm.token_count.*`, `tool.name`,
   `input.value` / `output.value`, exception events) or the OpenTelemetry GenAI conventions
   (`gen_ai.operation.name`, `gen_ai.usage.*`, `gen_ai.tool.*`) and build the items
   `steps_append` takes (`otlp_steps`; the span roles and context keys they share are here).

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
import json
import math
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status as RpcStatus
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from memory_app.json_values import reject_constant

PROTOBUF = "application/x-protobuf"


JSON = "application/json"


# Span roles; LOG is a log event kept beside the spans of its trace (see `log_rows`).
AGENT, STEP, LLM, TOOL, OTHER, LOG = "agent", "step", "llm", "tool", "other", "log"


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


NS = 1_000_000_000


INT64_MAX = 2**63 - 1


class TraceFormatError(ValueError):
    """A request body that is not a valid OTLP trace export."""


def _parse(body: bytes, *, content_type: str, message, what: str, convert) -> None:
    """Fill the protobuf `message` from a request body in either OTLP encoding."""
    if content_type == PROTOBUF:
        try:
            message.ParseFromString(body)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise TraceFormatError(f"body is not an OTLP protobuf {what}: {exc}") from None
    elif content_type == JSON:
        try:
            data = json.loads(body, parse_constant=reject_constant)
        except (ValueError, RecursionError) as exc:
            raise TraceFormatError(f"body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise TraceFormatError(f"body must be a JSON object, an OTLP/JSON {what}")
        try:
            # "OTLP/JSON receivers MUST ignore message fields with unknown names" (a newer SDK's
            # fields must not make its spans a 400).
            json_format.ParseDict(convert(data), message, ignore_unknown_fields=True)
        except (
            json_format.ParseError,
            TypeError,
            ValueError,
            AttributeError,
            RecursionError,
        ) as exc:
            raise TraceFormatError(f"body is not an OTLP/JSON {what}: {exc}") from None
    else:
        raise TraceFormatError(f"unsupported content type {content_type!r}")


def decode_request(body: bytes, *, content_type: str) -> list[dict[str, Any]]:
    """The spans of an OTLP export request, each a plain dict (see `_span`)."""
    request = ExportTraceServiceRequest()
    _parse(
        body,
        content_type=content_type,
        message=request,
        what="ExportTraceServiceRequest",
        convert=_ids_hex_to_base64,
    )
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(_span(span, resource=resource, scope=scope_spans.scope.name))
    _check_storable(spans)
    return spans


def decode_logs(body: bytes, *, content_type: str) -> list[dict[str, Any]]:
    """The log records of an OTLP logs export request, each a plain dict: `trace_id` and
    `span_id` (hex, "" when the record belongs to no span), `time_ns`, `name` (the event name),
    `body`, `attributes`, `resource` and `scope`."""
    request = ExportLogsServiceRequest()
    _parse(
        body,
        content_type=content_type,
        message=request,
        what="ExportLogsServiceRequest",
        convert=_log_ids_hex_to_base64,
    )
    records = []
    for resource_logs in request.resource_logs:
        resource = _attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                records.append(_log(record, resource=resource, scope=scope_logs.scope.name))
    _check_storable(records)
    return records


def _log(record, *, resource: dict, scope: str) -> dict[str, Any]:
    time_ns = record.time_unix_nano or record.observed_time_unix_nano
    if time_ns > INT64_MAX:
        raise TraceFormatError("log times must be nanoseconds since the epoch below 2**63")
    attributes = _attributes(record.attributes)
    # Older SDKs name the event in an attribute, newer ones in the record's own field.
    name = record.event_name or attributes.get("event.name") or ""
    return {
        "trace_id": _span_id(record.trace_id, 16, "traceId", required=False),
        "span_id": _span_id(record.span_id, 8, "spanId", required=False),
        "time_ns": time_ns,
        "name": str(name),
        "body": _value(record.body) if record.HasField("body") else None,
        "attributes": attributes,
        "resource": resource,
        "scope": scope,
    }


def encode_response(
    *, content_type: str, rejected: int = 0, message: str = "", logs: bool = False
) -> bytes:
    """The OTLP success answer in the request's encoding (partial success when spans or log
    records were refused)."""
    response = ExportLogsServiceResponse() if logs else ExportTraceServiceResponse()
    if rejected:
        if logs:
            response.partial_success.rejected_log_records = rejected
        else:
            response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if content_type == PROTOBUF:
        return response.SerializeToString()
    return json.dumps(json_format.MessageToDict(response)).encode()


# google.rpc.Code for the HTTP statuses the receiver answers (OTLP clients only log it).
_RPC_CODES = {
    400: 3,
    401: 16,
    403: 7,
    404: 5,
    405: 12,
    409: 10,
    413: 8,
    415: 3,
    422: 3,
    500: 13,
    503: 14,  # UNAVAILABLE: the exporter retries, after Retry-After
}


def encode_error(*, content_type: str, status: int, message: str) -> tuple[bytes, str]:
    """An error answer as OTLP/HTTP requires it: a `google.rpc.Status` in the request's encoding
    (protobuf for protobuf requests, its JSON mapping otherwise). Returns (body, content type)."""
    error = RpcStatus(code=_RPC_CODES.get(status, 2), message=message)  # 2: UNKNOWN
    if content_type == PROTOBUF:
        return error.SerializeToString(), PROTOBUF
    return json.dumps(json_format.MessageToDict(error)).encode(), JSON


def _hex_to_base64(obj: dict, keys: tuple[str, ...]) -> None:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping expects base64."""
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise TraceFormatError(f"{key} must be hex, got {value[:40]!r}") from None


def _ids_hex_to_base64(data: dict) -> dict:
    for rs in _list(data, "resourceSpans"):
        for ss in _list(rs, "scopeSpans"):
            for span in _list(ss, "spans"):
                _hex_to_base64(span, ("traceId", "spanId", "parentSpanId"))
                for link in _list(span, "links"):
                    _hex_to_base64(link, ("traceId", "spanId"))
    return data


def _log_ids_hex_to_base64(data: dict) -> dict:
    for rl in _list(data, "resourceLogs"):
        for sl in _list(rl, "scopeLogs"):
            for record in _list(sl, "logRecords"):
                _hex_to_base64(record, ("traceId", "spanId"))
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
    if kind == "string_value":  # most attributes: answered first
        return any_value.string_value
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
    # Most values are strings: read without a call to `_value` (every attribute of every span).
    out = {}
    for kv in key_values:
        value = kv.value
        if value.WhichOneof("value") == "string_value":
            out[kv.key] = value.string_value
        else:
            out[kv.key] = _value(value)
    return out


_ZEROS = {16: bytes(16), 8: bytes(8)}


def _span_id(raw: bytes, size: int, what: str, *, required: bool = True) -> str:
    if not raw and not required:
        return ""
    if len(raw) != size or raw == _ZEROS[size]:
        raise TraceFormatError(f"{what} must be {size} bytes and not all zero")
    return raw.hex()


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
    """PostgreSQL text and jsonb cannot hold NUL characters: refuse the request, store nothing.

    JSON writes a NUL as the escape `\\u0000`, so a value whose JSON text (orjson: C, a
    fraction of a Python walk over every string) has no such escape holds none; one that does
    (or text that merely reads like it) is walked."""
    try:
        if b"\\u0000" not in orjson.dumps(value):
            return
    except (orjson.JSONEncodeError, TypeError):
        pass
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise TraceFormatError(
                    "a span or log record holds a NUL character (\\u0000), which cannot be stored"
                )
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


LANGCHAIN_SCOPE = "openinference.instrumentation.langchain"


def span_role(span: dict[str, Any]) -> str:
    attrs = span["attributes"]
    kind = attrs.get("openinference.span.kind")
    if isinstance(kind, str) and kind.upper() in _OPENINFERENCE_ROLES:
        role = _OPENINFERENCE_ROLES[kind.upper()]
        # LangChain's CHAIN and AGENT spans are runnables (the graph, its nodes, prompts,
        # routers), not agent steps: in a LangChain or LangGraph trace the model calls are the
        # steps, whatever the graph's nodes are called.
        if span.get("scope") == LANGCHAIN_SCOPE and role in (STEP, AGENT):
            return OTHER
        return role
    return _GENAI_ROLES.get(attrs.get("gen_ai.operation.name"), OTHER)


def context_keys(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """The context the spans of one trace belong to.

    `agentmemory.context.<key>` attributes, on the resource (OTEL_RESOURCE_ATTRIBUTES) or on any
    span of the trace (span wins), give the keys. Without any: `{"service": service.name}` plus
    `{"session": ...}` from `session.id` (OpenInference) or `gen_ai.conversation.id` (GenAI) of
    the first span that has one.
    """
    keys: dict[str, Any] = {}
    # Every span's resource first, then the spans' own attributes over them. The spans of one
    # resource share its dict: read once for a run of them (read again, it writes the same).
    resources = [s["resource"] for s in spans]
    resources = [r for i, r in enumerate(resources) if i == 0 or r is not resources[i - 1]]
    for attrs in resources + [s["attributes"] for s in spans]:
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
    """`smolagents` for openinference.instrumentation.smolagents (`langchain` for LangChain's);
    else `opentelemetry`."""
    scope = span.get("scope") or ""
    if scope.startswith("openinference.instrumentation."):
        return scope.removeprefix("openinference.instrumentation.")[:50]
    return "opentelemetry"
