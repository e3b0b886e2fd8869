"""OpenTelemetry ingest at POST /api/v1/traces: real smolagents runs traced by
openinference-instrumentation-smolagents become runs whose steps match the agent's own memory."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from memory_app.models import Context, Run, Step, ToolCall, TraceSpan
from tests.api_helpers import make_key
from tests.otel_agents import assert_run_matches_memory, json_body, protobuf_body, traced_run
from tests.otlp_queue import mapped

pytestmark = pytest.mark.django_db

URL = "/api/v1/traces"
PROTO = "application/x-protobuf"
KEYS = {
    "agentmemory.context.user": "ada",
    "agentmemory.context.app": "weather",
    "service.name": "weather-bot",
}
CONTEXT = {"user": "ada", "app": "weather"}


def post(client, body: bytes, content_type: str = PROTO, url: str = URL, **headers):
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
    return mapped(
        client.client.generic(
            "POST", url, body, content_type=content_type, **client._headers(), **extra
        )
    )


@pytest.fixture
def writer():
    return make_key(scopes=("read", "write"))


@pytest.fixture(scope="module")
def tool_run():
    return traced_run("tool_calling", resource=KEYS)


@pytest.fixture(scope="module")
def code_run():
    return traced_run("code", resource=KEYS)


def stored_run() -> Run:
    [run] = Run.objects.all()
    return run


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_tool_calling_run_matches_the_agents_memory(writer, tool_run, encoding):
    agent, spans = tool_run
    body, content_type = (
        (protobuf_body(spans), PROTO)
        if encoding == "protobuf"
        else (json_body(spans), "application/json")
    )
    response = post(writer, body, content_type)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == content_type
    run = stored_run()
    assert_run_matches_memory(run, agent, tool_calls=True, keys=CONTEXT)
    assert run.final_answer == "Sunny, 22C"
    assert run.framework == "smolagents" and run.agent_name == "ToolCallingAgent"


def test_code_agent_run_matches_the_agents_memory(writer, code_run):
    agent, spans = code_run
    assert post(writer, protobuf_body(spans)).status_code == 200
    run = stored_run()
    assert_run_matches_memory(run, agent, tool_calls=False, keys=CONTEXT)
    assert str(run.final_answer) == "1024"
    assert run.steps.get(is_final_answer=True).step_number == 2


def test_the_standard_otlp_path_at_the_site_root_is_the_same_receiver(writer, tool_run, settings):
    """OTEL_EXPORTER_OTLP_ENDPOINT=<server> makes exporters post to <server>/v1/traces."""
    agent, spans = tool_run
    body = protobuf_body(spans)
    anonymous = make_key()
    anonymous.secret = None
    assert post(anonymous, body, url="/v1/traces").status_code == 401
    assert post(make_key(scopes=("read",)), body, url="/v1/traces").status_code == 403
    limit = settings.MAX_REQUEST_BODY_BYTES
    settings.MAX_REQUEST_BODY_BYTES = len(body) - 1
    assert post(writer, body, url="/v1/traces").status_code == 413
    assert nothing_written()
    settings.MAX_REQUEST_BODY_BYTES = limit
    response = post(writer, body, url="/v1/traces")
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == PROTO
    assert_run_matches_memory(stored_run(), agent, tool_calls=True, keys=CONTEXT)


def test_gzip_body_is_accepted(writer, tool_run):
    agent, spans = tool_run
    response = post(writer, gzip.compress(protobuf_body(spans)), content_encoding="gzip")
    assert response.status_code == 200, response.content
    assert stored_run().step_count == len(agent.memory.steps)


def test_sending_the_same_batch_twice_writes_nothing_new(writer, tool_run):
    _, spans = tool_run
    body = protobuf_body(spans)
    assert post(writer, body).status_code == 200
    before = (Step.objects.count(), ToolCall.objects.count(), TraceSpan.objects.count())
    response = post(writer, body)
    assert response.status_code == 200
    assert (Step.objects.count(), ToolCall.objects.count(), TraceSpan.objects.count()) == before
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_split_and_retried_batches_give_the_same_run(writer, tool_run, seed):
    """A batch processor sends spans as they end (children before parents), in requests of any
    size; a timed-out request is sent again, possibly after later ones."""
    agent, spans = tool_run
    rng = random.Random(seed)
    by_end = sorted(spans, key=lambda s: s.end_time)
    cuts = sorted(rng.sample(range(1, len(by_end)), 3))
    batches = [by_end[a:b] for a, b in zip([0, *cuts], [*cuts, len(by_end)], strict=True)]
    sent = []
    for batch in batches:
        sent.append(batch)
        if rng.random() < 0.5:
            sent.append(rng.choice(sent))
    for batch in sent:
        assert post(writer, protobuf_body(batch)).status_code == 200
    run = stored_run()
    steps = list(run.steps.order_by("position"))
    assert [s.start_time for s in steps] == sorted(s.start_time for s in steps)
    assert_run_matches_memory(run, agent, tool_calls=True, keys=CONTEXT)


def test_steps_end_up_in_start_order_when_the_root_comes_first(writer, tool_run):
    agent, spans = tool_run
    by_end = sorted(spans, key=lambda s: s.end_time)
    root, rest = by_end[-1], by_end[:-1]
    assert post(writer, protobuf_body([root])).status_code == 200
    assert post(writer, protobuf_body(rest)).status_code == 200
    run = stored_run()
    assert [s.kind for s in run.steps.order_by("position")] == [
        "task",
        "planning",
        "action",
        "action",
        "action",
    ]
    assert run.status == "success" and run.input_tokens == 510


def test_split_batches_in_export_order_show_steps_before_the_run_ends(writer, tool_run):
    agent, spans = tool_run
    by_end = sorted(spans, key=lambda s: s.end_time)
    first_step_done = next(i for i, s in enumerate(by_end) if s.name == "Step 1") + 1
    assert post(writer, protobuf_body(by_end[:first_step_done])).status_code == 200
    run = stored_run()
    assert run.status == "running"
    # The planning call beside Step 1 is known to be a planning step as soon as Step 1 arrives.
    assert [(s.kind, s.step_number) for s in run.steps.order_by("position")] == [
        ("planning", None),
        ("action", 1),
    ]
    assert ToolCall.objects.get(step__run=run).name == "get_weather"
    assert post(writer, protobuf_body(by_end[first_step_done:])).status_code == 200
    run.refresh_from_db()
    assert run.status == "success"
    assert_run_matches_memory(run, agent, tool_calls=True, keys=CONTEXT)


def test_a_changed_resent_span_is_reported_and_the_first_kept(writer, tool_run):
    _, spans = tool_run
    assert post(writer, protobuf_body(spans)).status_code == 200
    request = json.loads(json_body(spans))
    span = request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["name"] = "renamed"
    response = post(writer, json.dumps(request).encode(), "application/json")
    assert response.status_code == 200
    assert response.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert not TraceSpan.objects.filter(name="renamed").exists()


def test_default_context_keys_come_from_service_name_and_session(writer):
    from tests.otel_agents import traced_run as run

    _, spans = run("code", resource={"service.name": "calc-bot"})
    assert post(writer, protobuf_body(spans)).status_code == 200
    assert stored_run().context.keys == {"service": "calc-bot"}


def test_json_fields_unknown_to_this_otlp_version_are_ignored(writer, tool_run):
    """OTLP/JSON receivers MUST ignore fields with unknown names (newer SDKs add fields)."""
    agent, spans = tool_run
    request = json.loads(json_body(spans))
    request["someFutureField"] = {"x": 1}
    request["resourceSpans"][0]["resource"]["entityRefs"] = [{"type": "service"}]
    for span in request["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["futureSpanField"] = 7
    response = post(writer, json.dumps(request).encode(), "application/json")
    assert response.status_code == 200, response.content
    assert_run_matches_memory(stored_run(), agent, tool_calls=True, keys=CONTEXT)


def test_context_keys_on_span_attributes_join_the_resources_and_win(writer, tool_run):
    _, spans = tool_run
    request = json.loads(json_body(spans))
    step = request["resourceSpans"][0]["scopeSpans"][0]["spans"][3]
    step["attributes"] += [
        {"key": "agentmemory.context.app", "value": {"stringValue": "calc"}},
        {"key": "agentmemory.context.chat", "value": {"stringValue": "9"}},
    ]
    assert post(writer, json.dumps(request).encode(), "application/json").status_code == 200
    assert stored_run().context.keys == {"user": "ada", "app": "calc", "chat": "9"}


# --- bad requests: clear 4xx, nothing written ---------------------------------------------------


def error_message(response) -> str:
    """The message of an error answer: OTLP/HTTP makes its body a google.rpc.Status, in the
    request's encoding (protobuf for protobuf requests, its JSON mapping otherwise)."""
    if response["Content-Type"] == PROTO:
        status = Status.FromString(response.content)
    else:
        assert response["Content-Type"] == "application/json"
        assert set(response.json()) == {"code", "message"}, response.json()
        status = Status(**response.json())
    assert status.code != 0 and int(response["Content-Length"]) == len(response.content)
    return status.message


