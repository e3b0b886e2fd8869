"""A live smolagents agent traced by openinference-instrumentation-smolagents and exported with the
real OTLP HTTP exporter (configured by the README's environment variables) to the live server."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from memory_app import auth
from memory_app.models import Run, ToolCall
from tests.otel_agents import JsonSpanExporter, assert_run_matches_memory, instrumented
from tests.otlp_queue import map_queued
from tests.smol_agents import run_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def secret():
    return auth.apikey_create(name="otel", scopes=("write",)).secret


def check_run(agent, *, tool_calls: bool) -> Run:
    """The run the exporter's requests made, against the agent's own memory: steps, tool calls,
    errors and token counts (tests/otel_agents.py)."""
    [run] = Run.objects.all()
    assert_run_matches_memory(run, agent, tool_calls=tool_calls, keys={"user": "ada", "chat": "42"})
    return run


@pytest.mark.parametrize(
    ("endpoint", "compression"),
    [
        # The standard variables: the exporter appends /v1/traces to the server's address.
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "{server}"}, "none"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "{server}/api/v1/traces"}, "gzip"),
    ],
)
def test_otlp_http_exporter_configured_by_env_records_the_run(
    live_server, secret, monkeypatch, endpoint, compression
):
    for name, value in endpoint.items():
        monkeypatch.setenv(name, value.format(server=live_server.url))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{secret}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", compression)
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "agentmemory.context.user=ada,agentmemory.context.chat=42"
    )
    # Small batches, so the run arrives in several requests as a long run would.
    processor = BatchSpanProcessor(
        OTLPSpanExporter(), max_export_batch_size=3, schedule_delay_millis=50
    )
    with instrumented(processor) as provider:
        agent = run_agent("tool_calling")
        assert provider.force_flush()
    map_queued()
    run = check_run(agent, tool_calls=True)
    assert run.final_answer == "Sunny, 22C"
    calls = list(ToolCall.objects.filter(step__run=run).order_by("step__position", "position"))
    assert [(c.name, c.call_id, c.success) for c in calls] == [
        ("get_weather", "call_w1", True),
        ("get_population", "call_p1", False),
        ("final_answer", "call_f1", True),
    ]
    assert (
        calls[0].arguments == {"location": "Paris", "unit": "C"}
        and calls[0].output == "Sunny in Paris, 22C"
    )


def test_otlp_json_encoding_records_the_run(live_server, secret, monkeypatch):
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "agentmemory.context.user=ada,agentmemory.context.chat=42"
    )
    exporter = JsonSpanExporter(
        f"{live_server.url}/api/v1/traces", {"Authorization": f"Bearer {secret}"}
    )
    with instrumented(SimpleSpanProcessor(exporter)):
        agent = run_agent("code")
    assert set(exporter.statuses) == {200}
    map_queued()
    # CodeAgent's python_interpreter call is not in its trace (README, "Not mapped").
    run = check_run(agent, tool_calls=False)
    assert str(run.final_answer) == "1024"
