"""Messages in and out: content blocks, single and batch appends, pages, edits and prunes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import BaseModel, ConfigDict, Field, WrapValidator, model_validator

from memory_app.new_message import NewMessage
from memory_app.schemas.fields import (
    VECTOR_MODEL_DESCRIPTION,
    ClientId,
    Id,
    JsonObject,
    JsonValue,
    PlainIn,
    Role,
    Short,
    Tag,
    Text,
    Vector,
    _check_json,
    _examples,
)
from memory_app.services.messages import MAX_BATCH


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


def _as_written(value: Any, handler) -> Any:
    """A block sent as a JSON object is checked against its type's model and kept as the object
    itself: a model would put its declared fields first, and the block must come back with its
    keys in the order the agent wrote them."""
    checked = handler(value)
    return value if isinstance(value, dict) else checked.model_dump(exclude_unset=True)


# Validated as a model, held as the block's own dict (`_as_written`).
ContentBlock = Annotated[
    TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock | ImageBlock,
    Field(discriminator="type"),
    WrapValidator(_as_written),
]


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


class MessageIn(PlainIn):
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

    def to_new_message(self) -> NewMessage:
        return NewMessage(
            client_id=self.client_id,
            role=self.role,
            name=self.name,
            text=self.text,
            # Blocks are stored as sent: a repeat compares equal to the stored row.
            content=None if self.content is None else list(self.content),
            tags=self.tags,
            metadata=self.metadata,
            run_id=self.run_id,
            step_id=self.step_id,
            source_timestamp=self.source_timestamp,
            vector=self.vector,
            vector_model=self.vector_model,
        )


class MessageBatchIn(PlainIn):
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


class MessageRef(Schema):
    """A stored message as a batch answers it by default: what a client needs to refer to it."""

    id: int
    seq: int
    client_id: str | None


MESSAGE_REF_FIELDS = tuple(MessageRef.model_fields)


class MessageBatchOut(Schema):
    model_config = _examples(
        {"messages": [{"id": 1, "seq": 1, "client_id": "turn-1"}], "created": [True]}
    )
    messages: list[MessageRef | MessageOut] = Field(
        description="per message, in the order sent: its id, seq and client id; the whole "
        "stored message with `?return=full`"
    )
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


MESSAGE_OUT_FIELDS = tuple(MessageOut.model_fields)


def message_ref(message) -> dict[str, Any]:
    """A stored message as the `MessageRef` dict."""
    return {name: getattr(message, name) for name in MESSAGE_REF_FIELDS}


def message_out(message) -> dict[str, Any]:
    """A stored message as the `MessageOut` dict. Hot endpoints (append, list, select) render
    these straight to JSON: the values come from our own columns, so validating them again
    through the schema only costs time (a third of a 1,000-message batch)."""
    return {name: getattr(message, name) for name in MESSAGE_OUT_FIELDS}
