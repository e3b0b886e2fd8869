"""The Python client end to end against a live server (pytest-django's threaded live_server)."""

import json

import pytest
from agentscope.memory import InMemoryMemory
from agentscope.message import Msg, TextBlock

from memory_app import auth
from memory_app.client import ApiError, MemoryClient, NotFoundError
from memory_app.client.agentscope import ServerMemory
from memory_app.client.smolagents import RunRecorder, import_run, load_steps
from tests.aio import run_coroutine
from tests.builders import register_models
from tests.smol_agents import AGENTS, ScriptedModel, jsonable, messages_as_dicts, run_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(live_server):
    issued = auth.apikey_create(name="test", scopes=("read", "write", "admin"))
    with MemoryClient(live_server.url, issued.secret, retries=1, backoff=0.01) as mc:
        yield mc


@pytest.fixture
def ctx(client):
    return client.context(keys={"user": "ada", "test": "live"})


@pytest.mark.parametrize("kind", list(AGENTS))
def test_import_export_and_transcripts_over_http(client, ctx, kind):
    agent = run_agent(kind)
    out = import_run(client, ctx["id"], agent, client_id=f"{kind}-1")
    assert out["created"] and out["status"] == "success"
    exported = client.export_smolagents_run(out["run_id"])
    assert exported["steps"] == jsonable(agent.memory.get_full_steps())
    for summary_mode in (False, True):
        expected = messages_as_dicts(agent.write_memory_to_messages(summary_mode=summary_mode))
        assert client.run_messages(out["run_id"], summary_mode=summary_mode) == expected
    assert import_run(client, ctx["id"], agent, client_id=f"{kind}-1")["created"] is False


@pytest.mark.parametrize("kind", list(AGENTS))
def test_live_callback_records_the_run_step_by_step(client, ctx, kind):
    factory, task = AGENTS[kind]
    recorder = RunRecorder(client, ctx["id"])
    seen_on_server = []

    def after(step, agent):
        seen_on_server.append(len(client.export_smolagents_run(recorder.run_id)["steps"]))

    agent = factory(step_callbacks=[recorder, after])
    with recorder:
        agent.run(task)
    # After each action step the server already held every step so far (task + plan + actions).
    assert seen_on_server == [3 + i for i in range(len(seen_on_server))]
    exported = client.export_smolagents_run(recorder.run_id)
    assert exported["steps"] == jsonable(agent.memory.get_full_steps())
    run = client.get_run(recorder.run_id)["run"]
    assert run["status"] == "success"
    assert client.run_messages(recorder.run_id) == messages_as_dicts(
        agent.write_memory_to_messages()
    )


def test_recorder_marks_a_crashed_run_failed(client, ctx):
    factory, task = AGENTS["tool_calling"]
    recorder = RunRecorder(client, ctx["id"])
    agent = factory(step_callbacks=[recorder])
    agent.model.script = agent.model.script[:2]  # the model "dies" after the first action
    with pytest.raises(Exception), recorder:
        agent.run(task)
    assert client.get_run(recorder.run_id)["run"]["status"] == "failed"


def test_rehydrated_agent_continues_with_the_restored_steps(client, ctx):
    original = run_agent("tool_calling")
    out = import_run(client, ctx["id"], original, client_id="rehydrate")
    factory, _ = AGENTS["tool_calling"]
    fresh = factory()
    fresh.planning_interval = None
    fresh.model = ScriptedModel([original.model.__class__.__mro__ and _final("ok")])
    fresh.memory.steps = load_steps(client, out["run_id"])
    assert jsonable(fresh.memory.get_full_steps()) == jsonable(original.memory.get_full_steps())
    assert fresh.run("And tomorrow?", reset=False) == "ok"
    shown = [
        m.content[0]["text"] if isinstance(m.content, list) else m.content
        for m in fresh.model.seen[0]
    ]
    assert any("Observation:\nSunny in Paris, 22C" in t for t in shown)
    assert any("New task:\nWhat's the weather in Paris?" in t for t in shown)
    assert "New task:\nAnd tomorrow?" in shown[-1]


