"""The versions of a memory: the one place every change path records them (record, edit,
archive, restore, review, merge, import, admin), and restoring or undoing from them.

A version is the memory's content, kind, thinking, keywords, metadata, status and archive state
after a change, with who made it, when, and the audit event of the change. Callers hold the
record's row lock (or have just created it), so version numbers follow each other without gaps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from memory_app.audit import Actor, audit_record
from memory_app.embeddings import queue
from memory_app.errors import Conflict, Forbidden, Invalid, NotFound
from memory_app.memories import EDITABLE, content_hash
from memory_app.models import AuditEvent, MemoryRecord, MemoryReview, MemoryStatus, MemoryVersion
from memory_app.queries.memory_history import UNDOABLE


def snapshot(record: MemoryRecord) -> dict[str, Any]:
    return {f: getattr(record, f) for f in EDITABLE} | {
        "archived_at": record.archived_at.isoformat() if record.archived_at else None,
        "status": record.status,
    }


def check_may_change(record: MemoryRecord, actor: Actor) -> None:
    """A key whose memories are reviewed changes its proposals only: editing, archiving or
    restoring a live record would bypass the review."""
    key = actor.api_key
    if (
        key is not None
        and key.memory_review == MemoryReview.PROPOSED
        and record.status != MemoryStatus.PROPOSED
    ):
        raise Forbidden(
            "this API key's memories are reviewed: it may change its proposals only "
            "(record a new memory to propose a change)"
        )


def versions_record(
    records: Iterable[MemoryRecord],
    *,
    actor: Actor,
    action: str,
    event: AuditEvent | None = None,
    note: str = "",
) -> list[MemoryVersion]:
    """Record each record's current state as its next version."""
    records = list(records)
    if not records:
        return []
    at = timezone.now()
    # Every record's last version in one read (a merge or an import gives many records). The
    # versions table stays on the coordinator with the memories, so no shard column is named.
    last = dict(
        MemoryVersion.objects.filter(memory_id__in=sorted({r.pk for r in records}))
        .order_by()
        .values_list("memory_id")
        .annotate(n=Max("version"))
    )
    rows = []
    for record in records:
        state = snapshot(record)
        rows.append(
            MemoryVersion(
                memory_id=record.pk,
                version=last.get(record.pk, 0) + 1,
                content=state["content"],
                kind=state["kind"],
                thinking=state["thinking"],
                keywords=state["keywords"],
                metadata=state["metadata"],
                status=state["status"],
                archived_at=record.archived_at,
                action=action,
                actor=actor.label,
                user=actor.user if actor.user is not None and actor.user.is_authenticated else None,
                api_key=actor.api_key,
                audit_event=event,
                note=note,
                at=at,
            )
        )
    return MemoryVersion.objects.bulk_create(rows)


def memory_restore_version(
    *, record: MemoryRecord, version: int, actor: Actor, action: str = "restore_version"
) -> MemoryRecord:
    """Make version `version` the memory's current state again, as a new version (audited):
    its content, kind, thinking, keywords, metadata and archive state. The review status is not
    restored: approving and rejecting stay the review's (a restore never makes a proposal live).
    409 when another memory of the scope holds that content now."""
    with transaction.atomic():
        record = MemoryRecord.objects.select_for_update().filter(pk=record.pk).first()
        if record is None:
            raise NotFound("memory not found")
        check_may_change(record, actor)
        old = MemoryVersion.objects.filter(memory_id=record.pk, version=version).first()
        if old is None:
            raise NotFound(f"memory {record.pk} has no version {version}")
        before = snapshot(record)
        record.content = old.content
        record.content_hash = content_hash(old.content)
        record.kind = old.kind
        record.thinking = old.thinking
        record.keywords = list(old.keywords)
        record.metadata = old.metadata
        if (record.archived_at is None) != (old.archived_at is None):
            record.archived_at = timezone.now() if old.archived_at is not None else None
        after = snapshot(record)
        if after == before:
            raise Invalid(f"the memory already stands as version {version}")
        try:
            with transaction.atomic():
                record.save()
        except IntegrityError as exc:
            raise Conflict("another memory in this scope already has this content") from exc
        note = f"{'undo: back to' if action == 'undo' else 'restored'} version {version}"
        event = audit_record(
            actor=actor,
            action="memory_" + action,
            target_type="memoryrecord",
            target_ids=[record.pk],
            context_id=record.context_id,
            before=before,
            after=after,
            note=note,
        )
        versions_record([record], actor=actor, action=action, event=event, note=note)
        if before["content"] != after["content"]:
            queue.requeue_memory_record(record)
    return record


def memory_undo(*, record: MemoryRecord, actor: Actor) -> MemoryRecord:
    """Reverse the memory's last change when it is an edit, an archive or its restore (or a
    restore of a version): the version before it becomes current again, as a new version."""
    with transaction.atomic():
        MemoryRecord.objects.select_for_update().filter(pk=record.pk).first()
        last_two = list(MemoryVersion.objects.filter(memory_id=record.pk).order_by("-version")[:2])
        if len(last_two) < 2 or last_two[0].action not in UNDOABLE:
            raise Invalid("the memory's last change is not an edit or an archive to undo")
        return memory_restore_version(
            record=record, version=last_two[1].version, actor=actor, action="undo"
        )
