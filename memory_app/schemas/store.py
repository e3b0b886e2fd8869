"""Namespace items (LangGraph's store) in and out."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import Field

from memory_app.models import MemoryRecord
from memory_app.namespace_items import (
    MAX_KEY_CHARS,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_NAMESPACES_LIMIT,
    MAX_SEARCH_LIMIT,
    value_of,
)
from memory_app.schemas.fields import JsonObject, Short, Text, _examples

Label = Short(MAX_LABEL_CHARS)
Namespace = list[Label]
SCOPE_KEYS = (
    "the key subset the items belong to (inside the API key's confinement); default: the key "
    "subset the API key is confined to"
)
NAMESPACE = "the namespace path, labels without periods"
ITEM_EXAMPLE = {
    "namespace": ["users", "ada"],
    "key": "prefs",
    "value": {"theme": "dark", "language": "en"},
    "created_at": "2026-11-26T05:00:00+00:00",
    "updated_at": "2026-11-26T05:01:00+00:00",
    "expires_at": None,
    "memory_id": 12,
    "score": None,
}


class StoreItemPutIn(Schema):
    model_config = _examples(
        {"namespace": ["users", "ada"], "key": "prefs", "value": {"theme": "dark"}, "ttl": 60}
    )
    scope_keys: JsonObject | None = Field(None, description=SCOPE_KEYS)
    namespace: Namespace = Field(min_length=1, max_length=MAX_LABELS, description=NAMESPACE)
    key: Short(MAX_KEY_CHARS) = Field(min_length=1)
    value: JsonObject = Field(description="the item's value, kept as written (key order too)")
    ttl: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="minutes until it expires; none: never"
    )


class StoreItemKeyIn(Schema):
    model_config = _examples({"namespace": ["users", "ada"], "key": "prefs"})
    scope_keys: JsonObject | None = Field(None, description=SCOPE_KEYS)
    namespace: Namespace = Field(min_length=1, max_length=MAX_LABELS, description=NAMESPACE)
    key: Short(MAX_KEY_CHARS) = Field(min_length=1)
    refresh_ttl: bool = Field(False, description="restart the item's time to live (get only)")


class StoreSearchIn(Schema):
    model_config = _examples(
        {"namespace_prefix": ["users"], "filter": {"theme": "dark"}, "limit": 10},
        {"namespace_prefix": ["docs"], "query": "python", "filter": {"year": {"$gte": 2020}}},
    )
    scope_keys: JsonObject | None = Field(None, description=SCOPE_KEYS)
    namespace_prefix: Namespace = Field(default_factory=list, max_length=MAX_LABELS)
    filter: JsonObject | None = Field(
        None,
        description="value key -> value (equal) or {operator: operand} with $eq $ne $gt $gte "
        "$lt $lte",
    )
    query: Text | None = Field(None, description="by meaning, when the items have vectors")
    limit: int = Field(10, ge=0, le=MAX_SEARCH_LIMIT)
    offset: int = Field(0, ge=0)
    refresh_ttl: bool = Field(False, description="restart the time to live of the items found")


class StoreNamespacesIn(Schema):
    model_config = _examples({"prefix": ["users"], "suffix": ["*"], "max_depth": 2})
    scope_keys: JsonObject | None = Field(None, description=SCOPE_KEYS)
    prefix: list[Label] | None = Field(None, description="leading labels; `*` matches any one")
    suffix: list[Label] | None = Field(None, description="trailing labels; `*` matches any one")
    max_depth: int | None = Field(None, ge=1, description="cut namespaces to this many labels")
    limit: int = Field(100, ge=0, le=MAX_NAMESPACES_LIMIT)
    offset: int = Field(0, ge=0)


class StoreItemOut(Schema):
    model_config = _examples(ITEM_EXAMPLE)
    namespace: list[str]
    key: str
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    memory_id: int = Field(description="the long-term memory the item is (dashboard, /memories)")
    score: float | None = Field(None, description="cosine similarity to a search's query")


class StoreItemsOut(Schema):
    model_config = _examples({"items": [ITEM_EXAMPLE]})
    items: list[StoreItemOut]


class StoreDeletedOut(Schema):
    model_config = _examples({"deleted": True})
    deleted: bool = Field(description="whether there was an item (deleting none is no error)")


class StoreNamespacesOut(Schema):
    model_config = _examples({"namespaces": [["users", "ada"], ["users", "bob"]]})
    namespaces: list[list[str]]


def item_out(record: MemoryRecord, score: float | None = None) -> dict[str, Any]:
    return {
        "namespace": list(record.namespace),
        "key": record.item_key,
        "value": value_of(record),
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "expires_at": record.item_expires_at,
        "memory_id": record.pk,
        "score": score,
    }
