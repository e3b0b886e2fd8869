"""Review of the memories agents propose: approve (as proposed, or edited first), reject, merge
into a live record of the same scope. Only an operator holding the `approve` capability decides
(a dashboard permission: no API key holds it); every decision is audited, with the record's
status before and after, and the record stays (an agent reads its proposal's outcome)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction

from memory_app.audit import Actor, audit_record
from memory_app.errors import Forbidden, Invalid, NotFound
from memory_app.models import MemoryRecord, MemoryStatus
from memory_app.roles import user_can
from memory_app.services.memories import memory_edit
from memory_app.services.memory_history import snapshot, versions_record


def _check_reviewer(actor: Actor) -> None:
    if actor.api_key is not None or not user_can(actor.user, "approve"):
        raise Forbidden("only an operator with the approve permission reviews proposals")


def _decide(
    ids: Sequence[int], *, actor: Actor, status: str, action: str, note: str
) -> list[MemoryRecord]:
    """Give the proposals among `ids` `status`, one audit event per scope's context. Records no
    longer proposed (another operator decided first) are left as they are; none at all is an
    error."""
    _check_reviewer(actor)
    ids = list(dict.fromkeys(int(i) for i in ids))
    if not ids:
        raise Invalid("select at least one proposal")
    with transaction.atomic():
        rows = list(
            MemoryRecord.objects.select_for_update()
            .filter(pk__in=ids, status=MemoryStatus.PROPOSED)
            .order_by("pk")
        )
        if not rows:
            raise NotFound("none of these memories is waiting for review")
        by_context: dict[int | None, list[MemoryRecord]] = {}
        for record in rows:
            record.status = status
            record.save(update_fields=["status", "updated_at"])
            by_context.setdefault(record.context_id, []).append(record)
        for context_id, records in by_context.items():
            event = audit_record(
                actor=actor,
                action=action,
                target_type="memoryrecord",
                target_ids=[r.pk for r in records],
                context_id=context_id,
                before=[{"id": r.pk, "status": MemoryStatus.PROPOSED} for r in records],
                after=[{"id": r.pk, "status": r.status} for r in records],
                note=note,
            )
            versions_record(
                records, actor=actor, action=action.removeprefix("memory_"), event=event, note=note
            )
    return rows


def proposals_approve(ids: Sequence[int], *, actor: Actor, note: str = "") -> list[MemoryRecord]:
    """Make proposals live: recalled from now on."""
    return _decide(ids, actor=actor, status=MemoryStatus.LIVE, action="memory_approve", note=note)


def proposals_reject(ids: Sequence[int], *, actor: Actor, note: str = "") -> list[MemoryRecord]:
    """Refuse proposals: kept (recording the same content again answers the rejected record),
    never recalled."""
    return _decide(
        ids, actor=actor, status=MemoryStatus.REJECTED, action="memory_reject", note=note
    )


def proposal_edit_approve(
    record: MemoryRecord, *, actor: Actor, note: str = "", **changes: Any
) -> MemoryRecord:
    """Edit a proposal (`memory_edit`'s fields, audited as an edit) and approve it, at once."""
    _check_reviewer(actor)
    with transaction.atomic():
        locked = MemoryRecord.objects.select_for_update().get(pk=record.pk)
        if locked.status != MemoryStatus.PROPOSED:
            raise NotFound("this memory is no longer waiting for review")
        memory_edit(record=locked, actor=actor, note=note, **changes)
        [approved] = proposals_approve([locked.pk], actor=actor, note=note)
    return approved


def proposal_merge(*, proposal_id: int, into_id: int, actor: Actor, note: str = "") -> MemoryRecord:
    """Merge a proposal into a live record of its scope: the live record gains its keywords, the
    proposal becomes `merged` with `merged_into` in its metadata. One audit event keeps both
    versions before."""
    _check_reviewer(actor)
    with transaction.atomic():
        rows = {
            r.pk: r
            for r in MemoryRecord.objects.select_for_update().filter(pk__in=[proposal_id, into_id])
        }
        proposal, keep = rows.get(proposal_id), rows.get(into_id)
        if proposal is None or proposal.status != MemoryStatus.PROPOSED:
            raise NotFound(f"memory {proposal_id} is not waiting for review")
        if keep is None or keep.status != MemoryStatus.LIVE or keep.archived_at is not None:
            raise NotFound(f"memory {into_id} is not a live memory")
        if keep.scope_digest != proposal.scope_digest:
            raise Invalid("a proposal merges into a live memory of its own scope")
        before = {str(r.pk): snapshot(r) for r in (keep, proposal)}
        keep.keywords = list(dict.fromkeys([*keep.keywords, *proposal.keywords]))
        keep.save(update_fields=["keywords", "updated_at"])
        proposal.status = MemoryStatus.MERGED
        proposal.metadata = {**proposal.metadata, "merged_into": keep.pk}
        proposal.save(update_fields=["status", "metadata", "updated_at"])
        event = audit_record(
            actor=actor,
            action="memory_merge",
            target_type="memoryrecord",
            target_ids=[keep.pk, proposal.pk],
            context_id=keep.context_id,
            before=before,
            after={"kept": keep.pk, **snapshot(keep)},
            note=note,
        )
        versions_record([keep], actor=actor, action="merge", event=event, note=note)
        versions_record([proposal], actor=actor, action="merged", event=event, note=note)
    return keep
