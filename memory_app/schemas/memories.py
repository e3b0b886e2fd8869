"""Long-term memories in and out, and the calls that answer them (REST and MCP give the same
answer)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field

from memory_app import auth, memories
from memory_app.audit import Actor
from memory_app.errors import Invalid
from memory_app.queries.memories import memories_retrieve
from memory_app.queries.memory_review import memories_status
from memory_app.schemas.fields import (
    VECTOR_MODEL_DESCRIPTION,
    Id,
    JsonObject,
    Short,
    Text,
    Vector,
    _examples,
)
from memory_app.services.memories import Recorded, memories_record

Kind = Literal["fact", "preference", "task", "tool"]
Keywords = list[Short(200)]


class MemoryItemIn(Schema):
    content: Text = Field(min_length=1, max_length=memories.MAX_CONTENT_CHARS)
    kind: Kind | None = None
    thinking: Text | None = None
    keywords: Keywords | None = Field(None, max_length=100)
    metadata: JsonObject | None = None
    source_message_id: Id | None = None
    source_step_id: Id | None = None
    source_run_id: Id | None = None
    vector: Vector | None = Field(
        None, description="a client-computed embedding of `content`, stored with the record"
    )
    vector_model: Short(200) | None = Field(None, description=VECTOR_MODEL_DESCRIPTION)
    expires_at: datetime | None = Field(
        None, description="no longer recalled after this time, then removed (with a time zone)"
    )
    ttl_seconds: int | None = Field(
        None, ge=1, le=memories.MAX_TTL_SECONDS, description="expires this many seconds from now"
    )
    pinned: bool | None = Field(None, description="a pinned memory never expires")


class MemoryRecordIn(Schema):
    # The docstring is also the schema's description in the OpenAPI document: one line.
    """One fact (`content`) or many (`items`, or AgentScope's `contents` list sharing `thinking`)."""  # noqa: E501

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "context_id": 7,
                    "content": "Ada prefers tea",
                    "kind": "preference",
                    "keywords": ["tea"],
                },
                {
                    "context_id": 7,
                    "scope_keys": {"user": "ada"},
                    "thinking": "worth keeping",
                    "contents": ["Ada lives in Paris", "Ada plays chess"],
                },
                {
                    "context_id": 7,
                    "items": [
                        {
                            "content": "Ada is allergic to nuts",
                            "kind": "fact",
                            "vector": [0.31, -0.12, 0.94],
                            "vector_model": "my-model",
                        }
                    ],
                },
            ]
        }
    )
    context_id: Id | None = Field(
        None, description="the context scope; or the context the key subset is taken from"
    )
    scope_keys: JsonObject | None = Field(
        None, description="a key subset: every context containing these keys"
    )
    content: Text | None = Field(None, max_length=memories.MAX_CONTENT_CHARS)
    contents: list[Text] | None = Field(None, max_length=memories.MAX_ITEMS)
    items: list[MemoryItemIn] | None = Field(None, max_length=memories.MAX_ITEMS)
    kind: Kind | None = None
    thinking: Text | None = None
    keywords: Keywords | None = Field(None, max_length=100)
    metadata: JsonObject | None = None
    source_message_id: Id | None = None
    source_step_id: Id | None = None
    source_run_id: Id | None = None
    vector: Vector | None = Field(
        None, description="a client-computed embedding of `content` (per item: `items[].vector`)"
    )
    vector_model: Short(200) | None = Field(None, description=VECTOR_MODEL_DESCRIPTION)
    expires_at: datetime | None = Field(
        None, description="no longer recalled after this time, then removed (with a time zone)"
    )
    ttl_seconds: int | None = Field(
        None, ge=1, le=memories.MAX_TTL_SECONDS, description="expires this many seconds from now"
    )
    pinned: bool | None = Field(None, description="a pinned memory never expires")

    def to_items(self) -> list[dict[str, Any]]:
        shared = {
            "kind": self.kind,
            "keywords": self.keywords,
            "metadata": self.metadata,
            "source_message_id": self.source_message_id,
            "source_step_id": self.source_step_id,
            "expires_at": self.expires_at,
            "ttl_seconds": self.ttl_seconds,
            "pinned": self.pinned,
            "source_run_id": self.source_run_id,
        }
        out = []
        if self.content is not None:
            out.append(
                shared
                | {
                    "content": self.content,
                    "vector": self.vector,
                    "vector_model": self.vector_model,
                    "where": "content",
                }
            )
        elif self.vector is not None or self.vector_model is not None:
            raise Invalid("vector and vector_model go with content (or with each of items)")
        out += [shared | {"content": c} for c in self.contents or []]
        out += [
            {k: v for k, v in i.dict().items() if v is not None}
            | {"kind": i.kind or self.kind, "where": f"items[{n}]"}
            for n, i in enumerate(self.items or [])
        ]
        return out


