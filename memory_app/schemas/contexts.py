"""Contexts in and out."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Schema
from pydantic import Field

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
