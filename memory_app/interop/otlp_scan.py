"""What the OTLP receiver reads of a trace export before it queues it, without decoding its spans.

Placing and idempotency need only each span's trace and span ids and the attributes that name a
context (`agentmemory.context.*`, `session.id`, `gen_ai.conversation.id`, with the resource's);
the mapper decodes the rest from the queued protobuf (`otlp.decode_request`). The refusals stay
the receiver's, so a bad export is a 400 with nothing queued: an unparsable body, bad ids or
times, a span id twice, and a NUL character in anything the mapping keeps (PostgreSQL text and
`jsonb` cannot hold one).

Reading every attribute of every span through the generated messages is most of what decoding
costs, so the scan reads a span's attributes only when it has to, on evidence from one C-level
pass: the export parsed again with `_STRINGS`, a schema that keeps only the fields the mapping
decodes as text (span and event names, attributes, the status), serialised back. A NUL inside one
of those texts is a 0 byte in that serialisation, so a serialisation without one proves the
export has none; one with a 0 byte (a number in an attribute value can hold one) has each of its
spans' texts read. Likewise a span whose serialisation does not hold a context attribute's name
has none, and its attributes are not read for its context.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from memory_app.interop import otlp

_FIELD = descriptor_pb2.FieldDescriptorProto


def _strings_schema():
    """The OTLP trace export as far as the mapping reads text: field numbers as in
    opentelemetry-proto's trace.proto. An attribute and the status are raw bytes, not messages:
    an empty value (a proto3 scalar) is then left out of the serialisation, where an empty
    message (an attribute holding a number, once the number is dropped; an unset status) would
    write a 0 length."""
    file = descriptor_pb2.FileDescriptorProto(
        name="agentmemory/otlp_strings.proto", package="agentmemory_otlp", syntax="proto3"
    )
    for name, fields in (
        ("Request", [(1, "resource_spans", "ResourceSpans")]),
        ("ResourceSpans", [(2, "scope_spans", "ScopeSpans")]),
        ("ScopeSpans", [(2, "spans", "Span")]),
        (
            "Span",
            [
                (5, "name", None),
                (9, "attributes", []),
                (11, "events", "Event"),
                (15, "status", None),
            ],
        ),
        ("Event", [(2, "name", None), (3, "attributes", [])]),
    ):
        message = file.message_type.add(name=name)
        for number, field_name, kind in fields:
            field = message.field.add(name=field_name, number=number)
            if isinstance(kind, str):
                field.type, field.label = _FIELD.TYPE_MESSAGE, _FIELD.LABEL_REPEATED
                field.type_name = f".agentmemory_otlp.{kind}"
            else:
                field.type = _FIELD.TYPE_BYTES
                field.label = _FIELD.LABEL_REPEATED if kind == [] else _FIELD.LABEL_OPTIONAL
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("agentmemory_otlp.Request"))


_STRINGS = _strings_schema()


# Attribute names that place a trace (`otlp.context_keys`), as they are written on the wire.
_SESSION_KEYS = ("session.id", "gen_ai.conversation.id")
_PLACING = (otlp.CONTEXT_PREFIX.encode(), *(k.encode() for k in _SESSION_KEYS))


class Scan:
    """A trace export read as far as the receiver needs: `rows` in the export's order, each
    `{"index", "trace_id", "span_id", "data": {"resource", "attributes"}}` with only the
    attributes that place it (what `traces.traces_place` reads), and `body`, the export's
    protobuf."""

    def __init__(self, request: ExportTraceServiceRequest, body: bytes):
        self.request = request
        self.body = body
        self.rows: list[dict[str, Any]] = []
        # Each row's span message, its resource's attributes and its scope's name.
        self.where: list[tuple[Any, dict[str, Any], str]] = []

    def span(self, index: int) -> dict[str, Any]:
        """Row `index` decoded as `otlp.decode_request` decodes it."""
        span, resource, scope = self.where[index]
        return otlp._span(span, resource=resource, scope=scope)

    def body_of(self, indexes: set[int]) -> bytes:
        """The export with only the spans of these rows (each resource and scope kept with its
        spans), as protobuf."""
        if len(indexes) == len(self.rows):
            return self.body
        out = ExportTraceServiceRequest()
        index = 0
        for resource_spans in self.request.resource_spans:
            counts = [len(s.spans) for s in resource_spans.scope_spans]
            taken = [i for i in range(index, index + sum(counts)) if i in indexes]
            if len(taken) == sum(counts) and taken:
                out.resource_spans.append(resource_spans)
            elif taken:
                kept = out.resource_spans.add(schema_url=resource_spans.schema_url)
                kept.resource.CopyFrom(resource_spans.resource)
                for scope_spans, count in zip(resource_spans.scope_spans, counts, strict=True):
                    spans = [s for i, s in enumerate(scope_spans.spans) if index + i in indexes]
                    if spans:
                        scope = kept.scope_spans.add(schema_url=scope_spans.schema_url)
                        scope.scope.CopyFrom(scope_spans.scope)
                        scope.spans.extend(spans)
                    index += count
                continue
            index += sum(counts)
        return out.SerializeToString()


def scan_request(body: bytes, *, content_type: str) -> Scan:
    """Read an OTLP trace export (either encoding) as `Scan` says; refuses what
    `otlp.decode_request` refuses (`otlp.TraceFormatError`)."""
    request = ExportTraceServiceRequest()
    otlp._parse(
        body,
        content_type=content_type,
        message=request,
        what="ExportTraceServiceRequest",
        convert=otlp._ids_hex_to_base64,
    )
    scan = Scan(request, body if content_type == otlp.PROTOBUF else request.SerializeToString())
    strings = _STRINGS.FromString(scan.body)
    strings.DiscardUnknownFields()
    text = strings.SerializeToString()
    suspect = b"\x00" in text
    placing = any(name in text for name in _PLACING)
    for resource_spans, texts in zip(request.resource_spans, strings.resource_spans, strict=True):
        resource = otlp._attributes(resource_spans.resource.attributes)
        otlp._check_storable(resource)
        for scope_spans, scope_texts in zip(
            resource_spans.scope_spans, texts.scope_spans, strict=True
        ):
            scope = scope_spans.scope.name
            otlp._check_storable(scope)
            for i, span in enumerate(scope_spans.spans):
                attributes = {}
                if suspect or placing:
                    own = scope_texts.spans[i].SerializeToString()
                    if suspect and b"\x00" in own:
                        otlp._check_storable(otlp._span(span, resource=resource, scope=scope))
                    if placing and any(name in own for name in _PLACING):
                        attributes = _placing(span.attributes)
                scan.rows.append(_row(len(scan.rows), span, resource, attributes))
                scan.where.append((span, resource, scope))
    return scan


def _row(index: int, span, resource: dict, attributes: dict[str, Any]) -> dict[str, Any]:
    """The span's row, its ids and times checked as `otlp._span` checks them (written out: this
    runs for every span of every export)."""
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    if (
        len(trace_id) != 16
        or trace_id == _ZERO_TRACE
        or len(span_id) != 8
        or span_id == _ZERO_SPAN
        or (parent and (len(parent) != 8 or parent == _ZERO_SPAN))
        or max(span.start_time_unix_nano, span.end_time_unix_nano) > otlp.INT64_MAX
    ):
        otlp._span(span, resource=resource, scope="")  # raises, saying which
    return {
        "index": index,
        "trace_id": trace_id.hex(),
        "span_id": span_id.hex(),
        "data": {"resource": resource, "attributes": attributes},
    }


_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)


def _placing(key_values) -> dict[str, Any]:
    """The attributes among these that place a trace, decoded."""
    return {
        kv.key: otlp._value(kv.value)
        for kv in key_values
        if kv.key.startswith(otlp.CONTEXT_PREFIX) or kv.key in _SESSION_KEYS
    }