def nothing_written():
    return not (Context.objects.exists() or Run.objects.exists() or TraceSpan.objects.exists())


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"\xff\x00garbage protobuf \x12\x34", PROTO, 400),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}',
            "application/json",
            400,
        ),
        (b'{"resourceSpans": "nope"}', "application/json", 400),
        (b"[1, 2]", "application/json", 400),
        (b"not json", "application/json", 400),
        (b"{}", "text/plain", 415),
    ],
)
def test_malformed_bodies_are_refused(writer, body, content_type, status):
    response = post(writer, body, content_type)
    assert response.status_code == status, response.content
    assert response["Content-Type"] == (PROTO if content_type == PROTO else "application/json")
    assert error_message(response)
    assert nothing_written()


def test_a_nul_character_in_any_span_refuses_the_whole_request(writer, tool_run):
    _, spans = tool_run
    request = json.loads(json_body(spans))
    request["resourceSpans"][0]["scopeSpans"][0]["spans"][-1]["name"] = "bad\u0000name"
    response = post(writer, json.dumps(request).encode(), "application/json")
    assert response.status_code == 400
    assert "NUL" in error_message(response)
    assert nothing_written()


def test_span_without_ids_is_refused(writer, tool_run):
    _, spans = tool_run
    request = json.loads(json_body(spans))
    del request["resourceSpans"][0]["scopeSpans"][0]["spans"][3]["spanId"]
    assert post(writer, json.dumps(request).encode(), "application/json").status_code == 400
    assert nothing_written()


