"""Spans and log events following the OpenTelemetry GenAI conventions, made by the real
opentelemetry-instrumentation-openai-v2 around the real `openai` client talking to a local fake
OpenAI-compatible endpoint, and exported with the real OTLP HTTP exporters to the live server."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from memory_app import auth
from memory_app.models import Run, Step, ToolCall, TraceSpan
from tests.api_helpers import make_key
from tests.otel_agents import protobuf_body
from tests.otlp_queue import map_queued, mapped

PROTO = "application/x-protobuf"
TASK = "Weather in Paris in May for 2?"
ANSWER = "It is sunny in Paris in May."
ARGUMENTS = '{"month": "may", "to": "Paris", "adults": 2}'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "month": {"type": "string"},
                    "to": {"type": "string"},
                    "adults": {"type": "integer"},
                },
            },
        },
    }
]


def completion(message: dict, finish_reason: str, prompt_tokens: int, completion_tokens: int):
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def answer_for(request: dict) -> dict:
    """A fixed completion: a tool call while the model has tools and no tool result yet, else
    text (which names the question, so that plain calls can be told apart)."""
    last = request["messages"][-1]
    if request.get("tools") and last["role"] != "tool":
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_w1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGUMENTS},
                }
            ],
        }
        return completion(message, "tool_calls", 31, 9)
    text = ANSWER if last["role"] == "tool" else f"About {last['content']}: sunny."
    return completion({"role": "assistant", "content": text}, "stop", 52, 8)


class FakeOpenAI(BaseHTTPRequestHandler):
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        body = json.dumps(answer_for(request)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def fake_openai():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key="test")
    server.shutdown()
    thread.join()


class DescendingIds(RandomIdGenerator):
    """Each trace id below the one before: runs ordered by trace id come out backwards."""

    def __init__(self):
        self.next = 2**127

    def generate_trace_id(self) -> int:
        self.next -= 1
        return self.next


@contextlib.contextmanager
def instrumented(span_processor, log_processor, monkeypatch, content="true", **provider_options):
    """openai-v2 with its defaults (v1.30 conventions: messages go to log events), content on
    (`content`: where the latest conventions put it)."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", content)
    resource = Resource.create({"service.name": "weather-bot"})
    tracer_provider = TracerProvider(resource=resource, **provider_options)
    tracer_provider.add_span_processor(span_processor)
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(log_processor)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
    try:
        yield tracer_provider, logger_provider
    finally:
        instrumentor.uninstrument()
        tracer_provider.shutdown()
        logger_provider.shutdown()


def weather(month: str, to: str, adults: int) -> str:
    return f"Sunny in {to}"


def run_agent(client: openai.OpenAI, tracer, task: str = TASK) -> None:
    """A ReAct loop by hand, spanned as the GenAI conventions describe an agent and its tools."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": task}]
    with tracer.start_as_current_span(
        "invoke_agent weather",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather"},
    ):
        while True:
            reply = client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, tools=TOOLS
            )
            message = reply.choices[0].message
            if not message.tool_calls:
                return
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                with tracer.start_as_current_span(
                    f"execute_tool {call.function.name}",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": call.function.name,
                        "gen_ai.tool.call.id": call.id,
                    },
                ) as span:
                    result = weather(**json.loads(call.function.arguments))
                    span.set_attribute("gen_ai.tool.call.result", result)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


@pytest.fixture
def secret():
    return auth.apikey_create(name="otel", scopes=("write",)).secret


@pytest.fixture
def exporting(live_server, secret, monkeypatch):
    """The real OTLP HTTP exporters, configured by the README's variables."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", live_server.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{secret}")


