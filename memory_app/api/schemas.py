"""Input (`...In`) and output (`...Out`) schemas of contexts, messages, runs, steps, tool calls.

Inputs are strict about what the database cannot hold (NUL, lone surrogates, non-finite
numbers, over-long strings, out-of-range integers): those are 422 here rather than errors later.
Outputs list their fields explicitly; JSON columns are typed `Any` because data may also arrive
through imports or the dashboard.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import HttpResponse
from ninja import Schema
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from memory_app.api.common import (
    VECTOR_MODEL_DESCRIPTION,
    Id,
    Int32,
    Int64,
    JsonObject,
    JsonValue,
    Short,
    Text,
    Vector,
    _check_json,
    json_dumps,
)
from memory_app.models import MessageRole, RunStatus, StepKind
from memory_app.services.messages import MAX_BATCH

ClientId = Short(200)
Role = Literal[tuple(MessageRole.values)]  # type: ignore[valid-type]
FinishStatus = Literal[tuple(s for s in RunStatus.values if s != RunStatus.RUNNING)]  # type: ignore[valid-type]
Kind = Literal[tuple(StepKind.values)]  # type: ignore[valid-type]
Tag = Short(200)
# Times (unix epoch seconds) and durations: finite and within a sane range.
Seconds = Annotated[float, Field(ge=-1e12, le=1e12, allow_inf_nan=False)]


def _examples(*examples: dict) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": list(examples)})


class BulkIn(BaseModel):
    """Bodies that arrive by the thousand (messages, steps): plain pydantic models. ninja's
    `Schema` wraps every object in a root validator made for reading ORM objects, which cost
    about a third of a 1,000-message batch's validation."""


# --- contexts ------------------------------------------------------------------------------------


class ContextIn(Schema):
    """Get-or-create: the same keys (in any order) always name the same context. `title` and
    `metadata` are used only when the context is created."""

    model_config = _examples({"keys": {"user": "ada", "chat": "42"}, "title": "Ada's chat"})
    keys: Annotated[JsonObject, Field(min_length=1)]
    title: Short(500) | None = None
    metadata: JsonObject | None = None


class ContextUpdateIn(Schema):
    model_config = _examples({"title": "Renamed", "metadata": {"project": "apollo"}})
    title: Short(500) | None = None
    metadata: JsonObject | None = None


CONTEXT_EXAMPLE = {
    "id": 7,
    "keys": {"user": "ada", "chat": "42"},
    "title": "Ada's chat",
    "metadata": {},
    "last_seq": 12,
    "message_count": 12,
    "token_count": 840,
    "run_count": 1,
    "created_at": "2025-01-01T10:00:00Z",
    "updated_at": "2025-01-01T10:05:00Z",
    "last_activity_at": "2025-01-01T10:05:00Z",
}


class ContextOut(Schema):
    model_config = _examples(CONTEXT_EXAMPLE)
    id: int
    keys: Any
    title: str
    metadata: Any
    last_seq: int
    message_count: int
    token_count: int
    run_count: int
    created_at: datetime
    updated_at: datetime
    last_activity_at: datetime


class ContextPage(Schema):
    model_config = _examples({"items": [CONTEXT_EXAMPLE], "has_more": False, "next_cursor": None})
    items: list[ContextOut]
    has_more: bool
    next_cursor: int | None = Field(None, description="pass as `after` to get the next page")


# --- content blocks -------------------------------------------------------------------------------


class _Block(BaseModel):
    # Framework-specific extra fields are kept verbatim (lossless round trip), but still checked.
    # A plain pydantic model: ninja.Schema reads attributes through a getter that drops extras.
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _extras_storable(self):
        _check_json(self.__pydantic_extra__ or {})
        return self


class TextBlock(_Block):
    type: Literal["text"]
    text: Text


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: Text


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: Short(200)
    name: Short(200)
    input: JsonValue = None


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    id: Short(200)
    name: Short(200) | None = None
    output: JsonValue = None


class ImageBlock(_Block):
    """An image by reference (`url`) or a framework `source` object; bytes are not stored here."""

    type: Literal["image"]
    url: Text | None = None
    source: JsonObject | None = None


ContentBlock = Annotated[
    TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock | ImageBlock,
    Field(discriminator="type"),
]


# --- messages -------------------------------------------------------------------------------------