def test_a_rehydrated_agent_is_prompted_exactly_as_the_original(client, ctx):
    """get_weather(location, unit): jsonb stores {"unit", "location"}, yet the rehydrated agent's
    "Calling tools:" text, and so its whole next prompt, equals the original's."""
    original = run_agent("tool_calling")
    out = import_run(client, ctx["id"], original, client_id="same-prompt")
    exported = client.export_smolagents_run(out["run_id"])["steps"]
    action = next(s for s in exported if s.get("tool_calls"))
    assert list(action["tool_calls"][0]["function"]["arguments"]) == ["location", "unit"]
    factory, _ = AGENTS["tool_calling"]
    fresh = factory()
    fresh.memory.steps = load_steps(client, out["run_id"])
    prompts = []
    for agent in (original, fresh):
        agent.planning_interval = None
        agent.model = ScriptedModel([_final("ok")])
        assert agent.run("And tomorrow?", reset=False) == "ok"
        prompts.append(messages_as_dicts(agent.model.seen[0]))
    assert prompts[1] == prompts[0]
    calling = [m for m in prompts[1] if m["role"] == "tool-call"]
    assert "'arguments': {'location': 'Paris', 'unit': 'C'}" in calling[0]["content"][0]["text"]


def _final(answer):
    from smolagents.models import (
        ChatMessage,
        ChatMessageToolCall,
        ChatMessageToolCallFunction,
        MessageRole,
    )

    return ChatMessage(
        role=MessageRole.ASSISTANT,
        content=None,
        tool_calls=[
            ChatMessageToolCall(
                id="c9",
                type="function",
                function=ChatMessageToolCallFunction(
                    name="final_answer", arguments={"answer": answer}
                ),
            )
        ],
    )


def test_agentscope_memory_class_behaves_like_inmemorymemory(client, ctx):
    """The same sequence against the real InMemoryMemory and the server-backed class."""

    user = Msg("user", "What's the weather in Paris?", "user")
    asst = Msg("Friday", [TextBlock(type="text", text="Sunny.")], "assistant")
    hint = Msg("system", "think step by step", "system")

    async def scenario(mem):
        log = []
        await mem.add([user, asst])
        await mem.add(hint, marks="hint")
        await mem.add(user)  # known id: skipped
        log.append(await mem.size())
        await mem.add(user, allow_duplicates=True)
        log.append(await mem.size())
        log.append([m.id for m in await mem.get_memory(mark="hint")])
        log.append([m.id for m in await mem.get_memory(exclude_mark="hint")])
        log.append(await mem.delete([user.id]))
        log.append(await mem.size())
        await mem.update_compressed_summary("<summary>weather</summary>")
        first = (await mem.get_memory())[0]
        log.append((first.role, first.content))
        log.append(len(await mem.get_memory(prepend_summary=False)))
        state = mem.state_dict()
        log.append(state)
        await mem.add(user)  # deleted, so no longer known: added again
        log.append([m.id for m in await mem.get_memory(prepend_summary=False)])
        mem.load_state_dict(state)
        log.append(mem.state_dict() == state)
        await mem.clear()
        log.append(await mem.size())
        return log

    reference = run_coroutine(scenario(InMemoryMemory()))
    served = run_coroutine(scenario(ServerMemory(client, ctx["id"])))
    assert json.loads(json.dumps(served)) == json.loads(json.dumps(reference))


def test_agentscope_state_round_trip_and_tool_input_over_http(client):
    ctx = client.context(
        keys={"test": "as-http"},
        metadata={"user_settings": {"data": {"theme": "dark"}, "version": 3}},
    )
    state = {
        "_compressed_summary": "",
        "content": [
            [
                {
                    "id": "a1",
                    "name": "user",
                    "role": "user",
                    "content": "Which Led Zeppelin albums are in the store?",
                    "metadata": {},
                    "timestamp": "2026-11-21 21:42:34.560",
                },
                [],
            ],
            [
                {
                    "id": "a2",
                    "name": "Friday",
                    "role": "assistant",
                    "content": "There are 14 albums.",
                    "metadata": {},
                    "timestamp": "2026-11-21 21:42:35.000",
                },
                ["important"],
            ],
            [
                {
                    "id": "a3",
                    "name": "user",
                    "role": "user",
                    "content": "And which of them sold the most?",
                    "metadata": {},
                    "timestamp": "2026-11-21 21:42:36.000",
                },
                [],
            ],
        ],
    }
    assert client.agentscope_load_state(ctx["id"], state) == {"created": 3, "pruned": 0}
    assert client.agentscope_state(ctx["id"]) == state
    assert client.agentscope_state(ctx["id"], format="legacy") == {
        "content": [m for m, _ in state["content"]]
    }
    assert client.tool_input_query(ctx["id"]) == (
        "\nChat history: \nHuman: Which Led Zeppelin albums are in the store?\nAI: There are "
        "14 albums."
        "Latest user question: And which of them sold the most?"
    )
    assert client.tool_input(ctx["id"])["user_settings"] == {
        "data": {"theme": "dark"},
        "version": 3,
    }