@pytest.mark.django_db(transaction=True)
def test_an_agent_on_the_openai_client_is_one_run_with_its_messages(
    exporting, fake_openai, monkeypatch
):
    # Events are exported as they happen, spans in batches: the events of a model call arrive
    # before its span, as with the SDK's default delays.
    spans = BatchSpanProcessor(
        OTLPSpanExporter(), max_export_batch_size=2, schedule_delay_millis=50
    )
    logs = SimpleLogRecordProcessor(OTLPLogExporter())
    with instrumented(spans, logs, monkeypatch) as (tracer_provider, _):
        run_agent(fake_openai, tracer_provider.get_tracer("weather-bot"))
        assert tracer_provider.force_flush()
    map_queued()
    [run] = Run.objects.all()
    assert run.context.keys == {"service": "weather-bot"}
    assert (run.agent_name, run.status, run.task, run.final_answer) == (
        "weather",
        "success",
        TASK,
        ANSWER,
    )
    assert run.system_prompt == "Be brief."
    task, first, second = run.steps.order_by("position")
    assert (task.kind, task.task) == ("task", TASK)
    assert (first.input_tokens, first.output_tokens, first.total_tokens) == (31, 9, 40)
    assert (second.input_tokens, second.output_tokens, second.total_tokens) == (52, 8, 60)
    assert (first.model, second.model) == ("gpt-4o-mini-2024-07-18",) * 2
    # The message content came as log events of the chat spans.
    assert first.model_input_messages == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": TASK}]},
    ]
    assert [
        (c.call_id, c.name, c.arguments, c.output, c.success)
        for c in first.tool_calls.order_by("position")
    ] == [("call_w1", "get_weather", json.loads(ARGUMENTS), "Sunny in Paris", True)]
    assert json.dumps(first.tool_calls.get().arguments) == ARGUMENTS  # the model's key order
    assert first.observations == "Sunny in Paris"
    assert [m["role"] for m in second.model_input_messages] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert second.model_input_messages[2]["tool_calls"][0]["function"]["arguments"] == (
        json.loads(ARGUMENTS)
    )
    assert second.model_input_messages[3]["content"] == [{"type": "text", "text": "Sunny in Paris"}]
    assert (second.model_output, second.tool_calls.count()) == (ANSWER, 0)
    assert (run.input_tokens, run.output_tokens) == (83, 17)


@pytest.mark.django_db(transaction=True)
def test_plain_model_calls_of_one_export_are_runs_in_start_order(
    exporting, fake_openai, monkeypatch
):
    """Each call without a parent span is a trace of its own: one run each, its task the user's
    message, its answer the model's text, made in the order the calls started."""
    spans = BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=60_000)
    logs = SimpleLogRecordProcessor(OTLPLogExporter())
    questions = ["Paris?", "Rome?", "Oslo?"]
    with instrumented(spans, logs, monkeypatch, id_generator=DescendingIds()) as (provider, _):
        for question in questions:
            fake_openai.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": question}]
            )
        assert provider.force_flush()  # one export for the three spans
    map_queued()
    runs = list(Run.objects.order_by("pk"))
    assert [r.task for r in runs] == questions
    assert [r.final_answer for r in runs] == [f"About {q}: sunny." for q in questions]
    assert [r.metadata["otel_trace_id"] for r in runs] == sorted(
        (r.metadata["otel_trace_id"] for r in runs), reverse=True
    )
    for run in runs:
        [step] = run.steps.all()
        assert (step.kind, step.input_tokens, step.output_tokens) == ("action", 52, 8)
        assert run.status == "success" and run.total_tokens == 60


def captured(fake_openai, monkeypatch, task: str = TASK, content="true") -> tuple[list, list]:
    """The spans and log records of one agent run, kept in memory."""
    span_exporter, log_exporter = InMemorySpanExporter(), InMemoryLogRecordExporter()
    with instrumented(
        SimpleSpanProcessor(span_exporter),
        SimpleLogRecordProcessor(log_exporter),
        monkeypatch,
        content,
    ) as (tracer_provider, _):
        run_agent(fake_openai, tracer_provider.get_tracer("weather-bot"), task)
    return list(span_exporter.get_finished_spans()), list(log_exporter.get_finished_logs())


def post(client, path: str, body: bytes, content_type: str):
    return mapped(
        client.client.generic("POST", path, body, content_type=content_type, **client._headers())
    )


def logs_json(records) -> bytes:
    """OTLP/JSON of log records: protobuf's JSON mapping with hex trace and span ids."""
    import base64

    data = json_format.MessageToDict(encode_logs(records))
    for rl in data["resourceLogs"]:
        for sl in rl["scopeLogs"]:
            for record in sl["logRecords"]:
                for key in ("traceId", "spanId"):
                    if key in record:
                        record[key] = base64.b64decode(record[key]).hex()
    return json.dumps(data).encode()


