"""Real smolagents agents traced by openinference-instrumentation-smolagents (OpenTelemetry SDK),
and the OTLP requests their spans make: protobuf from the SDK's own encoder, OTLP/JSON from it."""

from __future__ import annotations

import base64
import contextlib
import json

import httpx
import smolagents
from google.protobuf import json_format
from openinference.instrumentation.smolagents import SmolagentsInstrumentor
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from memory_app.interop import smolagents as smol
from tests.smol_agents import ScriptedModel, jsonable, run_agent


@contextlib.contextmanager
def instrumented(*processors, resource: dict | None = None):
    """smolagents instrumented for the block, spans going to `processors`.

    The instrumentor wraps `generate` of the model classes smolagents exports; the scripted
    model is registered there like a provider model so its calls are traced as LLM spans.
    """
    provider = TracerProvider(resource=Resource.create(resource or {}))
    for p in processors:
        provider.add_span_processor(p)
    smolagents.ScriptedModel = ScriptedModel
    instrumentor = SmolagentsInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield provider
    finally:
        instrumentor.uninstrument()
        del smolagents.ScriptedModel
        provider.shutdown()


def traced_run(kind: str, resource: dict | None = None):
    """(agent, finished spans) of one scripted run."""
    exporter = InMemorySpanExporter()
    with instrumented(SimpleSpanProcessor(exporter), resource=resource):
        agent = run_agent(kind)
    return agent, list(exporter.get_finished_spans())


def protobuf_body(spans) -> bytes:
    return encode_spans(spans).SerializeToString()


def json_body(spans) -> bytes:
    """OTLP/JSON: protobuf's JSON mapping with trace and span ids as hex (OTLP spec)."""
    data = json_format.MessageToDict(encode_spans(spans))
    for rs in data.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(data).encode()


class JsonSpanExporter(SpanExporter):
    """OTLP/HTTP with the JSON encoding (the JavaScript SDK's default; Python ships only protobuf)."""

    def __init__(self, endpoint: str, headers: dict[str, str]):
        self.endpoint, self.headers = endpoint, headers
        self.statuses: list[int] = []

    def export(self, spans):
        response = httpx.post(self.endpoint, content=json_body(spans),
                              headers={**self.headers, "Content-Type": "application/json"})
        self.statuses.append(response.status_code)
        return SpanExportResult.SUCCESS if response.is_success else SpanExportResult.FAILURE

    def shutdown(self):
        pass


def expected_steps(agent) -> list[dict]:
    """The agent's own memory as logbook items, through the smolagents import's step mapping."""
    return [smol.step_to_logbook(s) for s in jsonable(agent.memory.get_full_steps())]