def test_oversized_and_gzip_bomb_bodies_are_413(writer, settings, tool_run):
    _, spans = tool_run
    body = protobuf_body(spans)
    settings.MAX_REQUEST_BODY_BYTES = len(body) - 1
    response = post(writer, body)
    assert response.status_code == 413
    assert "over the limit" in error_message(response)  # answered by the body-limit middleware
    bomb = gzip.compress(body)
    assert len(bomb) < settings.MAX_REQUEST_BODY_BYTES
    response = post(writer, bomb, content_encoding="gzip")
    assert response.status_code == 413
    assert "decompressed" in error_message(response)
    assert post(writer, b"\x1f\x8b not gzip", content_encoding="gzip").status_code == 400
    assert post(writer, body[:100], content_encoding="br").status_code == 415
    assert nothing_written()


def test_missing_or_bad_key_is_401_and_read_only_key_is_403(tool_run):
    _, spans = tool_run
    body = protobuf_body(spans)
    assert post(make_key(), body).status_code == 200  # sanity: the body is fine
    Run.objects.all().delete()
    TraceSpan.objects.all().delete()
    Context.objects.all().delete()
    anonymous = make_key()
    anonymous.secret = None
    response = post(anonymous, body)
    assert response.status_code == 401 and "missing API key" in error_message(response)
    response = post(make_key(scopes=("read",)), body, url="/v1/traces")
    assert response.status_code == 403 and "'write' scope" in error_message(response)
    response = post(make_key(scopes=("read",)), json_body(spans), "application/json")
    assert response.status_code == 403 and "'write' scope" in error_message(response)
    assert nothing_written()


def test_other_tenants_context_keys_are_403(tool_run):
    _, spans = tool_run
    confined = make_key(context_keys={"user": "bob"})
    response = post(confined, protobuf_body(spans))
    assert response.status_code == 403
    assert "bob" in error_message(response)
    assert nothing_written()


def test_a_confined_key_writes_inside_its_tenant_and_the_runs_stay_apart():
    _, spans = traced_run(
        "code", resource={"agentmemory.context.user": "bob", "agentmemory.context.app": "calc"}
    )
    bob = make_key(context_keys={"user": "bob"})
    ada = make_key(context_keys={"user": "ada"})
    assert post(bob, protobuf_body(spans)).status_code == 200
    run = stored_run()
    assert ada.get(f"/api/v1/runs/{run.pk}").status_code == 404
    assert bob.get(f"/api/v1/runs/{run.pk}").status_code == 200


def test_an_ingested_run_opens_in_the_logbook_and_as_a_transcript(writer, tool_run):
    from django.test import Client

    from tests.builders import make_user

    _, spans = tool_run
    assert post(writer, protobuf_body(spans)).status_code == 200
    run = stored_run()
    browser = Client()
    browser.force_login(make_user(role="viewer"))
    for position in range(1, run.step_count + 1):
        page = browser.get(f"/runs/{run.pk}/steps/{position}/")
        assert page.status_code == 200
    html = browser.get(f"/runs/{run.pk}/steps/4/").content.decode()
    assert "get_population" in html and "AgentToolExecutionError" in html
    transcript = writer.get(f"/api/v1/runs/{run.pk}/messages")
    assert transcript.status_code == 200, transcript.content
    texts = [m["content"][0]["text"] for m in transcript.json()]
    assert "Observation:\nSunny in Paris, 22C" in texts


