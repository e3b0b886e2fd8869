"""AgentMemorySaver, LangGraph's checkpointer on the server: the conformance suite as it ships,
and real StateGraphs run on a thread (resumed, interrupted, forked) whose invocations become
runs with a step per super-step. Against pytest-django's threaded live server."""

from __future__ import annotations

import html
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.test import Client
from django.urls import reverse
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import copy_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from memory_app import auth
from memory_app.client import ApiError, MemoryClient
from memory_app.client.langgraph_checkpoint import AgentMemorySaver
from memory_app.models import Checkpoint, CheckpointBlob, CheckpointWrite, Context
from memory_app.rendering import pretty_json
from tests.aio import run_coroutine
from tests.builders import make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(live_server):
    issued = auth.apikey_create(name="lg", scopes=("read", "write"))
    with MemoryClient(live_server.url, issued.secret, retries=1, backoff=0.01) as mc:
        yield mc


@pytest.mark.slow
def test_conformance_suite_passes_every_capability_the_saver_has(client):
    @checkpointer_test(name="AgentMemorySaver")
    async def saver():
        yield AgentMemorySaver(client, keys={"suite": "conformance"})

    failures: list[str] = []

    def on_result(capability, name, passed, trace):
        if not passed:
            failures.append(f"{capability}.{name}\n{trace}")

    report = run_coroutine(validate(saver, progress=ProgressCallbacks(on_test_result=on_result)))
    assert failures == []
    assert report.passed_all_base()
    base = {"put", "put_writes", "get_tuple", "list", "delete_thread"}
    assert {c for c, r in report.results.items() if r.passed} == base


# --- a real StateGraph: an agent node (a scripted chat model), a tool node, an approval -------


def _scripted_agent(script: list[AIMessage], seen: list[list]):
    """The agent node: answers the next scripted AI message, recording the history it saw."""

    def agent(state: MessagesState):
        seen.append([m.content for m in state["messages"]])
        return {"messages": [script.pop(0)]}

    return agent


def _tools(state: MessagesState):
    asked = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
    call = asked.tool_calls[0]
    forecast = {"Paris": "sunny, 21°C", "Lyon": "rain, 14°C"}[call["args"]["city"]]
    return {"messages": [ToolMessage(forecast, tool_call_id=call["id"], name=call["name"])]}


def _route(state: MessagesState):
    return "tools" if state["messages"][-1].tool_calls else END


def _ask(city: str, call_id: str) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[{"id": call_id, "name": "weather", "args": {"unit": "C", "city": city}}],
        usage_metadata={"input_tokens": 30, "output_tokens": 7, "total_tokens": 37},
        response_metadata={"model_name": "gpt-4o-mini"},
    )


def _say(text: str) -> AIMessage:
    return AIMessage(
        text,
        usage_metadata={"input_tokens": 50, "output_tokens": 5, "total_tokens": 55},
        response_metadata={"model_name": "gpt-4o-mini"},
    )


def _approve(state: MessagesState):
    answer = interrupt({"question": "call the tool?"})
    return {"messages": [HumanMessage(f"approved: {answer}")]}


