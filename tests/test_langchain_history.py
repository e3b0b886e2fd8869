"""LangChain chat history over a live server (`memory_app.client.langchain`), with real
langchain-core: a model wrapped in `RunnableWithMessageHistory` is shown byte for byte the same
OpenAI-format prompts over it as over `InMemoryChatMessageHistory`, before and after a reload,
and the server stores a normal conversation the dashboard and the selectors read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core._api.deprecation import LangChainDeprecationWarning
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
    message_to_dict,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables.history import RunnableWithMessageHistory
from pydantic import Field

from memory_app import auth
from memory_app.client import MemoryClient
from memory_app.client.langchain import AgentMemoryChatMessageHistory
from memory_app.models import Message
from tests.aio import run_coroutine

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # RunnableWithMessageHistory and InMemoryChatMessageHistory are what is compared against.
    pytest.mark.filterwarnings(
        f"ignore::{LangChainDeprecationWarning.__module__}.LangChainDeprecationWarning"
    ),
]

# Arguments jsonb would reorder (it sorts keys shorter first): the prompt prints them as written.
BOOKING = {"month": "May", "to": "Lisbon", "adults": 2, "filters": {"stops": 0, "cabin": "eco"}}


def _answers() -> list[AIMessage]:
    """What the model says, turn by turn: tool calls (with usage and response metadata), then
    text."""
    return [
        AIMessage(
            content="Let me look.",
            id="ai-1",
            tool_calls=[
                {"name": "search_flights", "args": BOOKING, "id": "call_1", "type": "tool_call"},
                {"name": "weather", "args": {"city": "Lisbon", "at": "noon"}, "id": "call_2"},
            ],
            usage_metadata={"input_tokens": 21, "output_tokens": 9, "total_tokens": 30},
            response_metadata={"model_name": "fake-1", "finish_reason": "tool_calls"},
            additional_kwargs={"refusal": None},
        ),
        AIMessage(
            content=[{"type": "text", "text": "Two flights, sunny."}],
            id="ai-2",
            usage_metadata={"input_tokens": 40, "output_tokens": 5, "total_tokens": 45},
            response_metadata={"model_name": "fake-1", "finish_reason": "stop"},
        ),
        AIMessage(content="It is a harbour by a bridge.", id="ai-3", name="planner"),
        AIMessage(content="Booked.", id="ai-4"),
    ]


class ScriptedModel(BaseChatModel):
    """Answers from a script and keeps every prompt it was shown, as OpenAI-format JSON text."""

    answers: list[Any]
    prompts: list[str] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], stop=None, run_manager=None, **kwargs):
        self.prompts.append(json.dumps(convert_to_openai_messages(messages)))
        answer = self.answers[len(self.prompts) - 1]
        return ChatResult(generations=[ChatGeneration(message=answer)])


# The turns sent: a system prompt and a question, the tool results, a multimodal question, and
# (after the reload) one more.
TURNS = [
    [SystemMessage("You book trips."), HumanMessage("Flights to Lisbon in May for two?", id="h1")],
    [
        ToolMessage('{"flights": 2}', tool_call_id="call_1", name="search_flights"),
        ToolMessage("sunny", tool_call_id="call_2", artifact={"source": "met", "c": 21}),
    ],
    [
        HumanMessage(
            [
                {"type": "text", "text": "What is this place?"},
                {"type": "image_url", "image_url": {"url": "https://example.org/lx.png"}},
            ],
            name="ada",
        )
    ],
]
LAST = [HumanMessage("Book the first one.")]


def _chain(model, history_for):
    return RunnableWithMessageHistory(model, history_for)


def _talk(chain, turns, session: str = "s1", *, asynchronous: bool = False) -> None:
    config = {"configurable": {"session_id": session}}
    for turn in turns:
        if asynchronous:
            run_coroutine(chain.ainvoke(turn, config))
        else:
            chain.invoke(turn, config)


@pytest.fixture
def client(live_server):
    secret = auth.apikey_create(name="langchain", scopes=("read", "write")).secret
    with MemoryClient(live_server.url, secret, retries=1, backoff=0.01) as mc:
        yield mc


def _dumps(messages: list[BaseMessage]) -> str:
    return json.dumps([message_to_dict(m) for m in messages])


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_the_model_sees_the_same_prompts_as_over_the_in_memory_history(client, asynchronous):
    reference, ours = ScriptedModel(answers=_answers()), ScriptedModel(answers=_answers())
    memory = InMemoryChatMessageHistory()
    _talk(_chain(reference, lambda session_id: memory), TURNS)
    context_id = client.context(keys={"user": "ada", "app": "lc"})["id"]
    history = AgentMemoryChatMessageHistory(client, context_id)
    _talk(_chain(ours, lambda session_id: history), TURNS, asynchronous=asynchronous)
    assert len(ours.prompts) == 3 and ours.prompts == reference.prompts
    assert '"arguments": "{\\"month\\": \\"May\\", \\"to\\": \\"Lisbon\\"' in ours.prompts[1]
    assert _dumps(history.messages) == _dumps(memory.messages)

    # Reloaded: a new history object (and model) reading the same context goes on as the
    # in-memory one does.
    reloaded = AgentMemoryChatMessageHistory.for_keys(client, {"app": "lc", "user": "ada"})
    assert reloaded.context_id == context_id
    assert _dumps(reloaded.messages) == _dumps(memory.messages)
    assert _dumps(run_coroutine(reloaded.aget_messages())) == _dumps(memory.messages)
    later, later_reference = (
        ScriptedModel(answers=_answers()[3:]),
        ScriptedModel(answers=_answers()[3:]),
    )
    _talk(_chain(later, lambda session_id: reloaded), [LAST], asynchronous=asynchronous)
    _talk(_chain(later_reference, lambda session_id: memory), [LAST])
    assert len(later.prompts) == 1 and later.prompts == later_reference.prompts
    assert _dumps(AgentMemoryChatMessageHistory(client, context_id).messages) == _dumps(
        memory.messages
    )


def test_the_server_holds_a_normal_conversation(client):
    context_id = client.context(keys={"user": "ada", "app": "lc"})["id"]
    history = AgentMemoryChatMessageHistory(client, context_id)
    _talk(_chain(ScriptedModel(answers=_answers()), lambda session_id: history), TURNS)
    rows = list(Message.objects.filter(context_id=context_id).order_by("seq"))
    assert [(m.role, m.name, m.text) for m in rows] == [
        ("system", "", "You book trips."),
        ("user", "", "Flights to Lisbon in May for two?"),
        ("assistant", "", "Let me look."),
        ("tool", "search_flights", '{"flights": 2}'),
        ("tool", "", "sunny"),
        ("assistant", "", "Two flights, sunny."),
        ("user", "ada", "What is this place?"),
        ("assistant", "planner", "It is a harbour by a bridge."),
    ]
    assert rows[2].content == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "call_1", "name": "search_flights", "input": BOOKING},
        {
            "type": "tool_use",
            "id": "call_2",
            "name": "weather",
            "input": {"city": "Lisbon", "at": "noon"},
        },
    ]
    assert json.dumps(rows[2].content[1]["input"]) == json.dumps(BOOKING)
    assert rows[3].content == [
        {
            "type": "tool_result",
            "id": "call_1",
            "output": '{"flights": 2}',
            "name": "search_flights",
        }
    ]
    assert rows[6].content == [
        {"type": "text", "text": "What is this place?"},
        {"type": "image", "url": "https://example.org/lx.png"},
    ]
    # The selectors read it as any conversation.
    window = client.select(context_id, selector="window", k=2)
    assert [i["message"]["role"] for i in window["items"]] == ["user", "assistant"]
    assert window["total_tokens"] > 0


def test_messages_written_by_others_are_read_by_their_role(client):
    context_id = client.context(keys={"user": "bob"})["id"]
    client.append_messages(
        context_id,
        [
            {"role": "system", "text": "be brief"},
            {"role": "user", "text": "hi", "name": "bob"},
            {"role": "assistant", "text": "hello"},
            {
                "role": "tool",
                "text": "42",
                "content": [{"type": "tool_result", "id": "c9", "output": "42"}],
            },
        ],
    )
    history = AgentMemoryChatMessageHistory(client, context_id)
    assert history.messages == [
        SystemMessage("be brief"),
        HumanMessage("hi", name="bob"),
        AIMessage("hello"),
        ToolMessage("42", tool_call_id="c9"),
    ]


def test_clear_forgets_the_history_and_the_dashboard_can_restore_it(client):
    context_id = client.context(keys={"user": "ada", "app": "clear"})["id"]
    history = AgentMemoryChatMessageHistory(client, context_id)
    history.add_messages([HumanMessage("one"), AIMessage("two")])
    history.clear()
    assert history.messages == []
    assert Message.objects.filter(context_id=context_id, pruned_at__isnull=False).count() == 2
    run_coroutine(history.aadd_messages([HumanMessage("three")]))
    assert [m.content for m in history.messages] == ["three"]
    run_coroutine(history.aclear())
    assert run_coroutine(history.aget_messages()) == []