@pytest.mark.django_db
@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_log_events_in_either_encoding_sent_twice_are_kept_once(fake_openai, monkeypatch, encoding):
    spans, records = captured(fake_openai, monkeypatch)
    writer = make_key(scopes=("write",))
    body, content_type = (
        (encode_logs(records).SerializeToString(), "application/x-protobuf")
        if encoding == "protobuf"
        else (logs_json(records), "application/json")
    )
    for path in ("/v1/logs", "/api/v1/logs"):
        response = post(writer, path, body, content_type)
        assert response.status_code == 200, response.content
        assert response["Content-Type"] == content_type
    # Only events so far: kept, no run until a span of the trace comes.
    assert TraceSpan.objects.filter(role="log").count() == len(records) == 8
    assert not Run.objects.exists()
    assert (
        post(writer, "/v1/traces", protobuf_body(spans), "application/x-protobuf").status_code
        == 200
    )
    before = (Step.objects.count(), ToolCall.objects.count(), TraceSpan.objects.count())
    assert before == (3, 1, len(spans) + len(records))
    assert post(writer, "/v1/logs", body, content_type).status_code == 200
    assert (Step.objects.count(), ToolCall.objects.count(), TraceSpan.objects.count()) == before
    [run] = Run.objects.all()
    assert run.final_answer == ANSWER and run.task == TASK


@pytest.mark.django_db
def test_log_records_outside_any_span_are_reported_not_kept(fake_openai, monkeypatch):
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

    _, records = captured(fake_openai, monkeypatch)
    request = encode_logs(records)
    request.resource_logs[0].scope_logs[0].log_records[0].ClearField("span_id")
    response = post(
        make_key(scopes=("write",)),
        "/v1/logs",
        request.SerializeToString(),
        "application/x-protobuf",
    )
    assert response.status_code == 200
    answer = ExportLogsServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_log_records == 1
    assert "outside any span" in answer.partial_success.error_message
    assert TraceSpan.objects.count() == len(records) - 1


