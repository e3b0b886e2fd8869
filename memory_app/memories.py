"""Long-term memory: facts, preferences, task lessons and tool guidelines an agent can recall.

Semantics follow AgentScope 1.x's LongTermMemoryBase (reference/frameworks.md §3.4):
`record_to_memory(thinking, content: list[str])` records several facts with one thought, and
`retrieve_from_memory(keywords, limit)` answers up to `limit` records *per keyword*. Curation is
Mem0-like: records are edited, archived and restored, each change audited with before/after.

A record lives in a scope:
- one context (`Scope(context=...)`), seen only there; or
- a key subset (`Scope(keys={"user": "ada"})`), seen by every context whose keys contain it
  (`{"user": "ada", "chat": "7"}` sees it, `{"user": "bob"}` does not).
Recording the same content again in the same scope returns the existing record (the database
holds unique (scope_digest, content_hash); whitespace differences do not make new content).

This module holds what a memory is: its scope and the rules its content follows. Writes are
`memory_app.services.memories`, reads `memory_app.queries.memories`; the API, the MCP tools and
the dashboard all go through them, so a fact promoted in the dashboard and recorded by an agent
in the same scope is one record.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from memory_app import auth
from memory_app.errors import Forbidden, Invalid
from memory_app.models import (
    ApiKey,
    Context,
    MemoryKind,
    MemoryRecord,
    keys_digest,
)

MAX_CONTENT_CHARS = 20_000
MAX_ITEMS = 200
MAX_LIMIT = 100
# A time to live of at most about ten years: further is "never", which is no date at all.
MAX_TTL_SECONDS = 10 * 366 * 24 * 3600
EDITABLE = ("content", "kind", "thinking", "keywords", "metadata")


@dataclass(frozen=True)
class Scope:
    """Exactly one of: a context, or a dict of keys shared by many contexts."""

    context: Context | None = None
    keys: dict[str, Any] | None = None

    def __post_init__(self):
        if (self.context is None) == (self.keys is None):
            raise Invalid("a memory scope is either one context or a set of context keys")
        if self.keys is not None and not isinstance(self.keys, dict):
            raise Invalid("scope keys must be an object")

    @property
    def digest(self) -> str:
        if self.context is not None:
            # Distinct from a key-subset scope equal to the context's keys: that one also covers
            # contexts with more keys.
            # The context's keys digest, not its pk: a backup restored into another database
            # keeps its records' digests, so recording the same content there still de-duplicates.
            return keys_digest({"__context__": self.context.keys_digest})
        return keys_digest(self.keys)

    @property
    def scope_keys(self) -> dict[str, Any]:
        return dict(self.context.keys) if self.context is not None else dict(self.keys)

    def covers(self, context: Context) -> bool:
        if self.context is not None:
            return self.context.pk == context.pk
        return all(k in context.keys and context.keys[k] == v for k, v in self.keys.items())


def scope_of(record: MemoryRecord) -> Scope:
    if record.context_id is not None:
        return Scope(context=record.context)
    return Scope(keys=record.scope_keys)


def scope_for_key(
    key: ApiKey, *, context_id: int | None = None, scope_keys: dict[str, Any] | None = None
) -> Scope:
    """The scope an API key records into: a key subset (`scope_keys`, which must lie inside the
    key's confinement and, with `context_id`, be a subset of that context's keys) or a context."""
    if scope_keys is not None:
        if not auth.keys_allowed(key, scope_keys):
            raise Forbidden("scope_keys lie outside this API key's context keys")
        if context_id is not None:
            context = auth.context_for_key(key, context_id)
            if not Scope(keys=scope_keys).covers(context):
                raise Invalid("scope_keys must be a subset of the context's keys")
        return Scope(keys=scope_keys)
    if context_id is None:
        raise Invalid("give context_id (context scope) or scope_keys (key subset scope)")
    return Scope(context=auth.context_for_key(key, context_id))


def content_hash(content: str) -> str:
    return hashlib.sha256(" ".join(content.split()).encode()).hexdigest()


def item_hash(namespace: list[str], key: str) -> str:
    """A namespace item's identity in its scope, in place of its content's hash: it keeps the
    item one record under (scope, content hash) whatever its value (two items may hold the same
    value; plain content, which holds no NUL, never hashes to it)."""
    return hashlib.sha256(json.dumps(["item\x00", namespace, key]).encode()).hexdigest()


def record_hash(record: MemoryRecord) -> str:
    """The hash a record's row holds: its content's, or a namespace item's identity."""
    if record.namespace is not None:
        return item_hash(list(record.namespace), record.item_key)
    return content_hash(record.content)


def no_nul(value: str, what: str) -> str:
    # PostgreSQL text cannot hold NUL: refuse clearly instead of failing in the database.
    if "\x00" in value:
        raise Invalid(f"the memory {what} contains a NUL character")
    return value


def clean_content(content: Any) -> str:
    if not isinstance(content, str) or not content.strip():
        raise Invalid("memory content must be a non-empty string")
    no_nul(content, "content")
    if len(content) > MAX_CONTENT_CHARS:
        raise Invalid(f"memory content is longer than {MAX_CONTENT_CHARS} characters")
    return content.strip()


def clean_kind(kind: Any) -> str:
    kind = kind or MemoryKind.FACT
    if kind not in MemoryKind.values:
        raise Invalid(f"kind must be one of {', '.join(MemoryKind.values)}")
    return kind


def clean_keywords(keywords: Any) -> list[str]:
    keywords = keywords or []
    if not isinstance(keywords, list | tuple) or not all(
        isinstance(k, str) and 0 < len(k) <= 200 for k in keywords
    ):
        raise Invalid("keywords must be a list of strings of 1 to 200 characters")
    for k in keywords:
        no_nul(k, "keywords")
    return list(dict.fromkeys(k.strip() for k in keywords if k.strip()))


def unexpired() -> Q:
    """Records not past their `expires_at` (pinned ones never are), by the database's clock:
    every retrieval filters with it, so an expired record drops out at once, before the
    retention removes it. A namespace item's own time to live (LangGraph's store, refreshed by
    reads) ends it the same way."""
    return (Q(expires_at__isnull=True) | Q(pinned=True) | Q(expires_at__gt=Now())) & (
        Q(item_expires_at__isnull=True) | Q(item_expires_at__gt=Now())
    )


def clean_expiry(expires_at: Any = None, ttl_seconds: Any = None) -> datetime | None:
    """The expiry date `expires_at` names, or `ttl_seconds` from now; None when neither."""
    if expires_at is not None and ttl_seconds is not None:
        raise Invalid("give expires_at or ttl_seconds, not both")
    if ttl_seconds is not None:
        if (
            isinstance(ttl_seconds, bool)
            or not isinstance(ttl_seconds, int)
            or not 1 <= ttl_seconds <= MAX_TTL_SECONDS
        ):
            raise Invalid(f"ttl_seconds must be a whole number from 1 to {MAX_TTL_SECONDS}")
        return timezone.now() + timedelta(seconds=ttl_seconds)
    if expires_at is None:
        return None
    if not isinstance(expires_at, datetime) or timezone.is_naive(expires_at):
        raise Invalid("expires_at must be a date and time with a time zone")
    return expires_at
