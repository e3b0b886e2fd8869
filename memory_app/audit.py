"""Who does a write (`Actor`), the audit trail every write leaves (`audit_record`), and the
Django admin's log lines of rows deleted for good (`admin_log_forget`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType

from memory_app.models import ApiKey, AuditEvent


@dataclass(frozen=True)
class Actor:
    """Who does a write: an operator (user) or an agent (API key); named in every audit event."""

    label: str
    user: Any = None
    api_key: ApiKey | None = None

    @classmethod
    def for_user(cls, user) -> Actor:
        return cls(label=f"user:{user.get_username()}", user=user)

    @classmethod
    def for_key(cls, key: ApiKey) -> Actor:
        return cls(label=key.actor, api_key=key)

    @classmethod
    def system(cls, name: str = "system") -> Actor:
        return cls(label=name)


def audit_record(
    *,
    actor: Actor,
    action: str,
    target_type: str,
    target_ids: list[int],
    context_id: int | None = None,
    before: Any = None,
    after: Any = None,
    note: str = "",
) -> AuditEvent:
    return AuditEvent.objects.create(
        actor=actor.label,
        user=actor.user if actor.user is not None and actor.user.is_authenticated else None,
        api_key=actor.api_key,
        action=action,
        target_type=target_type,
        target_ids=list(target_ids),
        context_id=context_id,
        before=before,
        after=after,
        note=note,
    )


def admin_log_forget(model, ids) -> int:
    """Delete the Django admin's log lines about these rows of `model`: a line names its row by
    the row's text (a message's, a memory's), so a row deleted for good takes them along.
    Answers how many went."""
    ids = [str(i) for i in ids]
    if not ids:
        return 0
    kind = ContentType.objects.get_for_model(model)
    deleted, _ = LogEntry.objects.filter(content_type=kind, object_id__in=ids).delete()
    return deleted
