"""What the entity modules share: the choices their check constraints hold a column to, the
full-text configuration and the digest that identifies a context by its keys."""

from __future__ import annotations

import hashlib
import json

from django.db import models
from django.db.models import Q

# Full-text configuration: `simple` would not stem; `english` ranks "weathers" with "weather".
# Migration 0018's triggers parse with it too: changing it needs a migration that replaces them
# and re-parses MessageSearch.
FTS_CONFIG = "english"


def keys_digest(keys: dict) -> str:
    """Order-insensitive digest of a context-keys dict (the identity of a context)."""
    canonical = json.dumps(keys, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


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