MEMORY_EXAMPLE = {
    "id": 5,
    "context_id": 7,
    "scope_keys": {},
    "kind": "preference",
    "content": "Ada prefers tea",
    "thinking": "",
    "keywords": ["tea"],
    "metadata": {},
    "source_message_id": 101,
    "source_step_id": None,
    "source_run_id": 12,
    "origin": "api_key",
    "recorded_by": "key:agent-1",
    "status": "live",
    "archived_at": None,
    "expires_at": None,
    "pinned": False,
    "legal_hold": "",
    "created_at": "2025-01-01T10:06:00Z",
    "updated_at": "2025-01-01T10:06:00Z",
}


class MemoryRecordOut(Schema):
    model_config = _examples(MEMORY_EXAMPLE)
    id: int
    context_id: int | None
    scope_keys: dict[str, Any]
    kind: str
    content: str
    thinking: str
    keywords: list[str]
    metadata: dict[str, Any]
    source_message_id: int | None
    source_step_id: int | None
    source_run_id: int | None
    origin: Literal["api_key", "user", "import", "system", "unknown"] = Field(
        description="who recorded it, as the server saw the request (never the client's word)"
    )
    recorded_by: str
    status: Literal["proposed", "live", "rejected", "merged"] = Field(
        description="only live memories are recalled; a proposal waits for an operator's review"
    )
    archived_at: datetime | None
    expires_at: datetime | None = Field(description="not recalled after this time, then removed")
    pinned: bool = Field(description="a pinned memory never expires")
    legal_hold: str = Field(
        description="why the memory is under legal hold (empty: none): not expired nor purged"
    )
    created_at: datetime
    updated_at: datetime


class MemoryRecordedOut(Schema):
    model_config = _examples({"memory": MEMORY_EXAMPLE, "created": True, "near_copy": None})
    memory: MemoryRecordOut
    created: bool
    near_copy: float | None = Field(
        None,
        description="set when `memory` is a live memory nearly identical to what was sent "
        "(its similarity), answered instead of storing a near-copy",
    )


def recorded_out(results: list[Recorded]) -> dict:
    """The `MemoryRecordBatchOut` dict of a record call (REST and MCP answer it)."""
    return {
        "items": [
            {
                "memory": MemoryRecordOut.from_orm(r.record).dict(),
                "created": r.created,
                "near_copy": r.near_copy,
            }
            for r in results
        ]
    }


class MemoryRecordBatchOut(Schema):
    model_config = _examples({"items": [{"memory": MEMORY_EXAMPLE, "created": True}]})
    items: list[MemoryRecordedOut]


class MemoryRetrieveIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"context_id": 7, "keywords": ["tea"], "limit": 5},
                {"context_id": 7, "query": "what does Ada drink?"},
            ]
        }
    )
    context_id: Id
    keywords: Keywords | None = Field(None, max_length=50)
    query: Text | None = Field(None, max_length=10_000)
    limit: int = Field(
        5, ge=1, le=memories.MAX_LIMIT, description="per keyword (AgentScope), and for the query"
    )
    kinds: list[Kind] | None = None
    include_archived: bool = False


