"""Real smolagents agents driven by scripted models (no network): tool calls, a tool error,
planning steps, a final answer and token usage, for the interop and client tests."""

from __future__ import annotations

import json

from smolagents import CodeAgent, Model, ToolCallingAgent, tool
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
)
from smolagents.monitoring import TokenUsage


@tool
def get_weather(location: str, unit: str) -> str:
    """Current weather.

    Args:
        location: the city name
        unit: C or F
    """
    return f"Sunny in {location}, 22{unit}"


@tool
def get_population(city: str) -> str:
    """Population of a city.

    Args:
        city: the city name
    """
    raise RuntimeError(f"population service down for {city}")


class ScriptedModel(Model):
    """Answers from a fixed script; records what it was shown."""

    def __init__(self, script):
        super().__init__(model_id="scripted")
        self.script = list(script)
        self.seen: list[list] = []

    def generate(
        self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kw
    ):
        self.seen.append(messages)
        return self.script.pop(0)


def _call(call_id, name, arguments, *, content=None, usage=(100, 10)):
    return ChatMessage(
        role=MessageRole.ASSISTANT,
        content=content,
        tool_calls=[
            ChatMessageToolCall(
                id=call_id,
                type="function",
                function=ChatMessageToolCallFunction(name=name, arguments=arguments),
            )
        ],
        token_usage=TokenUsage(input_tokens=usage[0], output_tokens=usage[1]),
    )


def tool_calling_script():
    return [
        ChatMessage(
            role=MessageRole.ASSISTANT,
            content="1. weather\n2. population\n3. answer",
            token_usage=TokenUsage(40, 9),
        ),
        # "location" before "unit": jsonb would store them the other way round.
        _call(
            "call_w1",
            "get_weather",
            {"location": "Paris", "unit": "C"},
            content="I will check the weather.",
            usage=(120, 15),
        ),
        _call("call_p1", "get_population", {"city": "Paris"}, usage=(150, 12)),
        _call("call_f1", "final_answer", {"answer": "Sunny, 22C"}, usage=(200, 10)),
    ]


def code_script():
    return [
        ChatMessage(
            role=MessageRole.ASSISTANT,
            content="1. compute 2**10\n2. answer",
            token_usage=TokenUsage(50, 8),
        ),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            content="Thought: compute\n<code>\nx = 2**10\nprint(x)\nundefined_fn()\n</code>",
            token_usage=TokenUsage(100, 20),
        ),
        ChatMessage(
            role=MessageRole.ASSISTANT,
            content="Thought: done\n<code>\nfinal_answer(1024)\n</code>",
            token_usage=TokenUsage(150, 12),
        ),
    ]


def make_tool_calling_agent(**kw):
    return ToolCallingAgent(
        tools=[get_weather, get_population],
        model=ScriptedModel(tool_calling_script()),
        verbosity_level=-1,
        planning_interval=5,
        **kw,
    )


def make_code_agent(**kw):
    return CodeAgent(
        tools=[], model=ScriptedModel(code_script()), verbosity_level=-1, planning_interval=5, **kw
    )


AGENTS = {
    "tool_calling": (make_tool_calling_agent, "What's the weather in Paris?"),
    "code": (make_code_agent, "What is 2**10?"),
}


def run_agent(kind: str, **kw):
    factory, task = AGENTS[kind]
    agent = factory(**kw)
    agent.run(task)
    return agent


def jsonable(value):
    """What survives JSON: the acceptance compares JSON-able fields."""
    return json.loads(json.dumps(value))


def messages_as_dicts(chat_messages):
    return [jsonable(m.dict()) for m in chat_messages]
