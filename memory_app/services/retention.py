"""Retention: memories past their expiry date and what operators' retention policies say is too
old, removed for good in bounded batches that each commit, so a pass that stops (a crash, a
deploy) loses nothing and the next goes on where it was.

Memory expiry (a memory's expiry date, a namespace item's time to live) skips pinned records
and records under legal hold. A policy's batch takes one context's share of what it removes
(locked one context at a time, as every purge does) and goes through the purge the dashboard
uses (`memory_app.services.curation.selected_purge`): counters, full-text rows, trace spans and
edit events follow. Each pass of a policy ends with one audited
summary of what it removed. `manage.py apply_retention` runs every pass to its end;
`embed_worker` does one batch a turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from memory_app.audit import Actor, audit_record
from memory_app.errors import Invalid, LegalHold, NotFound
from memory_app.models import (
    Context,
    MemoryRecord,
    Message,
    RetentionKind,
    RetentionPolicy,
    Run,
    SpanQueue,
    TraceSpan,
)
from memory_app.services.curation import PURGE_CONFIRMATION, selected_purge
from memory_app.services.memories import memory_purge

log = logging.getLogger(__name__)

BATCH_SIZE = 500
MAX_BATCH_SIZE = 10_000
EXPIRY = Actor.system("system:expiry")
RETENTION = Actor.system("system:retention")


def check_batch_size(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise Invalid("the batch size must be a whole number")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise Invalid(f"the batch size must be from 1 to {MAX_BATCH_SIZE}")
    return batch_size


# --- memory expiry ----------------------------------------------------------------------------


# A memory's own expiry date, and a namespace item's time to live (LangGraph's store deletes an
# item once its TTL has run out; here it reads as absent from then on and the sweep removes it).
# Each date has its own partial index, so each is read soonest first on its own.
EXPIRY_DATES = ("expires_at", "item_expires_at")


def _expired(date: str) -> QuerySet[MemoryRecord]:
    return MemoryRecord.objects.filter(
        **{f"{date}__isnull": False, f"{date}__lte": Now()}, pinned=False, legal_hold=""
    )


def expired_count() -> int:
    return (
        MemoryRecord.objects.filter(pinned=False, legal_hold="")
        .filter(Q(expires_at__lte=Now()) | Q(item_expires_at__lte=Now()))
        .count()
    )


def memories_expire_batch(*, batch_size: int = BATCH_SIZE) -> int:
    """Remove up to `batch_size` memories past their expiry date or namespace items past their
    time to live, soonest expired first, each as a purge (vectors, full-text and its versions in
    the audit trail go with it); answers how many. Records another worker holds are left to it
    (SKIP LOCKED)."""
    check_batch_size(batch_size)
    removed = 0
    with transaction.atomic():
        ids: list[int] = []
        for date in EXPIRY_DATES:
            ids += (
                _expired(date)
                .exclude(pk__in=ids)
                .order_by(date, "pk")
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)[: batch_size - len(ids)]
            )
            if len(ids) >= batch_size:
                break
        for record in MemoryRecord.objects.filter(pk__in=ids).order_by("pk"):
            try:
                memory_purge(record=record, actor=EXPIRY, note="expired")
            except (NotFound, LegalHold):
                continue  # gone meanwhile, or held since it was read: not expired
            removed += 1
    if removed:
        log.info("expired %d memories past their expiry date", removed)
    return removed


def memories_expire(*, batch_size: int = BATCH_SIZE) -> int:
    total = 0
    while removed := memories_expire_batch(batch_size=batch_size):
        total += removed
    return total


# --- retention policies -----------------------------------------------------------------------

MAX_AGE_DAYS = 100 * 366


def _clean_policy(fields: dict[str, Any]) -> dict[str, Any]:
    name = (fields.get("name") or "").strip()
    if not name or len(name) > 200 or "\x00" in name:
        raise Invalid("a policy needs a name of 1 to 200 characters")
    keys = fields.get("scope_keys") or {}
    if not isinstance(keys, dict) or not all(
        isinstance(k, str) and isinstance(v, str | int | float | bool) for k, v in keys.items()
    ):
        raise Invalid('scope_keys must be an object of plain values, e.g. {"tenant": "acme"}')
    kind = fields.get("kind")
    if kind not in RetentionKind.values:
        raise Invalid(f"kind must be one of {', '.join(RetentionKind.values)}")
    days = fields.get("max_age_days")
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_AGE_DAYS:
        raise Invalid(f"max_age_days must be a whole number from 1 to {MAX_AGE_DAYS}")
    return {
        "name": name,
        "scope_keys": keys,
        "kind": kind,
        "max_age_days": days,
        "enabled": bool(fields.get("enabled", True)),
    }


def _described(policy: RetentionPolicy) -> dict[str, Any]:
    return {
        "name": policy.name,
        "scope_keys": policy.scope_keys,
        "kind": policy.kind,
        "max_age_days": policy.max_age_days,
        "enabled": policy.enabled,
    }


def policy_save(
    *, actor: Actor, fields: dict[str, Any], policy: RetentionPolicy | None = None
) -> RetentionPolicy:
    """Create a policy, or change one; audited with before/after."""
    clean = _clean_policy(fields)
    with transaction.atomic():
        if policy is None:
            policy = RetentionPolicy.objects.create(**clean, created_by=actor.label)
            before = None
        else:
            policy = RetentionPolicy.objects.select_for_update().get(pk=policy.pk)
            before = _described(policy)
            for name, value in clean.items():
                setattr(policy, name, value)
            policy.save()
        audit_record(
            actor=actor,
            action="retention_policy",
            target_type="retentionpolicy",
            target_ids=[policy.pk],
            before=before,
            after=_described(policy),
        )
    return policy


def policy_delete(*, actor: Actor, policy: RetentionPolicy) -> None:
    with transaction.atomic():
        before = _described(policy)
        pk = policy.pk
        RetentionPolicy.objects.filter(pk=pk).delete()
        audit_record(
            actor=actor,
            action="retention_policy_delete",
            target_type="retentionpolicy",
            target_ids=[pk],
            before=before,
        )


def _cutoff(policy: RetentionPolicy):
    return timezone.now() - timedelta(days=policy.max_age_days)


def _contexts(policy: RetentionPolicy) -> QuerySet[Context]:
    contexts = Context.objects.all()
    return contexts.filter(keys__contains=policy.scope_keys) if policy.scope_keys else contexts


def _messages_of(policy: RetentionPolicy, context_id: int, batch_size: int) -> int:
    ids = list(
        Message.objects.filter(context_id=context_id, created_at__lt=_cutoff(policy))
        .order_by("seq")
        .values_list("pk", flat=True)[:batch_size]
    )
    if ids:
        selected_purge(
            message_ids=ids,
            confirmation=PURGE_CONFIRMATION,
            actor=RETENTION,
            note=_why(policy),
            context_id=context_id,
        )
    return len(ids)


def _runs_of(policy: RetentionPolicy, context_id: int, batch_size: int) -> int:
    ids = list(
        Run.objects.filter(context_id=context_id, created_at__lt=_cutoff(policy))
        .order_by("created_at", "pk")
        .values_list("pk", flat=True)[:batch_size]
    )
    if ids:
        selected_purge(
            run_ids=ids,
            confirmation=PURGE_CONFIRMATION,
            actor=RETENTION,
            note=_why(policy),
            context_id=context_id,
        )
    return len(ids)


def _spans_of(policy: RetentionPolicy, context_id: int, batch_size: int) -> int:
    """Spans as `backlog.expire_spans_batch` expires them: a span marking a purged step keeps
    its marker (and is not counted again), the steps made from the others stay. OTLP exports the
    mapping set aside (kept with their error, never mapped) go once as old: each holds spans as
    received."""
    rows = list(
        TraceSpan.objects.filter(context_id=context_id, received_at__lt=_cutoff(policy))
        .exclude(data__has_key="purged")
        .order_by("received_at", "pk")
        .select_for_update(skip_locked=True)
        .values_list("pk", "data__purged_task")[:batch_size]
    )
    marked = [pk for pk, task in rows if task]
    TraceSpan.objects.filter(context_id=context_id, pk__in=[pk for pk, t in rows if not t]).delete()
    TraceSpan.objects.filter(context_id=context_id, pk__in=marked).update(
        data={"purged": True, "purged_task": True}
    )
    set_aside = list(
        SpanQueue.objects.filter(context_id=context_id, received_at__lt=_cutoff(policy))
        .exclude(error="")
        .order_by("received_at", "pk")
        .select_for_update(skip_locked=True)
        .values_list("pk", flat=True)[: batch_size - len(rows)]
    )
    SpanQueue.objects.filter(context_id=context_id, pk__in=set_aside).delete()
    return len(rows) + len(set_aside)


BATCHES: dict[str, Callable[[RetentionPolicy, int, int], int]] = {
    RetentionKind.MESSAGES: _messages_of,
    RetentionKind.RUNS: _runs_of,
    RetentionKind.SPANS: _spans_of,
}
# Contexts a batch looks through (in id order, from the pass's cursor) for rows to remove.
CONTEXTS_PER_BATCH = 200
# How long the worker leaves a policy alone after a pass that found nothing more to remove.
RECHECK = timedelta(hours=1)


def _why(policy: RetentionPolicy) -> str:
    return f"retention policy {policy.pk} ({policy.name})"


@dataclass(frozen=True)
class BatchDone:
    removed: int
    # The pass's total so far; `finished` when the pass went through every context (then its
    # summary's audit event, unless the worker's pass removed nothing).
    total: int
    finished: bool = False
    summary_event_id: int | None = None


def _batch(policy: RetentionPolicy, progress: dict, batch_size: int) -> tuple[int, bool]:
    """Rows removed from the first context at or after the pass's cursor that has any (the
    cursor stays on it: it may hold more), and whether the pass has gone through them all."""
    cursor = progress.get("context", 0)
    ids = list(
        _contexts(policy)
        .filter(pk__gte=cursor)
        .order_by("pk")
        .values_list("pk", flat=True)[:CONTEXTS_PER_BATCH]
    )
    for context_id in ids:
        removed = BATCHES[policy.kind](policy, context_id, batch_size)
        if removed:
            progress["context"] = context_id
            return removed, False
        progress["context"] = context_id + 1
    return 0, len(ids) < CONTEXTS_PER_BATCH


def policy_apply_batch(
    *, policy: RetentionPolicy, batch_size: int = BATCH_SIZE, worker: bool = False
) -> BatchDone:
    """One committed batch of `policy`'s pass: up to `batch_size` rows of one context removed,
    the pass's progress (its cursor over the contexts, its totals) kept on the policy in the same
    transaction. The batch that goes past the last context ends the pass: its totals become one
    audit event and `last_summary`. The `worker` leaves alone a policy another worker holds or
    whose last pass ended less than `RECHECK` ago, and audits no pass that removed nothing."""
    check_batch_size(batch_size)
    with transaction.atomic():
        policy = (
            RetentionPolicy.objects.select_for_update(skip_locked=worker)
            .filter(pk=policy.pk)
            .first()
        )
        if policy is None:
            if worker:
                return BatchDone(0, 0)
            raise NotFound("retention policy not found")
        progress = dict(policy.progress or {})
        if not policy.enabled or (
            worker
            and not progress
            and policy.last_applied_at
            and timezone.now() - policy.last_applied_at < RECHECK
        ):
            return BatchDone(0, 0)
        progress.setdefault("started_at", timezone.now().isoformat())
        removed, finished = _batch(policy, progress, batch_size)
        if removed:
            progress["removed"] = progress.get("removed", 0) + removed
            progress["batches"] = progress.get("batches", 0) + 1
        if not finished:
            policy.progress = progress
            policy.save(update_fields=["progress"])
            return BatchDone(removed, progress.get("removed", 0))
        summary = {
            **_described(policy),
            "removed": progress.get("removed", 0),
            "batches": progress.get("batches", 0),
            "started_at": progress["started_at"],
            "finished_at": timezone.now().isoformat(),
        }
        policy.progress = {}
        policy.last_applied_at = timezone.now()
        if worker and not summary["removed"]:
            policy.save(update_fields=["progress", "last_applied_at"])
            return BatchDone(0, 0, finished=True)
        event = audit_record(
            actor=RETENTION,
            action="retention_applied",
            target_type="retentionpolicy",
            target_ids=[policy.pk],
            after=summary,
            note=f"{_why(policy)}: {summary['removed']} {policy.kind} removed",
        )
        policy.last_summary = summary
        policy.save(update_fields=["progress", "last_applied_at", "last_summary"])
        return BatchDone(removed, summary["removed"], finished=True, summary_event_id=event.pk)


def policy_apply(
    *,
    policy: RetentionPolicy,
    batch_size: int = BATCH_SIZE,
    progress: Callable[[RetentionPolicy, BatchDone], None] | None = None,
) -> BatchDone:
    """Run `policy`'s pass to its end, batch by batch; `progress` hears of each batch."""
    while True:
        done = policy_apply_batch(policy=policy, batch_size=batch_size)
        if progress is not None:
            progress(policy, done)
        if done.finished or not RetentionPolicy.objects.filter(pk=policy.pk, enabled=True).exists():
            return done


def retention_batch(*, batch_size: int = BATCH_SIZE) -> int:
    """The worker's turn: one batch of expired memories, then one batch of the first enabled
    policy with rows to remove (a policy whose pass just ended is audited on the way). Answers
    the rows removed (0: nothing is due)."""
    removed = memories_expire_batch(batch_size=batch_size)
    for policy in RetentionPolicy.objects.filter(enabled=True).order_by("pk"):
        done = policy_apply_batch(policy=policy, batch_size=batch_size, worker=True)
        if done.removed:
            log.info(
                "%s: %d %s removed (%d this pass)",
                _why(policy),
                done.removed,
                policy.kind,
                done.total,
            )
            return removed + done.removed
    return removed
