"""The shapes of the framework endpoints: smolagents runs and steps, AgentScope working memory,
the AgentKit tool-input object."""

from __future__ import annotations

from typing import Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field

from memory_app.schemas.fields import Id, JsonObject, JsonValue, Short, Text, _examples


class SmolRunIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "system_prompt": "You are an expert assistant who can solve any task "
                    "using tools.",
                    "client_id": "run-2026-11-21-001",
                    "agent_name": "Atlas",
                    "status": "success",
                    "final_answer": "Sunny, 22C",
                    "steps": [
                        {"task": "What's the weather in Paris?", "task_images": None},
                        {
                            "step_number": 1,
                            "timing": {
                                "start_time": 1795297221.66,
                                "end_time": 1795297222.1,
                                "duration": 0.44,
                            },
                            "model_input_messages": [],
                            "tool_calls": [
                                {
                                    "id": "call_abc123",
                                    "type": "function",
                                    "function": {
                                        "name": "get_weather",
                                        "arguments": {"city": "Paris"},
                                    },
                                }
                            ],
                            "error": None,
                            "model_output_message": None,
                            "model_output": "I will check the weather.",
                            "code_action": None,
                            "observations": "Sunny in Paris, 22C",
                            "observations_images": None,
                            "action_output": None,
                            "token_usage": {
                                "input_tokens": 120,
                                "output_tokens": 15,
                                "total_tokens": 135,
                            },
                            "is_final_answer": False,
                        },
                    ],
                }
            ]
        }
    )
    steps: list[JsonObject] = Field(description="agent.memory.get_full_steps(), as JSON")
    system_prompt: Text = ""
    client_id: Short(200) | None = Field(None, description="makes the import idempotent")
    agent_name: Short(200) = ""
    task: Text | None = None
    status: Literal["success", "failed", "max_steps_error", "cancelled"] | None = None
    final_answer: JsonValue = None
    metadata: JsonObject = {}


class SmolRunOut(Schema):
    model_config = _examples({"run_id": 3, "created": True, "status": "success", "step_count": 2})
    run_id: int
    created: bool
    status: str
    step_count: int


SMOL_STEP_EXAMPLE = {
    "step_number": 1,
    "timing": {"start_time": 1795297221.66, "end_time": 1795297222.1, "duration": 0.44},
    "model_input_messages": [],
    "tool_calls": [
        {
            "id": "call_abc123",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }
    ],
    "error": None,
    "model_output_message": None,
    "model_output": "I will check the weather.",
    "code_action": None,
    "observations": "Sunny in Paris, 22C",
    "observations_images": None,
    "action_output": None,
    "token_usage": {"input_tokens": 120, "output_tokens": 15, "total_tokens": 135},
    "is_final_answer": False,
}


class SmolExportOut(Schema):
    model_config = _examples(
        {
            "system_prompt": "You are an expert assistant who can solve any task using tools.",
            "task": "What's the weather in Paris?",
            "status": "success",
            "final_answer": "Sunny, 22C",
            "steps": [
                {"task": "What's the weather in Paris?", "task_images": None},
                SMOL_STEP_EXAMPLE,
            ],
        }
    )
    system_prompt: str
    task: str
    status: str
    final_answer: Any = None
    steps: list[dict[str, Any]]


class SmolStepsIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "start_index": 2,
                    "steps": [
                        {
                            "step_number": 1,
                            "timing": {
                                "start_time": 1795297221.66,
                                "end_time": 1795297222.1,
                                "duration": 0.44,
                            },
                            "tool_calls": [],
                            "error": None,
                            "model_output": "Thinking...",
                            "observations": "ok",
                            "is_final_answer": False,
                        }
                    ],
                }
            ]
        }
    )
    start_index: int = Field(
        ge=1, le=2**31 - 1, description="index of the first step in agent.memory.steps, from 1"
    )
    steps: list[JsonObject]


class StepsOut(Schema):
    model_config = _examples({"positions": [2, 3]})
    positions: list[int]


class ChatMessageOut(Schema):
    model_config = _examples(
        {
            "role": "user",
            "content": [{"type": "text", "text": "New task:\nWhat's the weather in Paris?"}],
        },
        {
            "role": "tool-call",
            "content": [
                {
                    "type": "text",
                    "text": "Calling tools:\n[{'id': 'call_abc123', 'type': 'function', "
                    "'function': {'name': 'get_weather', 'arguments': {'city': 'Paris'}}}]",
                }
            ],
        },
    )
    role: str
    content: Any
    tool_calls: Any = None
    raw: Any = None
    token_usage: Any = None


class StateIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "state": {
                        "_compressed_summary": "",
                        "content": [
                            [
                                {
                                    "id": "GdMRPLwbtcKWGb9NEix92K",
                                    "name": "user",
                                    "role": "user",
                                    "content": "What's the weather in Paris?",
                                    "metadata": {},
                                    "timestamp": "2026-11-21 21:42:34.560",
                                },
                                [],
                            ]
                        ],
                    },
                    "replace": False,
                }
            ]
        }
    )
    state: JsonObject = Field(
        description='{"content": [...]} or {"content": [[msg, marks]], "_compressed_summary": ...}'
    )
    replace: bool = Field(
        False, description="load_state_dict semantics: the memory becomes exactly this state"
    )


class AgentScopeImportOut(Schema):
    model_config = _examples({"created": 2, "pruned": 0})
    created: int
    pruned: int


class AddIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "msgs": [
                        {
                            "id": "g6AinCPFmjjT7JwvLABHvY",
                            "name": "Friday",
                            "role": "assistant",
                            "content": [{"type": "text", "text": "It's sunny and 22C in Paris."}],
                            "metadata": {},
                            "timestamp": "2026-11-21 21:42:34.560",
                        }
                    ],
                    "marks": ["important"],
                    "allow_duplicates": False,
                }
            ]
        }
    )
    msgs: list[JsonObject]
    marks: list[Short(200)] = []
    allow_duplicates: bool = False


class AddOut(Schema):
    model_config = _examples({"added": 1})
    added: int


class DeleteIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"msg_ids": ["g6AinCPFmjjT7JwvLABHvY"]}]}
    )
    msg_ids: list[Short(200)]


class CountOut(Schema):
    model_config = _examples({"count": 1})
    count: int


class SummaryIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"summary": "<summary>User asked about Paris weather.</summary>"}]
        }
    )
    summary: Text


AGENTSCOPE_MSG_EXAMPLE = {
    "id": "GdMRPLwbtcKWGb9NEix92K",
    "name": "user",
    "role": "user",
    "content": "What's the weather in Paris?",
    "metadata": {},
    "timestamp": "2026-11-21 21:42:34.560",
}


class MemoryOut(Schema):
    model_config = _examples({"summary": "", "content": [[AGENTSCOPE_MSG_EXAMPLE, ["important"]]]})
    summary: str
    content: list[list[Any]]


class DeleteByMarkIn(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [{"marks": ["hint"]}]})
    marks: list[Short(200)] = Field(description="entries carrying any of these marks are removed")


class UpdateMarksIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"new_mark": "compressed", "msg_ids": ["GdMRPLwbtcKWGb9NEix92K"]},
                {"new_mark": None, "old_mark": "hint"},
            ]
        }
    )
    new_mark: Short(200) | None = Field(description="the mark to add; null removes old_mark")
    old_mark: Short(200) | None = Field(
        None, description="only entries with it; replaced by new_mark"
    )
    msg_ids: list[Short(200)] | None = Field(None, description="only these entries")


class ToolInputQuery(Schema):
    run_id: Id | None = Field(None, description="use this run's tool outputs as intermediate_steps")
    limit: int | None = Field(
        None, ge=1, le=10_000, description="at most this many history messages"
    )


class ChatHistoryItem(Schema):
    model_config = _examples(
        {"content": "Hi", "additional_kwargs": {}, "type": "human", "example": False}
    )
    content: str
    additional_kwargs: dict[str, Any]
    type: str
    example: bool


TOOL_INPUT_EXAMPLE = {
    "chat_history": [
        {"content": "Hi", "additional_kwargs": {}, "type": "human", "example": False},
        {
            "content": "Hello! How can I help?",
            "additional_kwargs": {},
            "type": "ai",
            "example": False,
        },
    ],
    "latest_human_message": "What's the weather in Paris?",
    "user_settings": None,
    "intermediate_steps": {"get_weather": "Sunny in Paris, 22C"},
}


class ToolInputOut(Schema):
    model_config = _examples(TOOL_INPUT_EXAMPLE)
    chat_history: list[ChatHistoryItem]
    latest_human_message: str
    user_settings: dict[str, Any] | None
    intermediate_steps: dict[str, Any]
