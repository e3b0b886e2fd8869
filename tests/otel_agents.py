"""Real smolagents agents traced by openinference-instrumentation-smolagents (OpenTelemetry SDK),
and the OTLP requests their spans make: protobuf from the SDK's own encoder, OTLP/JSON from it."""

from __future__ import annotations

import base64
import contextlib
import json

import httpx
import pytest
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
    """OTLP/HTTP with the JSON encoding (the JavaScript SDK's default; Python ships only
    protobuf)."""

    def __init__(self, endpoint: str, headers: dict[str, str]):
        self.endpoint, self.headers = endpoint, headers
        self.statuses: list[int] = []

    def export(self, spans):
        response = httpx.post(
            self.endpoint,
            content=json_body(spans),
            headers={**self.headers, "Content-Type": "application/json"},
        )
        self.statuses.append(response.status_code)
        return SpanExportResult.SUCCESS if response.is_success else SpanExportResult.FAILURE

    def shutdown(self):
        pass


def expected_steps(agent) -> list[dict]:
    """The agent's own memory as logbook items, through the smolagents import's step mapping."""
    return [smol.step_to_logbook(s) for s in jsonable(agent.memory.get_full_steps())]


def assert_run_matches_memory(run, agent, *, tool_calls: bool, keys: dict):
    """The stored run against agent.memory: kinds, step numbers, tokens, errors, tool calls."""
    expected = expected_steps(agent)
    steps = list(run.steps.order_by("position"))
    assert [s.kind for s in steps] == [e["kind"] for e in expected]
    for step, want in zip(steps, expected, strict=True):
        assert (step.input_tokens, step.output_tokens, step.total_tokens) == (
            want["input_tokens"],
            want["output_tokens"],
            want["total_tokens"],
        ), step.kind
        if want["start_time"] is not None:  # a TaskStep has no timing
            assert step.start_time == pytest.approx(want["start_time"], abs=0.5)
        if step.kind == "task":
            assert step.task == want["task"]
        if step.kind != "action":
            continue
        assert step.step_number == want["step_number"]
        assert (step.error_type, step.error_message) == (want["error_type"], want["error_message"])
        assert step.observations == want["observations"]
        assert step.model_output == want["model_output"]
        assert step.is_final_answer == want["is_final_answer"]
        if tool_calls:
            got = [
                {k: getattr(tc, k) for k in ("call_id", "name", "arguments", "output", "success")}
                for tc in step.tool_calls.order_by("position")
            ]
            # smolagents drops the calls of a step whose tool raised (it sets memory_step.tool_calls
            # after the loop); the trace still has it, kept as a failed call.
            assert [c for c in got if c["success"]] == [
                {k: c[k] for k in ("call_id", "name", "arguments", "output", "success")}
                for c in want["tool_calls"]
            ]
            if step.error_type == "AgentToolExecutionError":
                assert [c for c in got if not c["success"]] == [
                    {
                        "call_id": "call_p1",
                        "name": "get_population",
                        "arguments": {"city": "Paris"},
                        "output": None,
                        "success": False,
                    }
                ]
    memory = agent.memory.steps
    assert run.input_tokens == sum(
        s.token_usage.input_tokens for s in memory if getattr(s, "token_usage", None)
    )
    assert run.output_tokens == sum(
        s.token_usage.output_tokens for s in memory if getattr(s, "token_usage", None)
    )
    assert run.error_count == sum(1 for e in expected if e.get("error_type")) == 1
    assert run.status == "success"
    assert run.system_prompt == agent.memory.system_prompt.system_prompt
    assert run.task == agent.task
    assert run.context.keys == keys