def _graph(checkpointer, script, seen, *, approval: bool = False):
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _scripted_agent(script, seen))
    builder.add_node("tools", _tools)
    builder.add_edge(START, "agent")
    if approval:
        builder.add_node("approve", _approve)
        builder.add_conditional_edges("agent", _route, {"tools": "approve", END: END})
        builder.add_edge("approve", "tools")
    else:
        builder.add_conditional_edges("agent", _route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def _script():
    return [_ask("Paris", "call-1"), _say("Sunny in Paris."), _ask("Lyon", "call-2"), _say("Rain.")]


def _contents(state) -> list:
    return [(m.type, m.content) for m in state["messages"]]


def _steps(client, run_id) -> list[dict]:
    return client.list_steps(run_id, limit=100)["items"]


def test_a_graph_on_a_thread_resumes_and_its_invocations_are_runs(client):
    saver = AgentMemorySaver(client, keys={"app": "weather"})
    thread = {"configurable": {"thread_id": "chat-1"}}
    seen, here_seen = [], []
    graph = _graph(saver, _script(), seen)
    reference = _graph(InMemorySaver(), _script(), here_seen)

    for question in ("Weather in Paris?", "And Lyon?"):
        got = graph.invoke({"messages": [HumanMessage(question)]}, thread)
        expected = reference.invoke({"messages": [HumanMessage(question)]}, thread)
        assert _contents(got) == _contents(expected)
    # The second invocation started from the stored state: the model saw the first exchange.
    assert seen == here_seen
    assert seen[2][:4] == ["Weather in Paris?", "", "sunny, 21°C", "Sunny in Paris."]
    state = graph.get_state(thread)
    assert _contents(state.values) == _contents(reference.get_state(thread).values)
    history = [s.config for s in graph.get_state_history(thread)]
    assert len(history) == len(list(reference.get_state_history(thread))) > 3
    saver.page_size = 3  # listed a few at a time, the same checkpoints come back
    assert [t.config for t in saver.list(thread)] == history
    assert [t.config for t in saver.list(thread, limit=4)] == history[:4]

    ctx = client.list_contexts(keys={"app": "weather", "langgraph_thread": "chat-1"})["items"]
    assert len(ctx) == 1
    runs = sorted(client.list_runs(ctx[0]["id"])["items"], key=lambda r: r["id"])
    assert [(r["task"], r["status"], r["framework"]) for r in runs] == [
        ("Weather in Paris?", "success", "langgraph"),
        ("And Lyon?", "success", "langgraph"),
    ]
    first = client.get_run(runs[0]["id"])["run"]
    assert first["final_answer"] == "Sunny in Paris."
    steps = _steps(client, runs[0]["id"])
    # One step per super-step: the input, the model, the tool, the model.
    assert [s["payload"]["langgraph"]["nodes"] for s in steps] == [
        ["__start__"],
        ["agent"],
        ["tools"],
        ["agent"],
    ]
    assert [s["step_number"] for s in steps] == [0, 1, 2, 3]
    call = steps[1]["tool_calls"][0]
    assert (call["call_id"], call["name"], call["output"]) == ("call-1", "weather", "sunny, 21°C")
    assert call["arguments"] == {"unit": "C", "city": "Paris"}
    assert list(call["arguments"]) == ["unit", "city"]  # as the model wrote them (jsonb: sorted)
    assert (steps[1]["model"], steps[1]["input_tokens"], steps[1]["total_tokens"]) == (
        "gpt-4o-mini",
        30,
        37,
    )
    assert steps[3]["model_output"] == "Sunny in Paris."
    # Each step names the checkpoint it started from and the one it made, as LangGraph's config.
    history = {s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(thread)}
    for step in steps:
        for name in ("checkpoint", "parent_checkpoint"):
            conf = step["payload"]["langgraph"][name]["configurable"]
            assert conf["thread_id"] == "chat-1" and conf["checkpoint_ns"] == ""
            assert conf["checkpoint_id"] in history


def test_an_interrupt_waits_in_a_running_run_and_resumes_in_it(client):
    saver = AgentMemorySaver(client, keys={"app": "approval"})
    thread = {"configurable": {"thread_id": "chat-2"}}
    graph = _graph(saver, _script(), [], approval=True)

    paused = graph.invoke({"messages": [HumanMessage("Weather in Paris?")]}, thread)
    assert paused["__interrupt__"][0].value == {"question": "call the tool?"}
    ctx = client.list_contexts(keys={"app": "approval", "langgraph_thread": "chat-2"})["items"][0]
    (run,) = client.list_runs(ctx["id"])["items"]
    assert run["status"] == "running"
    assert graph.get_state(thread).next == ("approve",)

    done = graph.invoke(Command(resume="yes"), thread)
    assert _contents(done)[-1] == ("ai", "Sunny in Paris.")
    (run,) = client.list_runs(ctx["id"])["items"]
    assert run["status"] == "success"
    nodes = [s["payload"]["langgraph"]["nodes"] for s in _steps(client, run["id"])]
    assert nodes == [["__start__"], ["agent"], ["approve"], ["tools"], ["agent"]]
    approve = {
        w["channel"]: w["value"] for w in _steps(client, run["id"])[2]["action_output"]["writes"]
    }
    # The step shows the question it stopped on and what the node wrote once resumed.
    assert approve["__interrupt__"][0]["interrupt"] == {"question": "call the tool?"}
    assert approve["messages"]["messages"][0]["content"] == "approved: yes"


THREAD_HTML = 'chat-3 <b onclick="x()">&amp;</b>'


def test_forking_from_a_steps_checkpoint_replays_from_there_as_a_new_run(client):
    saver = AgentMemorySaver(client, keys={"app": "fork"})
    thread = {"configurable": {"thread_id": THREAD_HTML}}
    script = [_ask("Paris", "call-1"), _say("Sunny in Paris."), _say("Forked: sunny.")]
    graph = _graph(saver, script, [])
    graph.invoke({"messages": [HumanMessage("Weather in Paris?")]}, thread)
    ctx = client.list_contexts(keys={"app": "fork", "langgraph_thread": THREAD_HTML})["items"][0]
    (run,) = client.list_runs(ctx["id"])["items"]
    tool_step = _steps(client, run["id"])[2]
    assert tool_step["payload"]["langgraph"]["nodes"] == ["tools"]

    # The step's starting checkpoint, as the logbook offers it (escaped, with a copy button):
    # the tool runs again from there.
    fork = tool_step["payload"]["langgraph"]["parent_checkpoint"]
    assert fork["configurable"]["thread_id"] == THREAD_HTML
    viewer = Client()
    viewer.force_login(make_user(role="viewer"))
    page = viewer.get(reverse("run-step", args=[run["id"], 3])).content.decode()
    assert "Fork from this step" in page
    shown = html.escape(pretty_json(fork))
    assert f'<pre class="json" id="fork-{tool_step["id"]}">{shown}</pre>' in page
    assert f'data-copy="#fork-{tool_step["id"]}"' in page
    assert THREAD_HTML not in page
    out = graph.invoke(None, fork)
    assert _contents(out)[-2:] == [("tool", "sunny, 21°C"), ("ai", "Forked: sunny.")]
    runs = sorted(client.list_runs(ctx["id"])["items"], key=lambda r: r["id"])
    assert [r["status"] for r in runs] == ["success", "success"]
    forked = client.get_run(runs[1]["id"])["run"]
    assert forked["task"] == "Weather in Paris?"
    assert forked["metadata"]["forked_from"] == {"run_id": run["id"], "checkpoint": fork}
    assert forked["final_answer"] == "Forked: sunny."
    assert [s["payload"]["langgraph"]["nodes"] for s in _steps(client, forked["id"])] == [
        ["tools"],
        ["agent"],
    ]


def test_the_async_graph_api_goes_through_the_same_saver(client):
    saver = AgentMemorySaver(client, keys={"app": "async"})
    thread = {"configurable": {"thread_id": "chat-4"}}
    graph = _graph(saver, _script(), [])

    async def go():
        first = await graph.ainvoke({"messages": [HumanMessage("Weather in Paris?")]}, thread)
        state = await graph.aget_state(thread)
        return first, state

    first, state = run_coroutine(go())
    assert _contents(first) == _contents(state.values)
    assert _contents(first)[-1] == ("ai", "Sunny in Paris.")
    run_coroutine(saver.adelete_thread("chat-4"))
    assert graph.get_state(thread).values == {}


def test_a_node_that_raises_fails_its_run_and_a_retry_is_a_new_run(client):
    saver = AgentMemorySaver(client, keys={"app": "errors"})
    thread = {"configurable": {"thread_id": "chat-5"}}
    broken = {"down": True}

    def tools(state: MessagesState):
        if broken["down"]:
            raise ConnectionError("weather service <down>")
        return _tools(state)

    builder = StateGraph(MessagesState)
    builder.add_node("agent", _scripted_agent(_script(), []))
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", _route, ["tools", END])
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=saver)

    with pytest.raises(ConnectionError):
        graph.invoke({"messages": [HumanMessage("Weather in Paris?")]}, thread)
    ctx = client.list_contexts(keys={"app": "errors", "langgraph_thread": "chat-5"})["items"][0]
    (failed,) = client.list_runs(ctx["id"])["items"]
    assert failed["status"] == "failed"
    last = _steps(client, failed["id"])[-1]
    assert last["error_type"] == "LangGraphError"
    assert "weather service <down>" in last["error_message"]
    assert last["payload"]["langgraph"]["nodes"] == ["tools"]

    broken["down"] = False
    out = graph.invoke(None, thread)
    assert _contents(out)[-1] == ("ai", "Sunny in Paris.")
    runs = sorted(client.list_runs(ctx["id"])["items"], key=lambda r: r["id"])
    assert [r["status"] for r in runs] == ["failed", "success"]
    assert [s["payload"]["langgraph"]["nodes"] for s in _steps(client, runs[1]["id"])] == [
        ["tools"],
        ["agent"],
    ]


