"""API keys issued and withdrawn by people (dashboard, `manage.py apikey`), audited; the secret
is never in the audit trail. Creating and verifying keys themselves is `memory_app.auth`."""

from __future__ import annotations

from memory_app.audit import Actor, audit_record
from memory_app.errors import Invalid


def apikey_issue(*, name: str, scopes: list[str], context_keys: dict | None, actor: Actor):
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
