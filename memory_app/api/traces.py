"""OTLP/HTTP trace receiver: `POST /api/v1/traces`, also served at the standard `POST /v1/traces`
(agentmemory_site/urls.py), so OTEL_EXPORTER_OTLP_ENDPOINT=<server> is all an exporter needs.

Binary protobuf (`application/x-protobuf`, what the Python and most SDK exporters send) and the
OTLP JSON encoding (`application/json`), optionally gzip- or deflate-compressed. Success answers
an `ExportTraceServiceResponse` in the request's encoding; errors are this API's JSON
`{"detail": ...}` with a status an exporter does not retry (400, 401, 403, 413, 415).
"""

from __future__ import annotations

import zlib

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from ninja import Router
from ninja.errors import HttpError

from memory_app import traces
from memory_app.api.common import WRITE_ERRORS, require_scope, responses
from memory_app.interop import otlp

router = Router(tags=["traces"])

_DECOMPRESSORS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _body(request: HttpRequest) -> bytes:
    """The request body, decompressed; more than the body limit once decompressed is a 413."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return request.body
    if encoding not in _DECOMPRESSORS:
        raise HttpError(415, f"unsupported Content-Encoding {encoding!r}: use gzip, deflate or none")
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


_PARTIAL = {"partialSuccess": {"rejectedSpans": "1", "errorMessage": "spans sent before with different content ..."}}


@router.post(
    "/traces",
    response=responses({200: None}, (*WRITE_ERRORS, 415)),
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
                    "schema": {"type": "object", "properties": {"resourceSpans": {"type": "array"}}},
                    "example": {"resourceSpans": [{
                        "resource": {"attributes": [
                            {"key": "agentmemory.context.user", "value": {"stringValue": "ada"}}]},
                        "scopeSpans": [{"spans": [{
                            "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
                            "name": "ToolCallingAgent.run", "startTimeUnixNano": "1700000000000000000",
                            "endTimeUnixNano": "1700000001000000000",
                            "attributes": [{"key": "openinference.span.kind", "value": {"stringValue": "AGENT"}}],
                        }]}],
                    }]},
                },
            },
        },
        "responses": {200: {
            "description": "ExportTraceServiceResponse in the request's encoding (empty on full success)",
            "content": {
                otlp.PROTOBUF: {"schema": {"type": "string", "format": "binary"}, "example": ""},
                otlp.JSON: {"schema": {"type": "object"}, "examples": {"ok": {"value": {}}, "partial": {"value": _PARTIAL}}},
            },
        }},
    },
)
def traces_export(request: HttpRequest):
    """Spans following the OpenInference or OpenTelemetry GenAI conventions become runs, steps and
    tool calls (see README, "OpenTelemetry"). Re-sent or split batches are idempotent: span ids
    are client ids. Needs the `write` scope; context keys outside the key's confinement are 403."""
    key = require_scope(request, "write")
    content_type = (request.content_type or "").lower()
    if content_type not in (otlp.PROTOBUF, otlp.JSON):
        raise HttpError(415, f"Content-Type must be {otlp.PROTOBUF} or {otlp.JSON}, got {content_type or 'none'!r}")
    try:
        spans = otlp.decode_request(_body(request), content_type=content_type)
    except otlp.TraceFormatError as exc:
        raise HttpError(400, str(exc)) from None
    try:
        result = traces.traces_ingest(key=key, spans=spans)
    except traces.KeysNotAllowed as exc:
        raise HttpError(403, str(exc)) from None
    message = ""
    if result["rejected"]:
        message = f"spans sent before with different content were kept as first received: {result['rejected_ids'][:10]}"
    return HttpResponse(
        otlp.encode_response(content_type=content_type, rejected=result["rejected"], message=message),
        content_type=content_type,
    )