def test_backup_export_import_over_http(client, ctx):
    import_run(client, ctx["id"], run_agent("code"), client_id="b1")
    # Characters str.splitlines ends a line at: export writes them unescaped inside one line.
    client.append_message(ctx["id"], role="user", text="one\u2028line\x85not\x1cthree")
    other = client.context(keys={"test": "not-exported"})
    lines = list(client.export_lines(context_ids=[ctx["id"]]))
    assert json.loads(lines[0])["type"] == "header"
    assert json.loads(lines[-1])["type"] == "trailer"
    exported = [json.loads(line) for line in lines[1:]]
    assert "one\u2028line\x85not\x1cthree" in [row.get("text") for row in exported]
    context_rows = [row for row in exported if row["type"] == "context"]
    assert len(context_rows) == 1 and context_rows[0]["keys"] == ctx["keys"]
    assert {"test": "not-exported"} not in [row.get("keys") for row in exported]
    assert other["keys"] == {"test": "not-exported"}
    result = client.import_lines(lines)
    assert sum(result["created"].values()) == 0 and result["skipped"]["steps"] == 4


def test_errors_carry_the_servers_detail(client, live_server):
    with pytest.raises(NotFoundError) as exc:
        client.export_smolagents_run(999_999)
    assert exc.value.detail == "run 999999 not found"
    ctx = client.context(keys={"test": "errors"})
    with pytest.raises(ApiError) as exc:
        client.import_smolagents_run(ctx["id"], steps=[{"nothing": 1}], client_id="x")
    assert exc.value.status == 422 and "not a smolagents step" in str(exc.value.detail)
    with pytest.raises(ApiError) as exc:
        MemoryClient(live_server.url, "am_bad_key", retries=0).get_context(ctx["id"])
    assert exc.value.status == 401


def test_client_sends_numpy_vectors_with_a_batch_and_with_memories(client, settings):
    import numpy as np

    from memory_app.models import Embedding, MemoryEmbedding

    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    register_models(**{"client-np": 4})
    ctx = client.context(keys={"test": "client-vectors"})
    vectors = np.eye(4, dtype=np.float32)[:3]
    answer = client.append_messages(
        ctx["id"],
        [{"role": "user", "text": t} for t in ("red", "green", "blue")],
        vectors=vectors,
        vector_model="client-np",
    )
    ids = [m["id"] for m in answer["messages"]]
    assert [m["seq"] for m in answer["messages"]] == [1, 2, 3]
    # The whole stored messages when asked.
    whole = client.append_messages(ctx["id"], [{"role": "user", "text": "cyan"}], full=True)
    assert whole["messages"][0]["text"] == "cyan" and whole["messages"][0]["seq"] == 4
    stored = dict(
        Embedding.objects.filter(message_id__in=ids, model="client-np").values_list(
            "message_id", "dimensions"
        )
    )
    assert stored == dict.fromkeys(ids, 4)
    hits = client.select(
        ctx["id"],
        selector="search",
        mode="semantic",
        k=1,
        model="client-np",
        query_vector=[0.0, 1.0, 0.0, 0.0],
    )
    assert [i["message"]["id"] for i in hits["items"]] == [ids[1]]
    with pytest.raises(ApiError) as exc:
        client.append_messages(
            ctx["id"],
            [{"role": "user", "text": "short"}],
            vectors=[[1.0, 0.0]],
            vector_model="client-np",
        )
    assert exc.value.status == 422 and "messages[0]" in str(exc.value.detail)
    memory = client.record_memory(
        context_id=ctx["id"], content="Ada likes red", vector=np.ones(4), vector_model="client-np"
    )
    mid = memory["items"][0]["memory"]["id"]
    assert MemoryEmbedding.objects.get(memory_record_id=mid, model="client-np").dimensions == 4


# --- a real AgentScope ReActAgent on the server-backed memory ------------------------