MESSAGE_IN_EXAMPLE = {
    "client_id": "msg-0001",
    "role": "user",
    "name": "ada",
    "text": "What's the weather in Paris?",
    "tags": ["question"],
    "metadata": {"lang": "en"},
}
MESSAGE_WITH_VECTOR_EXAMPLE = {
    "client_id": "msg-0003",
    "role": "user",
    "text": "And in Kyoto?",
    "vector": [0.12, -0.53, 0.84],
    "vector_model": "my-model",
}


class MessageIn(BulkIn):
    model_config = _examples(
        MESSAGE_IN_EXAMPLE,
        {
            "client_id": "msg-0002",
            "role": "assistant",
            "text": "",
            "content": [
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}
            ],
        },
        MESSAGE_WITH_VECTOR_EXAMPLE,
    )
    client_id: ClientId | None = Field(None, description="makes the append idempotent")
    role: Role
    name: Short(200) = ""
    text: Text = ""
    content: list[ContentBlock] | None = Field(None, max_length=1000)
    tags: list[Tag] = Field(default_factory=list, max_length=1000)
    metadata: JsonObject = Field(default_factory=dict)
    run_id: Id | None = None
    step_id: Id | None = None
    source_timestamp: Short(64) = Field("", description="the client's own timestamp, kept verbatim")
    vector: Vector | None = Field(
        None,
        description="a client-computed embedding of `text`, stored with the message (not queued "
        "for the embedding worker); its model's dimensions are checked (422 naming the item)",
    )
    vector_model: Short(200) | None = Field(None, description=VECTOR_MODEL_DESCRIPTION)

    def to_item(self) -> dict[str, Any]:
        item = self.model_dump(exclude={"content", "vector"})
        item["vector"] = self.vector
        # Blocks are stored as sent (exclude_unset): a repeat compares equal to the stored row.
        item["content"] = (
            None
            if self.content is None
            else [b.model_dump(exclude_unset=True) for b in self.content]
        )
        return item


class MessageBatchIn(BulkIn):
    model_config = _examples(
        {"messages": [MESSAGE_IN_EXAMPLE]}, {"messages": [MESSAGE_WITH_VECTOR_EXAMPLE]}
    )
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_BATCH)


MESSAGE_EXAMPLE = {
    "id": 101,
    "context_id": 7,
    "seq": 1,
    "client_id": "msg-0001",
    "role": "user",
    "name": "ada",
    "text": "What's the weather in Paris?",
    "content": None,
    "tags": ["question"],
    "metadata": {"lang": "en"},
    "run_id": None,
    "step_id": None,
    "token_count": 8,
    "tokenizer": "cl100k_base",
    "source_timestamp": "",
    "created_at": "2025-01-01T10:00:00Z",
    "updated_at": "2025-01-01T10:00:00Z",
    "pruned_at": None,
    "pruned_by": "",
    "is_pruned": False,
}


class MessageOut(Schema):
    model_config = _examples(MESSAGE_EXAMPLE)
    id: int
    context_id: int
    seq: int
    client_id: str | None
    role: str
    name: str
    text: str
    content: Any
    tags: list[str]
    metadata: Any
    run_id: int | None
    step_id: int | None
    token_count: int
    tokenizer: str
    source_timestamp: str
    created_at: datetime
    updated_at: datetime
    pruned_at: datetime | None
    pruned_by: str
    is_pruned: bool


class MessageBatchOut(Schema):
    model_config = _examples({"messages": [MESSAGE_EXAMPLE], "created": [True]})
    messages: list[MessageOut]
    created: list[bool] = Field(description="per message: stored now (true) or already stored")


class MessagePage(Schema):
    model_config = _examples({"items": [MESSAGE_EXAMPLE], "has_more": True, "next_cursor": 1})
    items: list[MessageOut]
    has_more: bool
    next_cursor: int | None = Field(
        None, description="seq to pass as `after` (forward paging) or `before` (backward paging)"
    )


class MessageEditIn(Schema):
    model_config = _examples(
        {"text": "What's the weather in Paris today?", "tags": ["question", "edited"]}
    )
    text: Text | None = None
    tags: list[Tag] | None = Field(None, max_length=1000)
    metadata: JsonObject | None = None


