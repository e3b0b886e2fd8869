"""A LangGraph ReAct agent traced by openinference-instrumentation-langchain: exported with the real
OTLP HTTP exporter to the live server, it becomes one run with a step per model call."""

from __future__ import annotations

import contextlib
import warnings

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.prebuilt import ToolNode, create_react_agent
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import Field

from memory_app import auth
from memory_app.interop import otlp
from memory_app.models import Run, Step, ToolCall, TraceSpan
from memory_app.services.traces import _steps, _with_logs
from tests.api_helpers import make_key
from tests.otel_agents import protobuf_body
from tests.otlp_queue import map_queued, mapped

TASK = "Weather in Paris in May for 2, and how many live there?"
ANSWER = "Sunny in Paris in May; the population is unknown."


class ScriptedChatModel(BaseChatModel):
    """A chat model answering from a script, with the usage a provider reports; what it was
    shown is kept in `seen`."""

    replies: list[AIMessage]
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools, **kwargs):
        return self  # the script already holds the tool calls

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        self.seen.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.replies[len(self.seen) - 1])])


@tool
def get_weather(month: str, to: str, adults: int) -> str:
    """The weather at a destination."""
    return f"Sunny in {to} in {month.title()}"


@tool
def get_population(city: str) -> str:
    """How many people live in a city."""
    raise ValueError("census service offline")


def scripted_model() -> ScriptedChatModel:
    return ScriptedChatModel(
        replies=[
            AIMessage(
                content="",
                tool_calls=[
                    # Key order as the model wrote it (not sorted, not jsonb's order).
                    {
                        "id": "call_w1",
                        "name": "get_weather",
                        "args": {"month": "may", "to": "Paris", "adults": 2},
                    },
                    {"id": "call_p1", "name": "get_population", "args": {"city": "Paris"}},
                ],
                usage_metadata={"input_tokens": 30, "output_tokens": 7, "total_tokens": 37},
            ),
            AIMessage(
                content=ANSWER,
                usage_metadata={"input_tokens": 50, "output_tokens": 6, "total_tokens": 56},
            ),
        ]
    )


@contextlib.contextmanager
def instrumented(*processors, resource: dict | None = None):
    provider = TracerProvider(resource=Resource.create(resource or {}))
    for p in processors:
        provider.add_span_processor(p)
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield provider
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


def run_agent(task: str = TASK) -> tuple[dict, ScriptedChatModel]:
    model = scripted_model()
    # A failing tool answers the model with its error, as LangGraph agents are usually built.
    tools = ToolNode([get_weather, get_population], handle_tool_errors=True)
    with warnings.catch_warnings():
        # It names its successor in the `langchain` package, which this project does not use.
        warnings.simplefilter("ignore")
        agent = create_react_agent(model, tools)
    return agent.invoke({"messages": [("user", task)]}), model


def traced_spans(task: str = TASK) -> list:
    exporter = InMemorySpanExporter()
    with instrumented(SimpleSpanProcessor(exporter), resource={"service.name": "travel"}):
        run_agent(task)
    return list(exporter.get_finished_spans())


def check_run(run: Run, model: ScriptedChatModel) -> None:
    assert (run.framework, run.agent_name, run.status) == ("langchain", "LangGraph", "success")
    assert run.task == TASK
    assert run.final_answer == ANSWER
    task, first, second = run.steps.order_by("position")
    assert (task.kind, task.task) == ("task", TASK)
    assert [first.kind, second.kind] == ["action", "action"]
    # Tokens per model call, and the run's as their sum.
    assert (first.input_tokens, first.output_tokens, first.total_tokens) == (30, 7, 37)
    assert (second.input_tokens, second.output_tokens, second.total_tokens) == (50, 6, 56)
    assert (run.input_tokens, run.output_tokens, run.total_tokens) == (80, 13, 93)
    calls = [
        (c.call_id, c.name, c.arguments, c.output, c.success)
        for c in first.tool_calls.order_by("position")
    ]
    assert calls == [
        (
            "call_w1",
            "get_weather",
            {"month": "may", "to": "Paris", "adults": 2},
            "Sunny in Paris in May",
            True,
        ),
        ("call_p1", "get_population", {"city": "Paris"}, None, False),
    ]
    assert (first.error_type, first.error_message) == ("ValueError", "census service offline")
    assert first.observations.startswith("Sunny in Paris in May")
    assert second.tool_calls.count() == 0 and second.model_output == ANSWER
    # What the model was shown at its second call: the task, its own tool calls, their results.
    shown = model.seen[1]
    assert [m["role"] for m in second.model_input_messages] == ["user", "assistant", "tool", "tool"]
    assert second.model_input_messages[0]["content"] == [{"type": "text", "text": TASK}]
    assert [tc["function"]["name"] for tc in second.model_input_messages[1]["tool_calls"]] == [
        tc["name"] for tc in shown[1].tool_calls
    ]
    assert second.model_input_messages[2]["content"] == [{"type": "text", "text": shown[2].content}]
    assert run.error_count == 1 and run.tool_call_count == 2


