"""smolagents' own MCP path calls every tool of the memory's MCP server: `ToolCollection.from_mcp`
(through mcpadapt) over Streamable HTTP with a Bearer key, and a ToolCallingAgent (a scripted
model, no network) that leaves optional parameters out, as models do. Also the schema shape that
path needs, and an explicit null taken as a parameter left out."""

from __future__ import annotations

import pytest
from smolagents import ToolCallingAgent, ToolCollection
from smolagents.models import get_tool_json_schema
from smolagents.tools import validate_tool_arguments

from memory_app import auth
from memory_app.models import MemoryRecord, Message
from tests.builders import make_context, make_run
from tests.smol_agents import ScriptedModel, _call
from tests.test_mcp import TOOLS, Session, _secret

pytestmark = pytest.mark.django_db(transaction=True)


def _collection(server, scopes=("read", "write", "admin")):
    secret = auth.apikey_create(name="smolagents", scopes=list(scopes)).secret
    return ToolCollection.from_mcp(
        {
            "url": server.url + "/mcp",
            "transport": "streamable-http",
            "headers": {"Authorization": f"Bearer {secret}"},
        },
        trust_remote_code=True,
        structured_output=True,
    )


def test_every_parameter_has_the_shape_smolagents_needs(asgi_live_server):
    """mcpadapt hands each property to smolagents as it is: a property without `type` becomes a
    string, and one without `nullable` is required. So: no anyOf-with-null, a type on every
    property, a description on every one, and optional ones nullable with their default."""
    listed = Session(asgi_live_server, _secret()).run(lambda s: s.list_tools()).tools
    assert {t.name for t in listed} == TOOLS
    for tool in listed:
        schema = tool.inputSchema
        required = set(schema.get("required", []))
        assert required <= set(schema["properties"]), tool.name
        for name, prop in schema["properties"].items():
            where = f"{tool.name}.{name}"
            assert "anyOf" not in prop, where
            assert prop.get("description"), where
            assert "type" in prop, where
            if name in required:
                assert "nullable" not in prop and "default" not in prop, where
                assert isinstance(prop["type"], str), where
            else:
                assert prop["nullable"] is True and "default" in prop, where
                assert prop["type"][-1] == "null", where
                assert prop.get("enum") is None or None in prop["enum"], where
    by_name = {t.name: t.inputSchema for t in listed}
    assert by_name["append_message"]["required"] == ["context_id", "role"]
    assert by_name["read_run"]["properties"]["max_tokens"]["default"] == 8000
    assert by_name["list_runs"]["properties"]["limit"]["type"] == ["integer", "null"]


def test_from_mcp_calls_every_tool_with_only_its_required_arguments(asgi_live_server):
    context = make_context(keys={"user": "ada", "chat": "1"}, messages=3)
    run = make_run(context=context, steps=3)
    with _collection(asgi_live_server) as collection:
        tools = {t.name: t for t in collection.tools}
        assert set(tools) == TOOLS

        def call(name, **arguments):
            # What a smolagents agent checks before it calls a tool.
            validate_tool_arguments(tools[name], arguments)
            return tools[name](**arguments)

        opened = call("open_context", keys={"user": "ada", "chat": "2"})
        assert opened["created"] is True
        assert call("find_contexts")["items"][0]["id"] == context.pk
        message = call("append_message", context_id=context.pk, role="user")["message"]
        assert message["seq"] == 4 and message["text"] == ""
        assert call("select_context", context_id=context.pk, selector="window", k=2)["count"] == 2
        assert call("search_memory", context_id=context.pk, query="message")["hits"]
        recorded = call("record_memory", content="Ada likes tea", context_id=context.pk)
        memory_id = recorded["items"][0]["memory"]["id"]
        assert call("retrieve_memories", context_id=context.pk, query="tea")["items"]
        assert [m["id"] for m in call("list_memories")["items"]] == [memory_id]
        fixed = call("correct_memory", memory_id=memory_id, content="Ada likes green tea")
        assert fixed["memory"]["content"] == "Ada likes green tea"
        assert call("list_runs", context_id=context.pk)["items"][0]["id"] == run.pk
        assert [s["position"] for s in call("read_run", run_id=run.pk)["steps"]["items"]] == [
            1,
            2,
            3,
        ]
        assert call("delete_memory", memory_id=memory_id)["deleted"] == "archived"
        # An explicit null is the parameter left out, whatever its default.
        nulls = call("list_runs", context_id=context.pk, after=None, limit=None)
        assert nulls["items"][0]["id"] == run.pk
    assert MemoryRecord.objects.get(pk=memory_id).archived_at is not None


def test_a_tool_calling_agent_uses_the_tools_it_got_from_mcp(asgi_live_server):
    context = make_context(keys={"user": "ada"})
    script = [
        _call("c1", "find_contexts", {"keys": {"user": "ada"}, "exact": True}),
        _call("c2", "append_message", {"context_id": context.pk, "role": "user", "text": "hi"}),
        _call("c3", "final_answer", {"answer": "done"}),
    ]
    model = ScriptedModel(script)
    with _collection(asgi_live_server, scopes=("read", "write")) as collection:
        agent = ToolCallingAgent(tools=collection.tools, model=model, max_steps=4)
        assert agent.run("Say hi to Ada") == "done"
        # What the model is offered: only the required parameters are required.
        append = next(t for t in collection.tools if t.name == "append_message")
        offered = get_tool_json_schema(append)["function"]["parameters"]
        assert offered["required"] == ["context_id", "role"]
    observations = [
        step.observations for step in agent.memory.steps if getattr(step, "observations", None)
    ]
    assert str(context.pk) in observations[0] and "error" not in observations[0].lower()
    assert list(Message.objects.filter(context=context).values_list("text", flat=True)) == ["hi"]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("list_runs", {"after": None, "limit": None}),
        ("select_context", {"selector": "window", "k": 1, "policy": None, "search_k": None}),
        ("append_message", {"role": "user", "text": None, "name": None, "tags": None}),
        ("retrieve_memories", {"query": "x", "include_archived": None, "limit": None}),
    ],
)
def test_an_explicit_null_is_the_parameter_left_out(asgi_live_server, tool, arguments):
    context = make_context(messages=1)
    Session(asgi_live_server, _secret()).ok(tool, context_id=context.pk, **arguments)


def test_a_null_for_a_required_parameter_is_refused(asgi_live_server):
    context = make_context(messages=1)
    mcp = Session(asgi_live_server, _secret())
    assert "role" in mcp.error("append_message", context_id=context.pk, role=None, text="x")
    assert Message.objects.filter(context=context).count() == 1