def genai_trace():
    """A GenAI-conventions trace (no OpenInference): invoke_agent with chat and execute_tool
    spans side by side, one tool failing, made with the OpenTelemetry SDK."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def messages(role, *parts):
        return json.dumps([{"role": role, "parts": list(parts)}])

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "genai-app"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("my.genai.app")
    ask = messages("user", {"type": "text", "content": "Weather in Paris?"})
    with tracer.start_as_current_span(
        "invoke_agent weather",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "weather",
            "gen_ai.conversation.id": "conv-7",
            "gen_ai.input.messages": ask,
        },
    ) as root:
        with tracer.start_as_current_span(
            "chat",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.usage.input_tokens": 30,
                "gen_ai.usage.output_tokens": 5,
                "gen_ai.request.model": "gpt-4o-mini",
                "gen_ai.input.messages": ask,
                "gen_ai.output.messages": messages(
                    "assistant",
                    {
                        "type": "tool_call",
                        "id": "c1",
                        "name": "get_weather",
                        "arguments": {"location": "Paris"},
                    },
                    {
                        "type": "tool_call",
                        "id": "c2",
                        "name": "get_time",
                        "arguments": {"city": "Paris"},
                    },
                ),
            },
        ):
            pass
        with tracer.start_as_current_span(
            "execute_tool get_weather",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "get_weather",
                "gen_ai.tool.call.id": "c1",
                "gen_ai.tool.call.arguments": '{"location": "Paris"}',
                "gen_ai.tool.call.result": "Sunny",
            },
        ):
            pass
        try:
            with tracer.start_as_current_span(
                "execute_tool get_time",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "get_time",
                    "gen_ai.tool.call.id": "c2",
                },
            ):
                raise TimeoutError("clock service timed out")
        except TimeoutError:
            pass
        with tracer.start_as_current_span(
            "chat",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.usage.input_tokens": 40,
                "gen_ai.usage.output_tokens": 6,
                "gen_ai.output.messages": messages(
                    "assistant", {"type": "text", "content": "It is sunny."}
                ),
            },
        ):
            pass
        root.set_attribute(
            "gen_ai.output.messages",
            messages("assistant", {"type": "text", "content": "It is sunny."}),
        )
    return exporter.get_finished_spans()


def test_genai_convention_trace_becomes_a_run(writer):
    assert post(writer, protobuf_body(genai_trace())).status_code == 200
    run = stored_run()
    assert run.context.keys == {"service": "genai-app", "session": "conv-7"}
    assert (run.task, run.agent_name, run.framework, run.status) == (
        "Weather in Paris?",
        "weather",
        "opentelemetry",
        "success",
    )
    assert run.final_answer == "It is sunny."
    assert (run.input_tokens, run.output_tokens, run.total_tokens) == (70, 11, 81)
    task, first, second = run.steps.order_by("position")
    assert task.kind == "task" and task.task == "Weather in Paris?"
    assert (first.kind, first.input_tokens, first.observations) == ("action", 30, "Sunny")
    assert (first.error_type, first.error_message) == ("TimeoutError", "clock service timed out")
    calls = [
        (c.call_id, c.name, c.arguments, c.output, c.success)
        for c in first.tool_calls.order_by("position")
    ]
    assert calls == [
        ("c1", "get_weather", {"location": "Paris"}, "Sunny", True),
        ("c2", "get_time", {"city": "Paris"}, None, False),
    ]
    assert first.model_input_messages == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}
    ]
    assert (second.model_output, second.error_type, second.tool_calls.count()) == (
        "It is sunny.",
        None,
        0,
    )
    assert run.error_count == 1
    # The model a chat span names is the step's (the logbook prices its tokens by it).
    assert (first.model, second.model) == ("gpt-4o-mini", "")


def test_a_trace_stays_in_the_context_of_its_first_spans(writer):
    """The session id rides on the root only; the root comes last, in its own request."""
    spans = genai_trace()
    assert post(writer, protobuf_body(spans[:-1])).status_code == 200
    assert post(writer, protobuf_body(spans[-1:])).status_code == 200
    run = stored_run()
    assert run.context.keys == {"service": "genai-app"}
    assert run.status == "success" and run.step_count == 3
    assert Context.objects.count() == 1