@pytest.fixture
def secret():
    return auth.apikey_create(name="otel", scopes=("write",)).secret


@pytest.mark.django_db(transaction=True)
def test_langgraph_react_agent_exported_over_otlp_http_is_one_run(live_server, secret, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", live_server.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{secret}")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "agentmemory.context.user=ada")
    # Small batches: the run arrives in several requests, children before parents.
    processor = BatchSpanProcessor(
        OTLPSpanExporter(), max_export_batch_size=4, schedule_delay_millis=50
    )
    with instrumented(processor) as provider:
        _, model = run_agent()
        assert provider.force_flush()
    map_queued()
    [run] = Run.objects.all()
    assert run.context.keys == {"user": "ada"}
    check_run(run, model)


def send(writer, spans) -> None:
    response = mapped(
        writer.client.generic(
            "POST",
            "/v1/traces",
            protobuf_body(spans),
            content_type=otlp.PROTOBUF,
            **writer._headers(),
        )
    )
    assert response.status_code == 200, response.content


@pytest.mark.django_db
def test_the_same_export_twice_writes_nothing_new():
    spans = traced_spans()
    writer = make_key(scopes=("write",))
    for _ in range(2):
        send(writer, spans)
        counts = (Run.objects.count(), Step.objects.count(), ToolCall.objects.count())
        assert counts == (1, 3, 2)
    assert TraceSpan.objects.count() == len(spans)


@pytest.mark.django_db
def test_purging_the_steps_erases_every_span_holding_their_text():
    """LangGraph's node, prompt and router spans carry copies of the messages: they go with the
    step whose calls they hold, the graph's input and final state with the task."""
    from memory_app.audit import Actor
    from memory_app.services import curation
    from tests.test_purge_total import SECRET, tables_holding

    spans = traced_spans(task=f"Weather in {SECRET}?")
    writer = make_key(scopes=("write",))
    send(writer, spans)
    assert "memory_app_tracespan" in tables_holding(SECRET)
    curation.selected_purge(
        step_ids=list(Step.objects.values_list("pk", flat=True)),
        confirmation=curation.PURGE_CONFIRMATION,
        actor=Actor.system("purge-test"),
    )
    assert tables_holding(SECRET) == []
    send(writer, spans)
    assert tables_holding(SECRET) == [] and not Step.objects.exists()


def test_tool_arguments_keep_the_key_order_the_model_wrote():
    """The mapping hands the steps service the arguments as the model wrote them (keeping them so
    in storage is the storage layer's part)."""
    decoded = otlp.decode_request(protobuf_body(traced_spans()), content_type=otlp.PROTOBUF)
    rows = [{**s, "role": otlp.span_role(s)} for s in decoded]
    items, _, _ = _steps(_with_logs(rows))
    [call] = [c for i in items for c in i.get("tool_calls") or [] if c["name"] == "get_weather"]
    assert list(call["arguments"]) == ["month", "to", "adults"]


@pytest.mark.django_db
def test_a_lone_model_call_answers_with_the_models_text():
    """A chat model called outside any graph: a one-step run whose task is the user's message and
    whose answer is the model's text, not the serialized response."""
    exporter = InMemorySpanExporter()
    model = ScriptedChatModel(
        replies=[
            AIMessage(
                content=ANSWER,
                usage_metadata={"input_tokens": 9, "output_tokens": 4, "total_tokens": 13},
            )
        ]
    )
    with instrumented(SimpleSpanProcessor(exporter)):
        model.invoke([("system", "Be brief."), ("user", TASK)])
    send(make_key(scopes=("write",)), list(exporter.get_finished_spans()))
    [run] = Run.objects.all()
    assert (run.task, run.final_answer, run.system_prompt) == (TASK, ANSWER, "Be brief.")
    [step] = run.steps.all()
    assert (step.kind, step.model_output, step.total_tokens) == ("action", ANSWER, 13)


@pytest.mark.django_db
def test_a_langgraph_run_opens_in_the_logbook_step_by_step():
    from django.test import Client

    from tests.builders import make_user

    send(make_key(scopes=("write",)), traced_spans())
    [run] = Run.objects.all()
    browser = Client()
    browser.force_login(make_user(role="viewer"))
    pages = [browser.get(f"/runs/{run.pk}/steps/{p}/") for p in range(1, run.step_count + 1)]
    assert [p.status_code for p in pages] == [200] * 3
    html = pages[1].content.decode()
    assert "get_population" in html and "census service offline" in html
    assert ANSWER in pages[2].content.decode()