@pytest.mark.django_db
def test_bad_log_requests_are_refused_and_write_nothing(fake_openai, monkeypatch):
    from google.rpc.status_pb2 import Status

    _, records = captured(fake_openai, monkeypatch)
    body = encode_logs(records).SerializeToString()
    reader = make_key(scopes=("read",))
    response = post(reader, "/v1/logs", body, "application/x-protobuf")
    assert response.status_code == 403
    assert "'write' scope" in Status.FromString(response.content).message
    writer = make_key(scopes=("write",))
    response = post(writer, "/v1/logs", b"\xff\x00 not protobuf", "application/x-protobuf")
    assert response.status_code == 400
    assert "ExportLogsServiceRequest" in Status.FromString(response.content).message
    response = post(writer, "/v1/logs", b'{"resourceLogs": "x"}', "application/json")
    assert response.status_code == 400 and set(response.json()) == {"code", "message"}
    bad = json.loads(logs_json(records))
    bad["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["body"] = {"stringValue": "a\u0000b"}
    response = post(writer, "/v1/logs", json.dumps(bad).encode(), "application/json")
    assert response.status_code == 400 and "NUL" in response.json()["message"]
    assert post(writer, "/v1/logs", b"{}", "text/plain").status_code == 415
    confined = make_key(scopes=("write",), context_keys={"user": "bob"})
    assert post(confined, "/v1/logs", body, "application/x-protobuf").status_code == 403
    assert not TraceSpan.objects.exists()


def stored() -> dict:
    """What the run says, for comparing two deliveries of the same trace."""
    [run] = Run.objects.all()
    steps = [
        {
            **{
                k: getattr(s, k)
                for k in (
                    "kind",
                    "task",
                    "model_input_messages",
                    "model_output",
                    "observations",
                    "input_tokens",
                )
            },
            "calls": [
                (c.call_id, c.name, c.arguments, c.output, c.success)
                for c in s.tool_calls.order_by("position")
            ],
        }
        for s in run.steps.order_by("position")
    ]
    return {
        "run": (run.task, run.final_answer, run.system_prompt, run.tool_call_count, run.status),
        "steps": steps,
    }


@pytest.mark.django_db
def test_log_events_arriving_after_their_spans_complete_the_steps(fake_openai, monkeypatch):
    """Whichever provider an application flushes first: events sent after the spans fill what
    the steps lacked, and the run ends up as when they came first."""
    spans, records = captured(fake_openai, monkeypatch)
    writer = make_key(scopes=("write",))
    deliveries = {
        "events first": [("/v1/logs", encode_logs(records)), ("/v1/traces", None)],
        "spans first": [("/v1/traces", None), ("/v1/logs", encode_logs(records))],
    }
    results = {}
    for order, requests in deliveries.items():
        for path, message in requests:
            body = protobuf_body(spans) if message is None else message.SerializeToString()
            assert post(writer, path, body, "application/x-protobuf").status_code == 200
        results[order] = stored()
        if order == "spans first":
            # Sent again, nothing changes.
            for path, message in requests:
                body = protobuf_body(spans) if message is None else message.SerializeToString()
                assert post(writer, path, body, "application/x-protobuf").status_code == 200
            assert stored() == results[order]
        Run.objects.all().delete()
        TraceSpan.objects.all().delete()
    assert results["spans first"] == results["events first"]
    assert results["events first"]["run"] == (TASK, ANSWER, "Be brief.", 1, "success")


@pytest.mark.django_db
def test_purging_the_steps_erases_their_log_events(fake_openai, monkeypatch):
    from memory_app.audit import Actor
    from memory_app.services import curation
    from tests.test_purge_total import SECRET, tables_holding

    spans, records = captured(fake_openai, monkeypatch, task=f"Weather in {SECRET}?")
    writer = make_key(scopes=("write",))
    assert (
        post(writer, "/v1/logs", encode_logs(records).SerializeToString(), PROTO).status_code == 200
    )
    assert post(writer, "/v1/traces", protobuf_body(spans), PROTO).status_code == 200
    assert "memory_app_tracespan" in tables_holding(SECRET)
    curation.selected_purge(
        step_ids=list(Step.objects.values_list("pk", flat=True)),
        confirmation=curation.PURGE_CONFIRMATION,
        actor=Actor.system("purge-test"),
    )
    assert tables_holding(SECRET) == []
    purged = TraceSpan.objects.filter(role="log")
    assert purged.count() == len(records) and {str(r.data) for r in purged} == {"{'purged': True}"}
    # The events sent again do not bring the content back.
    assert (
        post(writer, "/v1/logs", encode_logs(records).SerializeToString(), PROTO).status_code == 200
    )
    assert tables_holding(SECRET) == []


@pytest.fixture
def latest_conventions(monkeypatch):
    """openai-v2 on the latest (experimental) GenAI conventions. OpenTelemetry reads the opt-in
    (OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental) once per process, so it is set
    on what it read, for this test alone."""
    from opentelemetry.instrumentation._semconv import (
        _OpenTelemetrySemanticConventionStability as Stability,
    )
    from opentelemetry.instrumentation._semconv import (
        _OpenTelemetryStabilitySignalType as Signal,
    )
    from opentelemetry.instrumentation._semconv import _StabilityMode as Mode

    Stability._initialize()
    read = Stability._OTEL_SEMCONV_STABILITY_SIGNAL_MAPPING
    monkeypatch.setattr(
        Stability,
        "_OTEL_SEMCONV_STABILITY_SIGNAL_MAPPING",
        {**read, Signal.GEN_AI: Mode.GEN_AI_LATEST_EXPERIMENTAL},
    )


@pytest.mark.django_db
@pytest.mark.parametrize("content", ["event_only", "span_only"])
def test_the_latest_conventions_make_the_same_run_with_the_arguments_as_written(
    fake_openai, monkeypatch, latest_conventions, content
):
    """Content in the operation-details event comes as structured attributes (OTLP key-value
    lists, the tool call's arguments an object); on the spans, as JSON text. Either way: the
    same run, the arguments in the order the model wrote them."""
    spans, records = captured(fake_openai, monkeypatch, content=content)
    assert [r.log_record.event_name for r in records] == (
        ["gen_ai.client.inference.operation.details"] * 2 if content == "event_only" else []
    )
    writer = make_key(scopes=("write",))
    if records:
        assert (
            post(writer, "/v1/logs", encode_logs(records).SerializeToString(), PROTO).status_code
            == 200
        )
    assert post(writer, "/v1/traces", protobuf_body(spans), PROTO).status_code == 200
    [run] = Run.objects.all()
    assert (run.task, run.final_answer, run.system_prompt) == (TASK, ANSWER, "Be brief.")
    _, first, second = run.steps.order_by("position")
    assert first.model_input_messages[1] == {
        "role": "user",
        "content": [{"type": "text", "text": TASK}],
    }
    [call] = first.tool_calls.all()
    assert (call.call_id, call.name, call.output) == ("call_w1", "get_weather", "Sunny in Paris")
    assert json.dumps(call.arguments) == ARGUMENTS
    asked = second.model_input_messages[2]["tool_calls"][0]["function"]["arguments"]
    assert json.dumps(asked) == ARGUMENTS
    # What the tool answered, as the model was shown it.
    assert second.model_input_messages[3]["content"] == [{"type": "text", "text": "Sunny in Paris"}]
    assert second.model_output == ANSWER
