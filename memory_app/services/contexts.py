"""Writes of contexts: get-or-create by keys (order-insensitive), and title/metadata edits."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from memory_app.audit import Actor, audit_record
from memory_app.models import (
    Context,
    keys_digest,
)


def context_get_or_create(
    *, keys: dict[str, Any], title: str | None = None, metadata: dict | None = None
) -> tuple[Context, bool]:
    """The context for `keys` (order-insensitive), created when missing; safe under races."""
    digest = keys_digest(keys)
    defaults = {"keys": keys, "title": title or "", "metadata": metadata or {}}
    # Django's get_or_create retries the read when a concurrent insert wins the unique index.
    return Context.objects.get_or_create(keys_digest=digest, defaults=defaults)


def context_update(
    *, context: Context, title: str | None = None, metadata: dict | None = None, actor: Actor
) -> Context:
    before = {"title": context.title, "metadata": context.metadata}
    if title is not None:
        context.title = title
    if metadata is not None:
        context.metadata = metadata
    with transaction.atomic():
        context.save(update_fields=["title", "metadata", "updated_at"])
        audit_record(
            actor=actor,
            action="edit",
            target_type="context",
            target_ids=[context.pk],
            context_id=context.pk,
            before=before,
            after={"title": context.title, "metadata": context.metadata},
        )
    return context
