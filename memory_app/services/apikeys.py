"""API keys issued and withdrawn by people (dashboard, `manage.py apikey`), and their memory
review policy set, audited; the secret is never in the audit trail. Creating and verifying
keys themselves is `memory_app.auth`."""

from __future__ import annotations

from memory_app.audit import Actor, audit_record
from memory_app.errors import Invalid
from memory_app.models import MemoryReview


def apikey_issue(
    *,
    name: str,
    scopes: list[str],
    context_keys: dict | None,
    actor: Actor,
    memory_review: str = MemoryReview.LIVE,
):
    """Create a key (memory_app.auth) and record who did; the secret is never audited."""
    from memory_app import auth

    name = (name or "").strip()
    if not name or len(name) > 200 or "\x00" in name:
        raise Invalid("a key needs a name of at most 200 characters")
    try:
        issued = auth.apikey_create(
            name=name, scopes=scopes, context_keys=context_keys, created_by=actor.user
        )
    except ValueError as exc:
        raise Invalid(str(exc)) from exc
    if memory_review != MemoryReview.LIVE:
        _check_review(memory_review)
        issued.key.memory_review = memory_review
        issued.key.save(update_fields=["memory_review"])
    audit_record(
        actor=actor,
        action="key_create",
        target_type="apikey",
        target_ids=[issued.key.pk],
        after={
            "name": name,
            "prefix": issued.key.prefix,
            "scopes": issued.key.scopes,
            "context_keys": issued.key.context_keys,
            "memory_review": issued.key.memory_review,
        },
    )
    return issued


def apikey_withdraw(*, key, actor: Actor):
    from memory_app import auth

    if key.revoked_at is not None:
        return key
    auth.apikey_revoke(key=key)
    audit_record(
        actor=actor,
        action="key_revoke",
        target_type="apikey",
        target_ids=[key.pk],
        before={"name": key.name, "prefix": key.prefix},
    )
    return key


def _check_review(review: str) -> None:
    if review not in MemoryReview.values:
        raise Invalid(f"memory review must be one of {', '.join(MemoryReview.values)}")


def apikey_set_review(*, key, memory_review: str, actor: Actor):
    """Whether the memories `key` records are live at once or proposed for review."""
    _check_review(memory_review)
    if key.memory_review == memory_review:
        return key
    before = key.memory_review
    key.memory_review = memory_review
    key.save(update_fields=["memory_review"])
    audit_record(
        actor=actor,
        action="key_review",
        target_type="apikey",
        target_ids=[key.pk],
        before={"prefix": key.prefix, "memory_review": before},
        after={"prefix": key.prefix, "memory_review": memory_review},
    )
    return key