def _put_body(**changes):
    body = {
        "keys": {"user": "ada", "langgraph_thread": "t"},
        "checkpoint_id": "1",
        "checkpoint": {"type": "msgpack", "data": "gA=="},
        "metadata": {"source": "input", "step": -1},
        "metadata_typed": {"type": "msgpack", "data": "gA=="},
    }
    return {**body, **changes}


def test_bad_input_is_a_4xx_and_writes_nothing(live_server):
    writer = auth.apikey_create(name="w", scopes=("read", "write"))
    with MemoryClient(live_server.url, writer.secret, retries=0) as mc:
        for bad in (
            {"checkpoint": {"type": "msgpack", "data": "not base64!"}},
            {"checkpoint_id": ""},
            {"metadata": {"x": "\u0000"}},
            {"blobs": [{"channel": "c", "version": "1", "value": {"type": "", "data": ""}}]},
        ):
            with pytest.raises(ApiError) as err:
                mc.request("POST", "checkpoints", json_body=_put_body(**bad))
            assert err.value.status in (400, 422), bad
        for params in ({"keys": "[1]"}, {"keys": "{}", "filter": "{bad"}):
            with pytest.raises(ApiError) as err:
                mc.request("GET", "checkpoints", params=params)
            assert err.value.status == 422
    assert Checkpoint.objects.count() == 0 and Context.objects.count() == 0