class ScriptedChatModel:
    """An AgentScope chat model answering from a script; records every prompt it was given.

    Reasoning calls pop the script; the compression call (the one asking for `structured_model`)
    answers the summary fields."""

    def __new__(cls, *args, **kwargs):
        from agentscope.model import ChatModelBase

        # Built lazily so the module imports without agentscope's model stack at collection time.
        class _Scripted(ChatModelBase):
            def __init__(self, script):
                super().__init__(model_name="scripted", stream=False)
                self.script = list(script)
                self.calls: list[tuple[str, list]] = []

            async def __call__(
                self, messages, tools=None, tool_choice=None, structured_model=None, **kw
            ):
                from agentscope.model import ChatResponse

                self.calls.append(
                    ("compress" if structured_model else "reason", json.loads(json.dumps(messages)))
                )
                if structured_model is not None:
                    fields = {name: f"{name} so far" for name in structured_model.model_fields}
                    return ChatResponse(
                        content=[TextBlock(type="text", text="summary")], metadata=fields
                    )
                return ChatResponse(content=self.script.pop(0))

        return _Scripted(*args, **kwargs)


def _react_script():
    from agentscope.message import ToolUseBlock

    return [
        [ToolUseBlock(type="tool_use", id="call_w1", name="get_weather", input={"city": "Paris"})],
        [TextBlock(type="text", text="It is sunny and 22C in Paris.")],
        # Second reply, asked for structured output: the finish function first, then the text
        # the agent's hint asks for.
        [
            ToolUseBlock(
                type="tool_use",
                id="call_f1",
                name="generate_response",
                input={"city": "Rome", "sky": "cloudy"},
            )
        ],
        [TextBlock(type="text", text="Rome is cloudy.")],
    ]


def _react_agent(memory):
    from agentscope.agent import ReActAgent
    from agentscope.formatter import OpenAIChatFormatter
    from agentscope.token import CharTokenCounter
    from agentscope.tool import Toolkit, ToolResponse

    def get_weather(city: str) -> ToolResponse:
        """Current weather of a city.

        Args:
            city (str): the city name
        """
        return ToolResponse(content=[TextBlock(type="text", text=f"Sunny, 22C in {city}")])

    toolkit = Toolkit()
    toolkit.register_tool_function(get_weather)
    agent = ReActAgent(
        name="Friday",
        sys_prompt="You are a weather assistant.",
        model=ScriptedChatModel(_react_script()),
        formatter=OpenAIChatFormatter(),
        toolkit=toolkit,
        memory=memory,
        compression_config=ReActAgent.CompressionConfig(
            enable=True,
            agent_token_counter=CharTokenCounter(),
            trigger_threshold=600,
            keep_recent=2,
        ),
    )
    agent.set_console_output_enabled(False)
    return agent


def _run_react(memory):
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        sky: str

    agent = _react_agent(memory)

    async def scenario():
        first = await agent(Msg("user", "What's the weather in Paris?", "user"))
        second = await agent(Msg("user", "And in Rome?", "user"), structured_model=Weather)
        entries = [
            [(m.name, m.role, m.content), sorted(marks)]
            for m, marks in [
                (Msg.from_dict(d), marks) for d, marks in (await _state(memory))["content"]
            ]
        ]
        return {
            "replies": [
                (first.get_text_content(), first.metadata),
                (second.get_text_content(), second.metadata),
            ],
            "calls": agent.model.calls,
            "entries": entries,
            "summary": (await _state(memory))["_compressed_summary"],
            "size": await memory.size(),
        }

    return json.loads(json.dumps(run_coroutine(scenario())))


async def _state(memory):
    return memory.state_dict()


def test_react_agent_runs_on_server_memory_exactly_as_on_in_memory_memory(client, ctx):
    """A real ReActAgent (scripted model, real formatter, toolkit and compression) sees the same
    prompts, answers the same and leaves the same memory (entries, marks, summary) whether its
    memory is AgentScope's InMemoryMemory or the server's."""
    reference = _run_react(InMemoryMemory())
    served = _run_react(ServerMemory(client, ctx["id"]))
    assert served == reference
    # The scenario did exercise what the agent needs beyond add/get: compression summarised and
    # marked messages, and the structured-output hint was added then deleted by its mark.
    assert [kind for kind, _ in served["calls"]].count("compress") >= 1
    assert served["summary"].startswith("<system-info>Here is a summary")
    assert any("compressed" in marks for _, marks in served["entries"])
    assert served["replies"][1] == ["Rome is cloudy.", {"city": "Rome", "sky": "cloudy"}]
    hint_prompts = [
        m
        for kind, prompt in served["calls"]
        for m in prompt
        if "Now generate a text response" in str(m)
    ]
    assert len(hint_prompts) == 1
    assert not any("hint" in marks for _, marks in served["entries"])
    # The summary is what the later prompts start from (prepended, compressed ones left out).
    last_prompt = served["calls"][-1][1]
    assert "Here is a summary" in str(last_prompt[1])
    assert "What's the weather in Paris?" not in str(last_prompt)