class PruneIn(Schema):
    model_config = _examples({"ids": [101, 102], "note": "off-topic"})
    ids: list[Id] = Field(min_length=1, max_length=MAX_BATCH)
    note: Text = ""


class PruneNoteIn(Schema):
    model_config = _examples({"note": "off-topic"})
    note: Text = ""


class PruneOut(Schema):
    model_config = _examples({"changed": [101, 102], "audit_event_id": 55})
    changed: list[int] = Field(description="ids whose state changed (others already were so)")
    audit_event_id: int | None


# --- runs, steps, tool calls -------------------------------------------------------------------------


class RunIn(Schema):
    model_config = _examples(
        {
            "client_id": "run-2025-01-01-a",
            "task": "What's the weather in Paris?",
            "system_prompt": "You are a helpful agent.",
            "agent_name": "weather-bot",
            "framework": "smolagents",
            "metadata": {"model": "gpt-4o"},
        }
    )
    client_id: ClientId | None = None
    task: Text = ""
    system_prompt: Text = ""
    agent_name: Short(200) = ""
    framework: Short(50) = ""
    metadata: JsonObject = Field(default_factory=dict)
    started_at: AwareDatetime | None = None


class RunFinishIn(Schema):
    model_config = _examples({"status": "success", "final_answer": "It is sunny, 21°C."})
    status: FinishStatus
    final_answer: JsonValue = None
    input_tokens: Int64 | None = None
    output_tokens: Int64 | None = None
    total_tokens: Int64 | None = None
    finished_at: AwareDatetime | None = None


RUN_EXAMPLE = {
    "id": 3,
    "context_id": 7,
    "client_id": "run-2025-01-01-a",
    "task": "What's the weather in Paris?",
    "system_prompt": "You are a helpful agent.",
    "agent_name": "weather-bot",
    "framework": "smolagents",
    "status": "running",
    "final_answer": None,
    "input_tokens": None,
    "output_tokens": None,
    "total_tokens": None,
    "started_at": "2025-01-01T10:00:00Z",
    "finished_at": None,
    "duration": None,
    "step_count": 0,
    "error_count": 0,
    "metadata": {},
    "created_at": "2025-01-01T10:00:00Z",
    "updated_at": "2025-01-01T10:00:00Z",
}


class RunOut(Schema):
    model_config = _examples(RUN_EXAMPLE)
    id: int
    context_id: int
    client_id: str | None
    task: str
    system_prompt: str
    agent_name: str
    framework: str
    status: str
    final_answer: Any
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    started_at: datetime | None
    finished_at: datetime | None
    duration: float | None
    step_count: int
    error_count: int
    metadata: Any
    created_at: datetime
    updated_at: datetime


class RunPage(Schema):
    model_config = _examples({"items": [RUN_EXAMPLE], "has_more": False, "next_cursor": None})
    items: list[RunOut]
    has_more: bool
    next_cursor: int | None


class ToolCallIn(BulkIn):
    call_id: Short(200) = ""
    name: Annotated[Short(200), Field(min_length=1)]
    arguments: JsonValue = None
    output: Text | None = None
    success: bool | None = None
    duration: Seconds | None = None


class StepIn(BulkIn):
    client_id: ClientId | None = None
    kind: Kind
    step_number: Int32 | None = None
    task: Text | None = None
    plan: Text | None = None
    model_input_messages: JsonValue = None
    model_output_message: JsonValue = None
    model_output: JsonValue = None
    code_action: Text | None = None
    observations: Text | None = None
    action_output: JsonValue = None
    error_type: Short(200) | None = None
    error_message: Text | None = None
    start_time: Seconds | None = None
    end_time: Seconds | None = None
    duration: Seconds | None = None
    # Halved range: the server adds input + output when total is missing.
    input_tokens: Annotated[int, Field(ge=0, le=2**30 - 1)] | None = None
    output_tokens: Annotated[int, Field(ge=0, le=2**30 - 1)] | None = None
    total_tokens: Int32 | None = None
    model: Short(200) = Field("", description="the model that wrote this step, e.g. gpt-4o")
    cost: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] | None = Field(
        None, description="what the step's model calls cost, in USD, if the agent knows"
    )
    is_final_answer: bool = False
    payload: JsonValue = Field(None, description="the framework's own step dict, kept verbatim")
    tool_calls: list[ToolCallIn] = Field(default_factory=list, max_length=1000)

    def to_item(self) -> dict[str, Any]:
        return self.model_dump()