def test_keys_scope_and_confinement_hold_for_threads(live_server):
    reader = auth.apikey_create(name="r", scopes=("read",))
    confined = auth.apikey_create(name="c", scopes=("read", "write"), context_keys={"user": "bob"})
    writer = auth.apikey_create(name="w", scopes=("read", "write"))
    with MemoryClient(live_server.url, writer.secret, retries=0) as mc:
        saver = AgentMemorySaver(mc, keys={"user": "ada"})
        graph = _graph(saver, _script(), [])
        graph.invoke({"messages": [HumanMessage("Weather in Paris?")]}, _thread("t"))
    with MemoryClient(live_server.url, reader.secret, retries=0) as mc:
        saver = AgentMemorySaver(mc, keys={"user": "ada"})
        assert saver.get_tuple(_thread("t")) is not None
        with pytest.raises(ApiError) as err:
            saver.delete_thread("t")
        assert err.value.status == 403
        with pytest.raises(ApiError) as err:
            _graph(saver, _script(), []).invoke({"messages": [HumanMessage("?")]}, _thread("u"))
        assert err.value.status == 403
    with MemoryClient(live_server.url, confined.secret, retries=0) as mc:
        # Ada's thread is outside the key's contexts: it does not exist for it.
        outsider = AgentMemorySaver(mc, keys={"user": "ada"})
        assert outsider.get_tuple(_thread("t")) is None
        assert list(outsider.list(_thread("t"))) == []
        outsider.delete_thread("t")
        with pytest.raises(ApiError) as err:
            _graph(outsider, _script(), []).invoke({"messages": [HumanMessage("?")]}, _thread("t"))
        assert err.value.status == 403
    with MemoryClient(live_server.url, writer.secret, retries=0) as mc:
        assert AgentMemorySaver(mc, keys={"user": "ada"}).get_tuple(_thread("t")) is not None