def test_server_memory_marks_follow_in_memory_memory(client, ctx):
    """update_messages_mark (add, replace, remove, by ids) and delete_by_mark counted alike."""
    a = Msg("user", "a", "user")
    b = Msg("assistant", "b", "assistant")
    c = Msg("user", "c", "user")

    async def scenario(mem):
        log = []
        await mem.add([a, b])
        await mem.add(c, marks=["hint", "x"])
        log.append(await mem.update_messages_mark(new_mark="compressed", msg_ids=[a.id, b.id]))
        log.append(await mem.update_messages_mark(new_mark="compressed", msg_ids=[a.id]))  # has it
        log.append(await mem.update_messages_mark(new_mark="old", old_mark="compressed"))
        log.append(await mem.update_messages_mark(new_mark=None, old_mark="x"))
        log.append(await mem.update_messages_mark(new_mark=None))
        log.append(await mem.update_messages_mark(new_mark="all"))
        log.append(mem.state_dict()["content"])
        log.append(await mem.delete_by_mark(["nothing", "hint"]))
        log.append(await mem.delete_by_mark("old"))
        log.append([m.id for m in await mem.get_memory()])
        try:
            await mem.delete_by_mark([1])
        except TypeError:
            log.append("TypeError")
        return log

    reference = run_coroutine(scenario(InMemoryMemory()))
    served = run_coroutine(scenario(ServerMemory(client, ctx["id"])))
    assert json.loads(json.dumps(served)) == json.loads(json.dumps(reference))
    assert reference[-2] == [] and reference[-1] == "TypeError"


def test_react_agent_uses_server_long_term_memory_in_its_default_mode(client, ctx):
    """ReActAgent's default long_term_memory_mode is "both": besides the two tools it calls the
    developer's `retrieve(msg)` before replying and `record(msgs)` after. The README's
    `ReActAgent(..., long_term_memory=ServerLongTermMemory(...))` raised AttributeError on the
    first reply; now what the server remembers reaches the prompt and the turn is remembered."""
    from agentscope.agent import ReActAgent
    from agentscope.formatter import OpenAIChatFormatter

    from memory_app.client.agentscope import ServerLongTermMemory

    client.record_memory(context_id=ctx["id"], content="Ada prefers green tea to coffee")
    model = ScriptedChatModel([[TextBlock(type="text", text="Green tea, she told me so.")]])
    agent = ReActAgent(
        name="Friday",
        sys_prompt="You are Ada's assistant.",
        model=model,
        formatter=OpenAIChatFormatter(),
        memory=ServerMemory(client, ctx["id"]),
        long_term_memory=ServerLongTermMemory(client, ctx["id"]),
    )
    agent.set_console_output_enabled(False)
    reply = run_coroutine(agent(Msg("user", "Does Ada drink coffee?", "user")))
    assert reply.get_text_content() == "Green tea, she told me so."
    [(_, prompt)] = model.calls
    recalled = [m for m in prompt if "<long_term_memory>" in str(m.get("content"))]
    assert len(recalled) == 1 and "Ada prefers green tea to coffee" in str(recalled[0]["content"])
    # The tools the agent is given say what they do (their docstrings are the descriptions).
    tools = {t["function"]["name"]: t["function"] for t in agent.toolkit.get_json_schemas()}
    assert "record important information" in tools["record_to_memory"]["description"]
    assert tools["retrieve_from_memory"]["parameters"]["properties"]["keywords"]["description"]
    # The turn was recorded: the question and the answer, not the recalled-memory message.
    contents = [
        i["content"]
        for i in client.retrieve_memories(context_id=ctx["id"], query="Ada coffee tea", limit=10)[
            "items"
        ]
    ]
    assert sorted(contents) == sorted(
        ["Ada prefers green tea to coffee", "Does Ada drink coffee?", "Green tea, she told me so."]
    )
    # Recording the same turn again adds nothing (the server knows the content).
    run_coroutine(
        agent.long_term_memory.record([Msg("user", "Does Ada drink coffee?", "user"), None])
    )
    again = client.retrieve_memories(context_id=ctx["id"], query="Ada coffee tea", limit=10)[
        "items"
    ]
    assert len(again) == 3
    with pytest.raises(TypeError):
        run_coroutine(agent.long_term_memory.retrieve(["not a Msg"]))