STEP_IN_EXAMPLE = {
    "client_id": "run-a/step-1",
    "kind": "action",
    "step_number": 1,
    "model_output": "I will call the weather tool.",
    "tool_calls": [{"call_id": "call_1", "name": "weather", "arguments": {"city": "Paris"}}],
    "observations": "sunny, 21°C",
    "start_time": 1735725600.0,
    "end_time": 1735725601.5,
    "input_tokens": 120,
    "output_tokens": 30,
}


class StepsIn(BulkIn):
    model_config = _examples({"steps": [STEP_IN_EXAMPLE]})
    steps: list[StepIn] = Field(min_length=1, max_length=MAX_BATCH)


class ToolCallOut(Schema):
    id: int
    position: int
    call_id: str
    name: str
    arguments: Any
    output: str | None
    success: bool | None
    duration: float | None


STEP_EXAMPLE = {
    "id": 11,
    "run_id": 3,
    "position": 1,
    "client_id": "run-a/step-1",
    "kind": "action",
    "step_number": 1,
    "task": None,
    "plan": None,
    "model_input_messages": None,
    "model_output_message": None,
    "model_output": "I will call the weather tool.",
    "code_action": None,
    "observations": "sunny, 21°C",
    "action_output": None,
    "error_type": None,
    "error_message": None,
    "start_time": 1735725600.0,
    "end_time": 1735725601.5,
    "duration": 1.5,
    "input_tokens": 120,
    "output_tokens": 30,
    "total_tokens": 150,
    "is_final_answer": False,
    "payload": None,
    "pruned_at": None,
    "pruned_by": "",
    "created_at": "2025-01-01T10:00:01Z",
    "tool_calls": [
        {
            "id": 5,
            "position": 1,
            "call_id": "call_1",
            "name": "weather",
            "arguments": {"city": "Paris"},
            "output": None,
            "success": None,
            "duration": None,
        }
    ],
}


class StepOut(Schema):
    model_config = _examples(STEP_EXAMPLE)
    id: int
    run_id: int
    position: int
    client_id: str | None
    kind: str
    step_number: int | None
    task: str | None
    plan: str | None
    model_input_messages: Any
    model_output_message: Any
    model_output: Any
    code_action: str | None
    observations: str | None
    action_output: Any
    error_type: str | None
    error_message: str | None
    start_time: float | None
    end_time: float | None
    duration: float | None
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    model: str = ""
    cost: float | None = None
    is_final_answer: bool
    payload: Any
    pruned_at: datetime | None
    pruned_by: str
    created_at: datetime
    tool_calls: list[ToolCallOut]

    @staticmethod
    def resolve_tool_calls(obj) -> list:
        return list(obj.tool_calls.all())


class StepsAppendOut(Schema):
    model_config = _examples({"steps": [STEP_EXAMPLE], "created": [True]})
    steps: list[StepOut]
    created: list[bool]


class StepPage(Schema):
    model_config = _examples({"items": [STEP_EXAMPLE], "has_more": False, "next_cursor": None})
    items: list[StepOut]
    has_more: bool
    next_cursor: int | None = Field(None, description="position to pass as `after`")


class RunDetailOut(Schema):
    """A run with the first page of its steps; page on with GET /runs/{id}/steps?after=..."""

    model_config = _examples(
        {
            "run": RUN_EXAMPLE,
            "steps": {"items": [STEP_EXAMPLE], "has_more": False, "next_cursor": None},
        }
    )
    run: RunOut
    steps: StepPage


# --- hot paths: plain JSON without a second validation pass ------------------------------------

MESSAGE_OUT_FIELDS = tuple(MessageOut.model_fields)


def message_out(message) -> dict[str, Any]:
    """A stored message as the `MessageOut` dict. Hot endpoints (append, list, select) render
    these straight to JSON: the values come from our own columns, so validating them again
    through the schema only costs time (a third of a 1,000-message batch)."""
    return {name: getattr(message, name) for name in MESSAGE_OUT_FIELDS}


def json_response(status: int, data: Any):
    """`data` rendered as the API's renderer would (ninja's encoder, no NaN)."""
    return HttpResponse(json_dumps(data), status=status, content_type="application/json; charset=utf-8")