RECALLED_EXAMPLE = MEMORY_EXAMPLE | {"score": 1.0, "reason": "keyword 'tea'"}


class MemoryRecalledOut(MemoryRecordOut):
    model_config = _examples(RECALLED_EXAMPLE)
    score: float
    reason: str


class MemoryRetrieveOut(Schema):
    model_config = _examples({"items": [RECALLED_EXAMPLE]})
    items: list[MemoryRecalledOut]


class MemoryEditIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "content": "Ada prefers window seats.",
                    "keywords": ["seat", "flight"],
                    "note": "corrected",
                }
            ]
        }
    )
    content: Text | None = Field(None, min_length=1, max_length=memories.MAX_CONTENT_CHARS)
    kind: Kind | None = None
    thinking: Text | None = None
    keywords: Keywords | None = Field(None, max_length=100)
    metadata: JsonObject | None = None
    expires_at: datetime | None = Field(
        None, description="a new expiry date; null (sent explicitly) makes it never expire"
    )
    ttl_seconds: int | None = Field(
        None, ge=1, le=memories.MAX_TTL_SECONDS, description="expires this many seconds from now"
    )
    pinned: bool | None = Field(None, description="pin (never expires) or unpin")
    note: Text | None = Field(None, max_length=2000)

    def expiry(self) -> dict[str, Any]:
        """The expiry arguments of `memory_set_expiry` this edit gives (none: leave it)."""
        out: dict[str, Any] = {}
        if "expires_at" in self.model_fields_set:
            out["expires_at"] = self.expires_at
        if self.ttl_seconds is not None:
            out["ttl_seconds"] = self.ttl_seconds
        if self.pinned is not None:
            out["pinned"] = self.pinned
        return out


class MemoryNoteIn(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [{"note": "superseded"}]})
    note: Text | None = Field(None, max_length=2000)


class MemoryStatusQuery(Schema):
    ids: list[Id] = Field(description="memory ids (up to 100)", examples=[[5, 9]])


class MemoryStatusOut(Schema):
    """The records asked for that the key may see, with their `status`; the others' ids."""

    model_config = _examples({"items": [MEMORY_EXAMPLE], "missing": [9]})
    items: list[MemoryRecordOut]
    missing: list[int]


class MemoryPurgedOut(Schema):
    """A purged record's id and the audit event that records the purge."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"id": 5, "audit_event_id": 812}]})
    id: int
    audit_event_id: int


def record(key, body: MemoryRecordIn) -> list[Recorded]:
    """Record what `body` says, in the scope it names, as `key` (REST and MCP call this)."""
    scope = memories.scope_for_key(key, context_id=body.context_id, scope_keys=body.scope_keys)
    return memories_record(
        scope=scope, items=body.to_items(), actor=Actor.for_key(key), thinking=body.thinking or ""
    )


def retrieve_out(key, body: MemoryRetrieveIn) -> dict:
    """What `body`'s context recalls, as `key` may see it: the `MemoryRetrieveOut` dict (REST
    and MCP answer it)."""
    recalled = memories_retrieve(
        context=auth.context_for_key(key, body.context_id),
        keywords=body.keywords,
        query=body.query,
        limit=body.limit,
        kinds=body.kinds,
        include_archived=body.include_archived,
        confined_to=key.context_keys or None,
    )
    items = [
        MemoryRecordOut.from_orm(r.record).dict() | {"score": r.score, "reason": r.reason}
        for r in recalled
    ]
    return {"items": items}


MAX_STATUS_IDS = 100


def status_out(key, ids: list[int]) -> dict:
    """The `MemoryStatusOut` dict of `ids` as `key` may see them (REST and MCP answer it)."""
    if not ids:
        raise Invalid("give at least one memory id")
    if len(ids) > MAX_STATUS_IDS:
        raise Invalid(f"at most {MAX_STATUS_IDS} ids at once")
    found = memories_status(key, ids)
    return {
        "items": [MemoryRecordOut.from_orm(r).dict() for r in found["items"]],
        "missing": found["missing"],
    }
