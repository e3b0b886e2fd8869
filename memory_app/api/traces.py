"""OTLP/HTTP trace receiver: `POST /api/v1/traces`, also served at the standard `POST /v1/traces`
(agentmemory_site/urls.py), so OTEL_EXPORTER_OTLP_ENDPOINT=<server> is all an exporter needs.
Log events of the traced spans (where GenAI instrumentations put message content) arrive at
`POST /api/v1/logs` and `POST /v1/logs`, with the same encodings, limits and errors.

Binary protobuf (`application/x-protobuf`, what the Python and most SDK exporters send) and the
OTLP JSON encoding (`application/json`), optionally gzip- or deflate-compressed. Success answers
an `ExportTraceServiceResponse` in the request's encoding. Errors have a status an exporter does
not retry (400, 401, 403, 413, 415) and, as OTLP/HTTP requires of every 4xx/5xx answer, a
`google.rpc.Status` body in the request's encoding (`OtlpErrorMiddleware` re-encodes the API's
`{"detail": ...}`, so the message is the same).
"""

from __future__ import annotations

import json
import zlib

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from ninja import Router, Schema
from ninja.errors import HttpError
from pydantic import ConfigDict

from memory_app import errors
from memory_app.api.common import WRITE_ERRORS, require_scope
from memory_app.interop import otlp
from memory_app.services import span_queue

router = Router(tags=["traces"])

_DECOMPRESSORS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _body(request: HttpRequest) -> bytes:
    """The request body, decompressed; more than the body limit once decompressed is a 413."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return request.body
    if encoding not in _DECOMPRESSORS:
        raise HttpError(
            415, f"unsupported Content-Encoding {encoding!r}: use gzip, deflate or none"
        )
    limit = settings.MAX_REQUEST_BODY_BYTES
    decompressor = zlib.decompressobj(_DECOMPRESSORS[encoding])
    try:
        data = decompressor.decompress(request.body, limit + 1)
        if len(data) > limit:
            raise HttpError(413, f"decompressed body is over the limit of {limit} bytes")
        if not decompressor.eof:
            raise HttpError(400, f"body is not complete {encoding} data")
    except zlib.error as exc:
        raise HttpError(400, f"body is not valid {encoding} data: {exc}") from None
    return data


# Where the receiver answers (agentmemory_site/urls.py).
OTLP_PATHS = frozenset({"/api/v1/traces", "/v1/traces", "/api/v1/logs", "/v1/logs"})


class OtlpStatusOut(Schema):
    """An error of the trace receiver: `google.rpc.Status` (protobuf for protobuf requests)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"code": 7, "message": "this API key lacks the 'write' scope"}]
        }
    )

    code: int
    message: str


class OtlpErrorMiddleware:
    """Error answers of the trace receiver in OTLP's form: "the response body for all HTTP 4xx and
    HTTP 5xx responses MUST be a Protobuf-encoded Status message", in the request's encoding
    (OTLP/HTTP). Whatever answered the error (key check, body limit, the receiver itself), its
    `{"detail": ...}` becomes the Status message; status code and headers stay."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path not in OTLP_PATHS or response.status_code < 400 or response.streaming:
            return response
        body, content_type = otlp.encode_error(
            content_type=(request.content_type or "").lower(),
            status=response.status_code,
            message=_error_message(response),
        )
        response.content = body
        response["Content-Type"] = content_type
        response["Content-Length"] = str(len(body))
        return response


def _error_message(response: HttpResponse) -> str:
    if response.get("Content-Type", "").startswith("application/json"):
        try:
            detail = json.loads(response.content)["detail"]
        except (ValueError, TypeError, KeyError):
            pass
        else:
            return detail if isinstance(detail, str) else json.dumps(detail)
    return response.reason_phrase


_ERRORS = (*WRITE_ERRORS, 415)
_PARTIAL = {
    "partialSuccess": {
        "rejectedSpans": "1",
        "errorMessage": "spans sent before with different content ...",
    }
}


@router.post(
    "/traces",
    response={200: None, **dict.fromkeys(_ERRORS, OtlpStatusOut)},
    summary="Receive OpenTelemetry traces (OTLP/HTTP)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                otlp.PROTOBUF: {
                    "schema": {"type": "string", "format": "binary"},
                    "example": "<ExportTraceServiceRequest, binary protobuf>",
                },
                otlp.JSON: {
                    "schema": {
                        "type": "object",
                        "properties": {"resourceSpans": {"type": "array"}},
                    },
                    "example": {
                        "resourceSpans": [
                            {
                                "resource": {
                                    "attributes": [
                                        {
                                            "key": "agentmemory.context.user",
                                            "value": {"stringValue": "ada"},
                                        }
                                    ]
                                },
                                "scopeSpans": [
                                    {
                                        "spans": [
                                            {
                                                "traceId": "5b8efff798038103d269b633813fc60c",
                                                "spanId": "eee19b7ec3c1b174",
                                                "name": "ToolCallingAgent.run",
                                                "startTimeUnixNano": "1700000000000000000",
                                                "endTimeUnixNano": "1700000001000000000",
                                                "attributes": [
                                                    {
                                                        "key": "openinference.span.kind",
                                                        "value": {"stringValue": "AGENT"},
                                                    }
                                                ],
                                            }
                                        ]
                                    }
                                ],
                            }
                        ]
                    },
                },
            },
        },
        "responses": {
            200: {
                "description": (
                    "ExportTraceServiceResponse in the request's encoding (empty on full success)"
                ),
                "content": {
                    otlp.PROTOBUF: {
                        "schema": {"type": "string", "format": "binary"},
                        "example": "",
                    },
                    otlp.JSON: {
                        "schema": {"type": "object"},
                        "examples": {"ok": {"value": {}}, "partial": {"value": _PARTIAL}},
                    },
                },
            },
            **{
                code: {
                    "content": {
                        otlp.PROTOBUF: {
                            "schema": {"type": "string", "format": "binary"},
                            "example": "",
                        }
                    }
                }
                for code in _ERRORS
            },
        },
    },
)
def traces_export(request: HttpRequest):
    """Spans following the OpenInference or OpenTelemetry GenAI conventions become runs, steps and
    tool calls (see README, "OpenTelemetry"). Re-sent or split batches are idempotent: span ids
    are client ids. Needs the `write` scope; context keys outside the key's confinement are 403."""
    return _export(request, logs=False)


