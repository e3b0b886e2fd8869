"""Contexts in and out."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Schema
from pydantic import Field

from memory_app.queries.lists import with_live_counts
from memory_app.schemas.fields import (
    JsonObject,
    Short,
    _examples,
)


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
    message_count: int = Field(description="messages, pruned ones left out")
    token_count: int = Field(description="tokens of those messages (pruned ones left out)")
    run_count: int
    created_at: datetime
    updated_at: datetime
    last_activity_at: datetime

    # Lists count a whole page at once (`contexts_list`); a single context is counted here.
    @staticmethod
    def resolve_message_count(obj) -> int:
        if not hasattr(obj, "live_count"):
            with_live_counts([obj])
        return obj.live_count

    @staticmethod
    def resolve_token_count(obj) -> int:
        if not hasattr(obj, "live_tokens"):
            with_live_counts([obj])
        return obj.live_tokens


class ContextPage(Schema):
    model_config = _examples({"items": [CONTEXT_EXAMPLE], "has_more": False, "next_cursor": None})
    items: list[ContextOut]
    has_more: bool
    next_cursor: int | None = Field(None, description="pass as `after` to get the next page")
