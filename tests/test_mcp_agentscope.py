"""AgentScope's own MCP clients use the memory's MCP server: its Toolkit registers our tools and
a ReActAgent (a scripted model, no network) calls them over Streamable HTTP with a Bearer key."""

from __future__ import annotations

import json

import pytest
from agentscope.agent import ReActAgent
from agentscope.formatter import OpenAIChatFormatter
from agentscope.mcp import HttpStatefulClient, HttpStatelessClient
from agentscope.message import Msg, TextBlock, ToolUseBlock
from agentscope.model import ChatModelBase, ChatResponse
from agentscope.tool import Toolkit

from memory_app import auth
from memory_app.models import Message
from memory_app.services.messages import messages_append
from tests.aio import run_coroutine
from tests.builders import make_context

pytestmark = pytest.mark.django_db(transaction=True)


def _client(server, cls=HttpStatelessClient, scopes=("read", "write")):
    secret = auth.apikey_create(name="agentscope", scopes=list(scopes)).secret
    return cls(
        name="agentmemory",
        transport="streamable_http",
        url=server.url + "/mcp",
        headers={"Authorization": f"Bearer {secret}"},
    )


class ScriptedModel(ChatModelBase):
    """Plays a model: first asks for `search_memory`, then answers with what the tool returned
    (read from the prompt AgentScope formatted, so the answer proves the round trip)."""

    def __init__(self, context_id: int):
        super().__init__("scripted", stream=False)
        self.context_id = context_id
        self.offered: list[str] = []
        self.calls = 0

    async def __call__(self, messages, tools=None, tool_choice=None, **kwargs) -> ChatResponse:
        self.calls += 1
        self.offered = [t["function"]["name"] for t in tools or []]
        if self.calls == 1:
            return ChatResponse(
                content=[
                    ToolUseBlock(
                        type="tool_use",
                        id="call_1",
                        name="search_memory",
                        input={"context_id": self.context_id, "query": "rainy Lyon", "k": 1},
                    )
                ]
            )
        [result] = [m for m in messages if m["role"] == "tool"]
        text = (
            result["content"]
            if isinstance(result["content"], str)
            else result["content"][0]["text"]
        )
        hit = json.loads(text)["hits"][0]["message"]["text"]
        return ChatResponse(content=[TextBlock(type="text", text=f"From memory: {hit}")])


def test_a_react_agent_searches_the_memory_through_agentscopes_mcp_client(asgi_live_server):
    context = make_context(keys={"user": "ada"})
    messages_append(
        context=context,
        items=[
            {"role": "user", "text": "What's the weather in Lyon?"},
            {"role": "assistant", "text": "Rainy in Lyon, 12 degrees."},
            {"role": "user", "text": "And Paris?"},
        ],
    )
    client = _client(asgi_live_server)
    model = ScriptedModel(context.pk)

    async def scenario():
        toolkit = Toolkit()
        await toolkit.register_mcp_client(client)
        agent = ReActAgent(
            name="assistant",
            sys_prompt="Answer from memory.",
            model=model,
            formatter=OpenAIChatFormatter(),
            toolkit=toolkit,
            max_iters=3,
        )
        agent.set_console_output_enabled(False)
        return await agent(Msg("user", "What was the weather in Lyon?", "user"))

    reply = run_coroutine(scenario())
    assert reply.get_text_content() == "From memory: Rainy in Lyon, 12 degrees."
    assert {"search_memory", "append_message", "select_context", "read_run"} <= set(model.offered)


def test_agentscope_callable_tools_write_and_report_errors(asgi_live_server):
    context = make_context(keys={"user": "bob"})
    client = _client(asgi_live_server, HttpStatefulClient)

    async def scenario():
        await client.connect()
        try:
            append = await client.get_callable_function("append_message")
            ok = await append(context_id=context.pk, role="user", text="remember the milk")
            bad = await append(context_id=context.pk, role="wizard", text="nope")
            select = await client.get_callable_function("select_context")
            window = await select(context_id=context.pk, selector="window", k=5)
        finally:
            await client.close()
        return ok, bad, window

    ok, bad, window = run_coroutine(scenario())
    assert json.loads(ok.content[0]["text"])["message"]["text"] == "remember the milk"
    assert "role" in bad.content[0]["text"] and "Error" in bad.content[0]["text"]
    assert [i["message"]["text"] for i in json.loads(window.content[0]["text"])["items"]] == [
        "remember the milk"
    ]
    assert list(Message.objects.filter(context=context).values_list("text", flat=True)) == [
        "remember the milk"
    ]