def _thread(thread_id: str) -> dict:
    return {"configurable": {"thread_id": thread_id}}


class _Recorder(InMemorySaver):
    """Keeps every put and put_writes LangGraph makes, to send them again in another order."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def put(self, config, checkpoint, metadata, new_versions):
        conf = {k: v for k, v in config["configurable"].items() if not k.startswith("__")}
        saved = (dict(conf), copy_checkpoint(checkpoint), dict(metadata), dict(new_versions))
        self.calls.append(("put", *saved))
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config, writes, task_id, task_path=""):
        conf = {k: v for k, v in config["configurable"].items() if not k.startswith("__")}
        self.calls.append(("put_writes", dict(conf), list(writes), task_id, task_path))
        return super().put_writes(config, writes, task_id, task_path)


def _replay(saver: AgentMemorySaver, calls: list[tuple], thread_id: str) -> None:
    for name, conf, *rest in calls:
        config = {"configurable": {**conf, "thread_id": thread_id}}
        if name == "put":
            saver.put(config, *rest)
        else:
            saver.put_writes(config, *rest)


def _logbook(client, keys: dict) -> list:
    ctx = client.list_contexts(keys=keys)["items"][0]
    out = []
    for run in sorted(client.list_runs(ctx["id"])["items"], key=lambda r: r["id"]):
        detail = client.get_run(run["id"])["run"]
        steps = [
            {k: v for k, v in s.items() if k not in ("id", "run_id", "created_at", "payload")}
            | {"nodes": s["payload"]["langgraph"]["nodes"]}
            | {"tool_calls": [{k: v for k, v in c.items() if k != "id"} for c in s["tool_calls"]]}
            for s in _steps(client, run["id"])
        ]
        out.append((detail["status"], detail["final_answer"], detail["total_tokens"], steps))
    return out


def test_writes_and_checkpoints_arriving_in_any_order_make_the_same_logbook(client):
    # LangGraph saves them from a thread pool: the next checkpoint may come before the writes of
    # the super-step that led to it.
    recorder = _Recorder()
    thread = {"configurable": {"thread_id": "rec"}}
    _graph(recorder, _script(), []).invoke(
        {"messages": [HumanMessage("Weather in Paris?")]}, thread
    )
    calls = recorder.calls
    saver = AgentMemorySaver(client, keys={"app": "order"})
    _replay(saver, calls, "in-order")
    _replay(saver, calls, "in-order")  # as a client's retries would send them again
    _replay(
        saver, [c for c in calls if c[0] == "put"] + [c for c in calls if c[0] != "put"], "late"
    )
    # As LangGraph sends them: checkpoints one after another, writes at once beside them.
    writes = [c for c in calls if c[0] != "put"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        sent = [pool.submit(_replay, saver, [w], "together") for w in writes]
        _replay(saver, [c for c in calls if c[0] == "put"], "together")
        for future in sent:
            future.result()
    in_order = _logbook(client, {"app": "order", "langgraph_thread": "in-order"})
    assert _logbook(client, {"app": "order", "langgraph_thread": "late"}) == in_order
    assert _logbook(client, {"app": "order", "langgraph_thread": "together"}) == in_order
    ((status, answer, tokens, steps),) = in_order
    assert (status, answer, tokens) == ("success", "Sunny in Paris.", 37 + 55)
    assert [s["nodes"] for s in steps] == [["__start__"], ["agent"], ["tools"], ["agent"]]
    assert steps[1]["tool_calls"][0]["output"] == "sunny, 21°C"


def test_deleting_a_context_takes_its_checkpoints_along(client):
    saver = AgentMemorySaver(client, keys={"app": "gone"})
    _graph(saver, _script(), []).invoke(
        {"messages": [HumanMessage("Weather in Paris?")]}, _thread("t")
    )
    context = Context.objects.get(keys={"app": "gone", "langgraph_thread": "t"})
    assert Checkpoint.objects.filter(context_id=context.pk).exists()
    context.delete()
    assert not Checkpoint.objects.exists()
    assert not CheckpointBlob.objects.exists() and not CheckpointWrite.objects.exists()