_LOGS_PARTIAL = {
    "partialSuccess": {
        "rejectedLogRecords": "1",
        "errorMessage": "log records outside any span (no trace and span id) are not kept ...",
    }
}
_PROTOBUF_ERRORS = {
    code: {
        "content": {
            otlp.PROTOBUF: {
                "schema": {"type": "string", "format": "binary"},
                "example": "",
            }
        }
    }
    for code in _ERRORS
}
_LOG_EXAMPLE = {
    "resourceLogs": [
        {
            "scopeLogs": [
                {
                    "logRecords": [
                        {
                            "timeUnixNano": "1700000000500000000",
                            "eventName": "gen_ai.user.message",
                            "traceId": "5b8efff798038103d269b633813fc60c",
                            "spanId": "eee19b7ec3c1b174",
                            "body": {
                                "kvlistValue": {
                                    "values": [
                                        {
                                            "key": "content",
                                            "value": {"stringValue": "Weather in Paris?"},
                                        }
                                    ]
                                }
                            },
                        }
                    ]
                }
            ]
        }
    ]
}


@router.post(
    "/logs",
    response={200: None, **dict.fromkeys(_ERRORS, OtlpStatusOut)},
    summary="Receive OpenTelemetry log events (OTLP/HTTP)",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                otlp.PROTOBUF: {
                    "schema": {"type": "string", "format": "binary"},
                    "example": "<ExportLogsServiceRequest, binary protobuf>",
                },
                otlp.JSON: {
                    "schema": {
                        "type": "object",
                        "properties": {"resourceLogs": {"type": "array"}},
                    },
                    "example": _LOG_EXAMPLE,
                },
            },
        },
        "responses": {
            200: {
                "description": (
                    "ExportLogsServiceResponse in the request's encoding (partial success "
                    "counts the records outside any span, which are not kept)"
                ),
                "content": {
                    otlp.PROTOBUF: {
                        "schema": {"type": "string", "format": "binary"},
                        "example": "",
                    },
                    otlp.JSON: {
                        "schema": {"type": "object"},
                        "examples": {"ok": {"value": {}}, "partial": {"value": _LOGS_PARTIAL}},
                    },
                },
            },
            **_PROTOBUF_ERRORS,
        },
    },
)
def logs_export(request: HttpRequest):
    """Log events of traced spans: the GenAI instrumentations (opentelemetry-instrumentation-
    openai-v2) send a model call's messages and choices as events of its span; they join the step
    that span makes (see README, "OpenTelemetry"). Re-sent records are kept once. Needs the
    `write` scope; context keys outside the key's confinement are 403."""
    return _export(request, logs=True)


def _export(request: HttpRequest, *, logs: bool) -> HttpResponse:
    key = require_scope(request, "write")
    content_type = (request.content_type or "").lower()
    if content_type not in (otlp.PROTOBUF, otlp.JSON):
        raise HttpError(
            415,
            f"Content-Type must be {otlp.PROTOBUF} or {otlp.JSON}, got {content_type or 'none'!r}",
        )
    body = _body(request)
    try:
        if logs:
            records = otlp.decode_logs(body, content_type=content_type)
            result = span_queue.logs_receive(key=key, records=records)
        else:
            result = span_queue.traces_receive(key=key, body=body, content_type=content_type)
    except otlp.TraceFormatError as exc:
        raise HttpError(400, str(exc)) from None
    except errors.KeysNotAllowed as exc:
        raise HttpError(403, str(exc)) from None
    message = ""
    if result["rejected"] and logs:
        message = (
            "log records outside any span (no trace and span id) are not kept: "
            f"records {result['rejected_ids'][:10]}"
        )
    elif result["rejected"]:
        message = (
            "spans sent before with different content were kept as first received: "
            f"{result['rejected_ids'][:10]}"
        )
    return HttpResponse(
        otlp.encode_response(
            content_type=content_type, rejected=result["rejected"], message=message, logs=logs
        ),
        content_type=content_type,
    )
