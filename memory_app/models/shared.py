"""What the entity modules share: the choices their check constraints hold a column to, the
full-text configuration, the GIN indexes' pending list, the digest that identifies a context by
its keys, and the JSON field that keeps what an agent wrote in the order it wrote it."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q
from django.db.models.functions import Cast
from psycopg.types.json import Json
from psycopg.types.string import TextLoader

# Full-text configuration: `simple` would not stem; `english` ranks "weathers" with "weather".
# Migration 0018's triggers parse with it too: changing it needs a migration that replaces them
# and re-parses MessageSearch.
FTS_CONFIG = "english"

# The pending list (kB) of every GIN index. A GIN index keeps new entries in a list that every
# search reads whole until the list is merged into the index: at PostgreSQL's default of 4 MB,
# up to 3 ms of a keyword search in a store written as agents write, and a tag filter matching
# nothing read 286 pages after 2,000 tagged messages. A smaller list is merged more often, in
# smaller pieces, at more cost to the writes that fill it: the full-text indexer's pass over
# 1,000 messages takes 110 ms at 4 MB, 148 ms at 1 MB, 325 ms at 64 kB.
PENDING_LIST_KB = 1024


def gin_index(*, fields: list[str], name: str, **options: Any) -> GinIndex:
    """A GIN index of the schema: every one keeps the small pending list above."""
    return GinIndex(fields=fields, name=name, gin_pending_list_limit=PENDING_LIST_KB, **options)


def keys_digest(keys: dict) -> str:
    """Order-insensitive digest of a context-keys dict (the identity of a context)."""
    canonical = json.dumps(keys, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class OrderedJSONField(models.JSONField):
    """A JSON value kept as written: its object keys in their order, on every path.

    PostgreSQL `jsonb` sorts an object's keys (shorter first, then bytewise), so an agent's
    `{"query": "cats", "k": 3}` would come back as `{"k": 3, "query": "cats"}`, and a prompt
    rebuilt from it would differ from the one the agent sent. The column is `json`, which keeps
    the text verbatim: written as one JSON text (a `json` parameter, never a `jsonb` one, which
    PostgreSQL would sort on the way in; the COPY paths write the text themselves), read back
    as text (`json_as_text`) and decoded by `JSONField`, which keeps the text's order.

    Lookups still work as on `jsonb`: each one (containment, keys, key transforms, equality)
    reads the column cast to `jsonb` first, so a filter means what it means on a `JSONField`.
    Only `isnull` reads the column as it is. Nothing indexes these columns: the values agents
    are filtered by (context keys, memory scopes) stay `jsonb` with their GIN indexes.

    Migrations see a plain `JSONField` (`deconstruct`): the column type is the SQL of the
    migration that made it `json`, so the frozen migrations name no application class.
    """

    def db_type(self, connection) -> str:
        return "json"

    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs

    def get_db_prep_value(self, value, connection, prepared=False):
        if not prepared:
            value = self.get_prep_value(value)
        if value is None or hasattr(value, "as_sql"):
            return value
        return Json(value, dumps=_dumps(self.encoder))

    def get_lookup(self, lookup_name: str):
        lookup = super().get_lookup(lookup_name)
        if lookup is None or lookup_name == "isnull":
            return lookup
        return _on_jsonb(lookup)

    def get_transform(self, name: str):
        transform = super().get_transform(name)
        return lambda lhs, *args, **kwargs: transform(_jsonb(lhs), *args, **kwargs)


def json_as_text(sender, connection, **kwargs) -> None:
    """A `connection_created` receiver: `json` values reach Django as text, as Django has
    `jsonb` ones reach it, so that every JSONField (the models' and the migrations' historical
    ones alike) and every raw query reads a `json` column as it read a `jsonb` one."""
    adapters = getattr(connection.connection, "adapters", None)
    if connection.vendor == "postgresql" and adapters is not None:
        adapters.register_loader("json", TextLoader)


def _jsonb(lhs: Any) -> Cast:
    return Cast(lhs, models.JSONField())


@functools.cache
def _dumps(encoder: Any):
    return functools.partial(json.dumps, cls=encoder) if encoder else json.dumps


@functools.cache
def _on_jsonb(lookup: type) -> type:
    """`lookup` applied to the column cast to jsonb (its right side prepared as for jsonb)."""

    class OnJsonb(lookup):
        def __init__(self, lhs, rhs):
            super().__init__(_jsonb(lhs), rhs)

    OnJsonb.__name__ = f"Jsonb{lookup.__name__}"
    return OnJsonb


class MessageRole(models.TextChoices):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    FUNCTION = "function"
    AGENT = "agent"
    LLM = "llm"
    TOOL_CALL = "tool-call"
    TOOL_RESPONSE = "tool-response"


class RunStatus(models.TextChoices):
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    MAX_STEPS_ERROR = "max_steps_error"
    CANCELLED = "cancelled"


class StepKind(models.TextChoices):
    TASK = "task"
    PLANNING = "planning"
    ACTION = "action"
    FINAL_ANSWER = "final_answer"


class MemoryKind(models.TextChoices):
    FACT = "fact"
    PREFERENCE = "preference"
    TASK = "task"
    TOOL = "tool"


class MemoryStatus(models.TextChoices):
    """Where a memory stands in review. Only `live` records are recalled; the others are kept
    (an agent reads its proposal's outcome, the audit trail says who decided)."""

    PROPOSED = "proposed"
    LIVE = "live"
    REJECTED = "rejected"
    MERGED = "merged"


class MemoryOrigin(models.TextChoices):
    """Who recorded a memory, as the server saw the request: an agent's API key, a dashboard
    user (or an admin), an import of a backup; `unknown` for records older than provenance
    that the audit trail could not attribute."""

    API_KEY = "api_key"
    USER = "user"
    IMPORT = "import"
    SYSTEM = "system"
    UNKNOWN = "unknown"


class MemoryReview(models.TextChoices):
    """What becomes of the memories an API key records: live at once, or proposed for review."""

    LIVE = "live"
    PROPOSED = "proposed"


class ContextRow(models.Model):
    """A row of one context's data. Django's own `save()` of it updates the row by its id and
    its context, and never writes the context: a row never moves to another context, and on
    Citus the context is the distribution column, which an UPDATE may not set and which routes
    the statement to the one shard holding the row (docs/scale-out.md)."""

    class Meta:
        abstract = True

    def _do_update(self, base_qs, using, pk_val, values, update_fields, forced_update):
        values = [value for value in values if value[0].attname != "context_id"]
        base_qs = base_qs.filter(context_id=self.context_id)
        return super()._do_update(base_qs, using, pk_val, values, update_fields, forced_update)


def context_of_row(*, null: bool = False) -> models.ForeignKey:
    """The context of a row that belongs to another context-scoped row (a step's run, a tool
    call's step), copied from it. Part of the row's keys in the database, where the composite
    foreign keys hold it equal to its parent's (migration 0020): Django neither checks nor
    cascades it, the parent's cascade takes the row along."""
    return models.ForeignKey(
        "memory_app.Context",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        null=null,
        blank=null,
        related_name="+",
    )


def choices_check(
    field: str, choices: type[models.TextChoices], name: str
) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)
