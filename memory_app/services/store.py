"""Writes of namespace items (LangGraph's store): put (a keyed upsert), delete (archive) and the
refresh of their time to live on read. Items are memory records, so each change is audited as
the dashboard's and an agent's other memory changes are, and a key whose memories are reviewed
proposes its items as it proposes its other memories."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from memory_app.audit import Actor, audit_record
from memory_app.embeddings import queue
from memory_app.memories import Scope, item_hash
from memory_app.models import MemoryKind, MemoryRecord, MemoryStatus, StoreNamespace
from memory_app.namespace_items import clean_key, clean_namespace, clean_ttl, content_of
from memory_app.services.memories import memory_set_archived, snapshot, status_for
from memory_app.services.memory_history import check_may_change, versions_record


def _expires(ttl: float | None):
    return timezone.now() + timedelta(minutes=ttl) if ttl is not None else None


def _locked(scope: Scope, namespace: list[str], key: str) -> MemoryRecord | None:
    return (
        MemoryRecord.objects.select_for_update()
        .filter(scope_digest=scope.digest, namespace=namespace, item_key=key)
        .first()
    )


def namespace_touched(scope: Scope, namespace: Any) -> list[str]:
    """Note that an agent used `namespace` (a put, a delete or a get, even of nothing): it is
    listed from now on, after the namespaces used before it, as `InMemoryStore` lists the
    namespaces it has been asked about. Answers the cleaned namespace."""
    namespace = clean_namespace(namespace)
    if scope.keys is None:
        raise ValueError("namespace items live in a key subset scope")
    StoreNamespace.objects.bulk_create(
        [
            StoreNamespace(
                scope_digest=scope.digest, scope_keys=scope.scope_keys, namespace=namespace
            )
        ],
        ignore_conflicts=True,
    )
    return namespace


def _gone(record: MemoryRecord) -> bool:
    """Whether an item reads as absent: deleted (archived), expired, or set aside by review."""
    expired = record.item_expires_at is not None and record.item_expires_at <= timezone.now()
    return (
        record.archived_at is not None
        or expired
        or record.status in (MemoryStatus.REJECTED, MemoryStatus.MERGED)
    )


def item_put(
    *,
    scope: Scope,
    namespace: Any,
    key: Any,
    value: Any,
    actor: Actor,
    ttl: Any = None,
) -> tuple[MemoryRecord, bool]:
    """Store `value` under `namespace`/`key` in `scope`: a new item (created True), or the
    item's new value. An item that was deleted, expired or set aside by review comes back as a
    new one (created again now). With `ttl` (minutes) the item expires that long after this
    write; without, it never does."""
    key, content, ttl = clean_key(key), content_of(value), clean_ttl(ttl)
    with transaction.atomic():
        namespace = namespace_touched(scope, namespace)
        record = _locked(scope, namespace, key)
        if record is None:
            try:
                with transaction.atomic():
                    record = MemoryRecord.objects.create(
                        context=None,
                        scope_keys=scope.scope_keys,
                        scope_digest=scope.digest,
                        namespace=namespace,
                        item_key=key,
                        content=content,
                        content_hash=item_hash(namespace, key),
                        kind=MemoryKind.FACT,
                        recorded_by=actor.label,
                        status=status_for(scope, actor),
                        item_ttl=ttl,
                        item_expires_at=_expires(ttl),
                    )
            except IntegrityError:
                # Another request created it first: this put overwrites it.
                record = _locked(scope, namespace, key)
            else:
                queue.enqueue_memory_records([record])
                event = audit_record(
                    actor=actor,
                    action="record",
                    target_type="memoryrecord",
                    target_ids=[record.pk],
                    after=[{"id": record.pk, "content": content, "kind": record.kind}],
                    note=f"store put {'/'.join(namespace)} {key}",
                )
                versions_record([record], actor=actor, action="record", event=event)
                return record, True
        return _overwrite(record, scope, content, ttl, actor), False


def _overwrite(
    record: MemoryRecord, scope: Scope, content: str, ttl: float | None, actor: Actor
) -> MemoryRecord:
    before = snapshot(record)
    again = _gone(record)
    if not again:
        check_may_change(record, actor)
    record.content = content
    record.item_ttl = ttl
    record.item_expires_at = _expires(ttl)
    fields = ["content", "item_ttl", "item_expires_at", "updated_at"]
    if again:
        # Deleted (or expired) and put again: a new item, placed last in its namespace.
        record.archived_at = None
        record.status = status_for(scope, actor)
        record.created_at = timezone.now()
        record.recorded_by = actor.label
        fields += ["archived_at", "status", "created_at", "recorded_by"]
    record.save(update_fields=fields)
    after = snapshot(record)
    if after != before:
        action = "restore" if again else "edit"
        event = audit_record(
            actor=actor,
            action=action,
            target_type="memoryrecord",
            target_ids=[record.pk],
            before=before,
            after=after,
            note=f"store put {'/'.join(record.namespace)} {record.item_key}",
        )
        versions_record([record], actor=actor, action=action, event=event)
    if before["content"] != content:
        queue.requeue_memory_record(record)
    return record


def item_delete(*, scope: Scope, namespace: Any, key: Any, actor: Actor) -> bool:
    """Delete an item: archive it (the dashboard restores or purges it). True when there was a
    visible item; deleting an absent one is no error, as in LangGraph."""
    key = clean_key(key)
    namespace = namespace_touched(scope, namespace)
    record = (
        MemoryRecord.objects.filter(scope_digest=scope.digest, namespace=namespace, item_key=key)
        .filter(archived_at__isnull=True)
        .first()
    )
    if record is None or _gone(record):
        return False
    memory_set_archived(
        record=record, archived=True, actor=actor, note=f"store delete {'/'.join(namespace)}"
    )
    return True


def items_refresh_ttl(scope: Scope, ids: list[int]) -> None:
    """Restart the time to live of items just read (LangGraph's `refresh_ttl`); items without
    one stay as they are."""
    if not ids:
        return
    MemoryRecord.objects.filter(
        Q(scope_digest=scope.digest, pk__in=ids, item_ttl__isnull=False)
    ).update(item_expires_at=RawSQL("now() + item_ttl * interval '1 minute'", []))
