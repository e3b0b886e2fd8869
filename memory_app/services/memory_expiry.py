"""A memory's expiry, pin and legal hold: when it is forgotten, what keeps it (a pin from
expiry, a hold from expiry, purge and erasure), and the refusal a held memory answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction

from memory_app.audit import Actor, audit_record
from memory_app.errors import Forbidden, Invalid, LegalHold
from memory_app.memories import clean_expiry, no_nul
from memory_app.models import MemoryRecord
from memory_app.services.memory_history import check_may_change

UNCHANGED: Any = object()


def memory_set_expiry(
    *,
    record: MemoryRecord,
    actor: Actor,
    expires_at: Any = UNCHANGED,
    ttl_seconds: int | None = None,
    pinned: bool | None = None,
    note: str = "",
) -> MemoryRecord:
    """Set or clear (`expires_at=None`) a record's expiry date, or give it `ttl_seconds` from now,
    and/or pin or unpin it (a pinned record never expires). Audited with before/after."""
    if ttl_seconds is not None:
        if expires_at is not UNCHANGED and expires_at is not None:
            raise Invalid("give expires_at or ttl_seconds, not both")
        expires_at = clean_expiry(None, ttl_seconds)
    elif expires_at is not UNCHANGED:
        expires_at = clean_expiry(expires_at)
    with transaction.atomic():
        record = MemoryRecord.objects.select_for_update().get(pk=record.pk)
        check_may_change(record, actor)
        before = _expiry(record)
        if expires_at is not UNCHANGED:
            record.expires_at = expires_at
        if pinned is not None:
            record.pinned = bool(pinned)
        after = _expiry(record)
        if after == before:
            return record
        record.save(update_fields=["expires_at", "pinned", "updated_at"])
        audit_record(
            actor=actor,
            action="memory_expiry",
            target_type="memoryrecord",
            target_ids=[record.pk],
            context_id=record.context_id,
            before=before,
            after=after,
            note=note,
        )
    return record


def _expiry(record: MemoryRecord) -> dict[str, Any]:
    at = record.expires_at
    return {"expires_at": at.isoformat() if at else None, "pinned": record.pinned}


MAX_HOLD_REASON = 500


def memory_set_legal_hold(*, record: MemoryRecord, actor: Actor, reason: str) -> MemoryRecord:
    """Put a record under legal hold (`reason` says why; empty lifts the hold). A held record is
    neither expired, purged nor erased. Only an operator (a dashboard admin) holds or lifts:
    no API key may, whatever its scopes. Audited with the reason before and after."""
    if actor.api_key is not None or actor.user is None:
        raise Forbidden("only a dashboard admin sets or lifts a legal hold")
    reason = no_nul((reason or "").strip(), "legal hold reason")
    if len(reason) > MAX_HOLD_REASON:
        raise Invalid(f"the legal hold reason is longer than {MAX_HOLD_REASON} characters")
    with transaction.atomic():
        record = MemoryRecord.objects.select_for_update().get(pk=record.pk)
        before = record.legal_hold
        if before == reason:
            return record
        record.legal_hold = reason
        record.save(update_fields=["legal_hold", "updated_at"])
        audit_record(
            actor=actor,
            action="legal_hold" if reason else "legal_hold_lift",
            target_type="memoryrecord",
            target_ids=[record.pk],
            context_id=record.context_id,
            before={"legal_hold": before},
            after={"legal_hold": reason},
        )
    return record


def held_refusal(held: Sequence[tuple[int, str]], what: str) -> LegalHold:
    """The 409 a purge, expiry or erasure of held records answers: which, and why held."""
    names = ", ".join(f"memory {pk} ({reason})" for pk, reason in held[:5])
    more = f" and {len(held) - 5} more" if len(held) > 5 else ""
    return LegalHold(
        f"legal hold: {names}{more} may not be {what}; a dashboard admin lifts the hold first",
        {"legal_hold": {str(pk): reason for pk, reason in held}},
    )
