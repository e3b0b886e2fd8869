"""Curation writes: prune and restore (a soft delete), bulk prune by filter, undo from the audit,
purge.

Every change here is reversible through the audit trail except `pruned_purge`, which is the one
irreversible action (admin only, typed confirmation, audited). Edits of a message's text live
with the other message writes (`memory_app.services.messages`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Q, QuerySet, Sum
from django.utils import timezone

from memory_app.audit import Actor, admin_log_forget, audit_record
from memory_app.db import lock_contexts
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.models import (
    AuditEvent,
    Context,
    Message,
    MessageRole,
    Run,
    Step,
    ToolCall,
)
from memory_app.services.context_delete import delete_in_context
from memory_app.services.messages import message_edit
from memory_app.services.runs import runs_recount
from memory_app.services.traces import trace_steps_purge

PREVIEW_SAMPLE = 50
MAX_TEXT_FILTER = 500
# The words an admin types to confirm a purge: hard to type by accident, easy to read.
PURGE_CONFIRMATION = "purge pruned items"


# --- bulk prune by filter ---------------------------------------------------------------------


@dataclass(frozen=True)
class PruneFilter:
    """Which live messages of a context a bulk prune takes. Empty fields do not filter.

    Bounds are exclusive (`before_seq=10` takes seqs 1..9), as in "before" and "after".
    """

    role: str = ""
    tag: str = ""
    text: str = ""
    before_seq: int | None = None
    after_seq: int | None = None
    before_time: datetime | None = None
    after_time: datetime | None = None
    run_id: int | None = None

    def __post_init__(self):
        if self.role and self.role not in MessageRole.values:
            raise Invalid(f"role must be one of {MessageRole.values}, got {self.role!r}")
        if "\x00" in self.text or "\x00" in self.tag:
            raise Invalid("the filter contains a NUL character")
        if len(self.text) > MAX_TEXT_FILTER:
            raise Invalid(f"the text filter is longer than {MAX_TEXT_FILTER} characters")
        for name in ("before_seq", "after_seq", "run_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise Invalid(f"{name} must be a non-negative whole number")
        for name in ("before_time", "after_time"):
            value = getattr(self, name)
            if value is not None and timezone.is_naive(value):
                raise Invalid(f"{name} must carry a time zone")

    @property
    def is_empty(self) -> bool:
        return not any(v not in (None, "") for v in asdict(self).values())

    def as_json(self) -> dict[str, Any]:
        """The non-empty criteria, JSON-ready (kept in the audit event)."""
        out = {}
        for key, value in asdict(self).items():
            if value in (None, ""):
                continue
            out[key] = value.isoformat() if isinstance(value, datetime) else value
        return out

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.as_json().items()) or "everything"


def _matching(context: Context, flt: PruneFilter) -> QuerySet[Message]:
    qs = Message.objects.filter(context=context, pruned_at__isnull=True)
    if flt.role:
        qs = qs.filter(role=flt.role)
    if flt.tag:
        qs = qs.filter(tags__contains=[flt.tag])
    if flt.text:
        qs = qs.filter(text__icontains=flt.text)
    if flt.before_seq is not None:
        qs = qs.filter(seq__lt=flt.before_seq)
    if flt.after_seq is not None:
        qs = qs.filter(seq__gt=flt.after_seq)
    if flt.before_time is not None:
        qs = qs.filter(created_at__lt=flt.before_time)
    if flt.after_time is not None:
        qs = qs.filter(created_at__gt=flt.after_time)
    if flt.run_id is not None:
        qs = qs.filter(run_id=flt.run_id)
    return qs


@dataclass
class BulkPreview:
    count: int
    tokens: int
    sample: list[Message]
    # Messages appended after the preview are never taken by the apply that follows it.
    upto_seq: int

    @property
    def more(self) -> int:
        return self.count - len(self.sample)


def bulk_prune_preview(
    *, context: Context, flt: PruneFilter, sample: int = PREVIEW_SAMPLE
) -> BulkPreview:
    """How many live messages the filter takes and the first few of them; changes nothing."""
    upto = Context.objects.filter(pk=context.pk).values_list("last_seq", flat=True).get()
    qs = _matching(context, flt).filter(seq__lte=upto)
    totals = qs.aggregate(n=Count("id"), t=Sum("token_count"))
    rows = list(qs.order_by("seq")[:sample])
    return BulkPreview(count=totals["n"], tokens=totals["t"] or 0, sample=rows, upto_seq=upto)


def bulk_prune_apply(
    *, context: Context, flt: PruneFilter, upto_seq: int, expected_count: int, actor: Actor
) -> AuditEvent:
    """Prune exactly what the preview showed, in one transaction with one audit event.

    `upto_seq` and `expected_count` come from the preview: if the set changed meanwhile
    (someone pruned, restored or edited), nothing happens and `Conflict` asks for a new preview.
    """
    if flt.is_empty:
        raise Invalid("a bulk prune needs at least one filter")
    with transaction.atomic():
        lock_contexts([context.pk])
        ids = list(
            _matching(context, flt)
            .filter(seq__lte=upto_seq)
            .select_for_update()
            .order_by("seq")
            .values_list("pk", flat=True)
        )
        if len(ids) != expected_count:
            raise Conflict(
                f"the filter now matches {len(ids)} messages, not {expected_count}: preview again",
                {"count": {"stored": len(ids), "sent": expected_count}},
            )
        if not ids:
            raise Invalid("the filter matches no live message")
        Message.objects.filter(context=context, pk__in=ids).update(
            pruned_at=timezone.now(), pruned_by=actor.label
        )
        return audit_record(
            actor=actor,
            action="bulk_prune",
            target_type="message",
            target_ids=ids,
            context_id=context.pk,
            after={"filter": flt.as_json(), "count": len(ids), "upto_seq": upto_seq},
            note=f"bulk prune: {flt.describe()}",
        )


# --- undo from the audit ----------------------------------------------------------------------

UNDOABLE = {
    ("prune", "message"),
    ("bulk_prune", "message"),
    ("restore", "message"),
    ("edit", "message"),
    ("prune", "step"),
    ("restore", "step"),
}


def audit_undoable(event: AuditEvent) -> bool:
    return event.undone_by_id is None and (event.action, event.target_type) in UNDOABLE


def audit_undo(*, event: AuditEvent, actor: Actor) -> AuditEvent | None:
    """Reverse what one audit event did: restore a prune, prune a restore, revert an edit.

    Items purged since are skipped (their content is gone); items already back in the earlier
    state are left alone. Returns the new audit event (None when nothing needed to change) and
    marks the original as undone, so an undo cannot be applied twice.
    """
    with transaction.atomic():
        event = AuditEvent.objects.select_for_update().get(pk=event.pk)
        if event.undone_by_id is not None:
            raise Conflict(
                f"audit event {event.pk} was already undone by event {event.undone_by_id}"
            )
        kind = (event.action, event.target_type)
        if kind not in UNDOABLE:
            raise Invalid(
                f"a {event.action} of a {event.target_type} cannot be undone from the audit"
            )
        note = f"undo of audit event {event.pk}"
        if event.target_type == "message":
            new = _undo_messages(event=event, actor=actor, note=note)
        else:
            new = _undo_steps(event=event, actor=actor, note=note)
        if new is None:
            # Nothing to change still counts as undone: record it so the trail says who decided.
            new = audit_record(
                actor=actor,
                action="undo",
                target_type=event.target_type,
                target_ids=[],
                context_id=event.context_id,
                note=note + " (nothing to change)",
            )
        event.undone_by = new
        event.save(update_fields=["undone_by"])
    return new


def _undo_messages(*, event: AuditEvent, actor: Actor, note: str) -> AuditEvent | None:
    existing = Message.objects.filter(context_id=event.context_id, pk__in=event.target_ids)
    if event.action == "edit":
        message = existing.first()
        if message is None:
            raise NotFound(f"message {event.target_ids[0]} was purged: its edit cannot be reverted")
        before = event.before or {}
        message_edit(
            message=message,
            actor=actor,
            text=before.get("text"),
            tags=before.get("tags"),
            metadata=before.get("metadata"),
        )
        latest = (
            AuditEvent.objects.filter(action="edit", target_type="message", target_ids=[message.pk])
            .order_by("-id")
            .first()
        )
        if latest is not None and latest.pk != event.pk:
            AuditEvent.objects.filter(pk=latest.pk).update(note=note)
            return latest
        return None
    by_context: dict[int, list[int]] = {}
    for pk, context_id in existing.values_list("pk", "context_id"):
        by_context.setdefault(context_id, []).append(pk)
    if not by_context:
        raise NotFound("every message of this event was purged")
    pruned = event.action == "restore"  # undoing a restore prunes again
    last = None
    for context_id, ids in sorted(by_context.items()):  # contexts locked in id order
        _, ev = messages_set_pruned(
            context=Context.objects.get(pk=context_id),
            ids=ids,
            pruned=pruned,
            actor=actor,
            note=note,
        )
        last = ev or last
    return last


def _undo_steps(*, event: AuditEvent, actor: Actor, note: str) -> AuditEvent | None:
    by_run: dict[int, list[int]] = {}
    steps = Step.objects.filter(context_id=event.context_id, pk__in=event.target_ids)
    for pk, run_id in steps.values_list("pk", "run_id"):
        by_run.setdefault(run_id, []).append(pk)
    if not by_run:
        raise NotFound("every step of this event was purged")
    last = None
    for run_id, ids in by_run.items():
        _, ev = steps_set_pruned(
            run=Run.objects.get(context_id=event.context_id, pk=run_id),
            ids=ids,
            pruned=event.action == "restore",
            actor=actor,
            note=note,
        )
        last = ev or last
    return last


# --- purge (irreversible) ---------------------------------------------------------------------


@dataclass
class PurgePreview:
    messages: int
    steps: int


def _purgeable(older_than: datetime, context: Context | None):
    messages = Message.objects.filter(pruned_at__isnull=False, pruned_at__lt=older_than)
    steps = Step.objects.filter(pruned_at__isnull=False, pruned_at__lt=older_than)
    if context is not None:
        messages = messages.filter(context=context)
        steps = steps.filter(context=context)
    return messages, steps


def purge_preview(*, older_than: datetime, context: Context | None = None) -> PurgePreview:
    messages, steps = _purgeable(older_than, context)
    return PurgePreview(messages=messages.count(), steps=steps.count())


def pruned_purge(
    *, older_than: datetime, confirmation: str, actor: Actor, context: Context | None = None
) -> list[AuditEvent]:
    """Delete for good the messages and steps pruned before `older_than`.

    `confirmation` must be `PURGE_CONFIRMATION` typed out. Edit events of purged messages lose
    their before/after text too (the point of a purge is that the content is gone); the events
    themselves stay, so the trail still says who changed what and when.
    """
    if (confirmation or "").strip() != PURGE_CONFIRMATION:
        raise Invalid(f"type {PURGE_CONFIRMATION!r} to confirm the purge")
    if timezone.is_naive(older_than):
        raise Invalid("the purge date must carry a time zone")
    with transaction.atomic():
        messages, steps = _purgeable(older_than, context)
        when = {"older_than": older_than.isoformat()}
        return _purge(messages, steps, actor=actor, after=when, what="pruned ")


def selected_purge(
    *,
    message_ids=(),
    step_ids=(),
    run_ids=(),
    confirmation: str,
    actor: Actor,
    note: str = "",
    context_id: int | None = None,
) -> list[AuditEvent]:
    """Delete for good these messages, steps and runs, pruned or not (Django admin's delete).

    The same typed confirmation as `pruned_purge`, the same counters kept and edits scrubbed.
    A run goes with its steps and the trace spans it was made from. With `context_id`, all of
    them are that context's (their reads name it); without, their contexts are read first.
    """
    if (confirmation or "").strip() != PURGE_CONFIRMATION:
        raise Invalid(f"type {PURGE_CONFIRMATION!r} to confirm the purge")
    run_ids = list(run_ids)
    of = {} if context_id is None else {"context_id": context_id}
    with transaction.atomic():
        events = _purge(
            Message.objects.filter(pk__in=list(message_ids), **of),
            Step.objects.filter(Q(pk__in=list(step_ids)) | Q(run_id__in=run_ids), **of),
            actor=actor,
            after={"selected": True},
            what="",
            note=note,
        )
        runs = Run.objects.filter(pk__in=run_ids, **of)
        return events + _purge_runs(runs, actor=actor, note=note)


def _purge_runs(found: QuerySet[Run], *, actor: Actor, note: str) -> list[AuditEvent]:
    """Delete these runs (their steps already purged) with their trace spans and tool calls,
    keep their contexts' run counts, scrub their edit events; one purge event per context."""
    # Found by a plain read, then locked one context's runs per statement (as `_purge` does).
    per_context: dict[int, list[int]] = {}
    for context_id in sorted(set(found.order_by().values_list("context_id", flat=True))):
        per_context[context_id] = list(
            found.filter(context_id=context_id)
            .order_by("pk")
            .select_for_update()
            .values_list("pk", flat=True)
        )
    events = []
    why = f" ({note})" if note else ""
    for context_id, ids in sorted(per_context.items()):
        if not ids:
            continue
        # Their trace spans, scores, labels and comments go along; their messages and the
        # memories made from them lose them.
        delete_in_context(Run, context_id=context_id, ids=ids)
        admin_log_forget(Run, ids)
        Context.objects.filter(pk=context_id).update(run_count=F("run_count") - len(ids))
        _scrub_edits(target_type="run", ids=ids)
        events.append(
            audit_record(
                actor=actor,
                action="purge",
                target_type="run",
                target_ids=ids,
                context_id=context_id,
                after={"count": len(ids)},
                note=f"purged {len(ids)} runs{why}",
            )
        )
    return events


def _lock_purged(messages: QuerySet, steps: QuerySet) -> tuple[list, list]:
    """Lock the contexts of these messages and steps, then the rows themselves; answers the
    messages' (pk, context, tokens) and the steps' (pk, run, context, client id).

    The steps' contexts too: trace ingest holds a context's row while it maps a trace's spans,
    so it never reads spans this purge is erasing. A plain read finds the contexts; each is
    then locked, and its rows read under lock, by statements naming it (on Citus a row lock
    names one distribution value). A context whose rows became purgeable after that read is
    left for the next purge."""
    context_ids = sorted(
        {
            *messages.order_by().values_list("context_id", flat=True).distinct(),
            *steps.order_by().values_list("context_id", flat=True).distinct(),
        }
    )
    lock_contexts(context_ids)
    rows, step_rows = [], []
    for context_id in context_ids:
        rows += (
            messages.filter(context_id=context_id)
            .select_for_update()
            .values_list("pk", "context_id", "token_count")
        )
        step_rows += (
            steps.filter(context_id=context_id)
            .select_for_update()
            .values_list("pk", "run_id", "context_id", "client_id")
        )
    return rows, step_rows


def _purge(
    messages: QuerySet, steps: QuerySet, *, actor: Actor, after: dict, what: str, note: str = ""
) -> list[AuditEvent]:
    """Delete these messages and steps (in the caller's transaction), keep the counters of their
    contexts and runs, scrub the text from their edit events, audit one purge per context/run.
    Every statement on their rows names their context."""
    rows, step_rows = _lock_purged(messages, steps)
    why = f" ({note})" if note else ""
    events = _purge_messages(rows, actor=actor, after=after, what=f"{what}messages{why}")
    return events + _purge_steps(step_rows, actor=actor, after=after, what=what, why=why)


def _purge_messages(rows: list, *, actor: Actor, after: dict, what: str) -> list[AuditEvent]:
    """Delete these (pk, context, tokens) messages, one context at a time."""
    per_context: dict[int, list[tuple[int, int]]] = {}
    for pk, context_id, tokens in rows:
        per_context.setdefault(context_id, []).append((pk, tokens))
    events = []
    for context_id, found in per_context.items():
        ids = [pk for pk, _ in found]
        # Their vectors, scores, labels and comments go along; memories made from them lose them.
        delete_in_context(Message, context_id=context_id, ids=ids)
        Context.objects.filter(pk=context_id).update(
            message_count=F("message_count") - len(ids),
            token_count=F("token_count") - sum(tokens for _, tokens in found),
        )
        events.append(
            audit_record(
                actor=actor,
                action="purge",
                target_type="message",
                target_ids=ids,
                context_id=context_id,
                after={**after, "count": len(ids)},
                note=f"purged {len(ids)} {what}",
            )
        )
    ids = [pk for pk, _, _ in rows]
    admin_log_forget(Message, ids)
    _scrub_edits(target_type="message", ids=ids)
    return events


def _purge_steps(
    step_rows: list, *, actor: Actor, after: dict, what: str, why: str
) -> list[AuditEvent]:
    """Delete these (pk, run, context, client id) steps, one context at a time."""
    per_context: dict[int, list[int]] = {}
    per_run: dict[tuple[int, int], list[int]] = {}
    client_ids: dict[tuple[int, int], list[str]] = {}
    for pk, run_id, context_id, client_id in step_rows:
        per_context.setdefault(context_id, []).append(pk)
        per_run.setdefault((run_id, context_id), []).append(pk)
        if client_id:
            client_ids.setdefault((run_id, context_id), []).append(client_id)
    for context_id, ids in per_context.items():
        # Every copy of the steps' text: the trace spans they were made from (else the trace's
        # next span makes them again), their own and their tool calls' edit events.
        traced = [run_id for run_id, c in client_ids if c == context_id]
        for run in Run.objects.filter(context_id=context_id, pk__in=traced):
            trace_steps_purge(run=run, client_ids=client_ids[run.pk, context_id])
        calls = ToolCall.objects.filter(context_id=context_id, step_id__in=ids).order_by()
        _scrub_edits(target_type="toolcall", ids=list(calls.values_list("pk", flat=True)))
        _clear_run_copies(context_id, ids)
        # Their tool calls, scores, labels and comments go along; messages and memories made
        # from them lose them.
        delete_in_context(Step, context_id=context_id, ids=ids)
    step_ids = [r[0] for r in step_rows]
    _scrub_edits(target_type="step", ids=step_ids)
    admin_log_forget(Step, step_ids)
    # The run's counters, models and cost lose what the purged steps brought.
    runs_recount(runs=[(context_id, run_id) for run_id, context_id in per_run])
    return [
        audit_record(
            actor=actor,
            action="purge",
            target_type="step",
            target_ids=ids,
            context_id=context_id,
            after={**after, "count": len(ids), "run": run_id},
            note=f"purged {len(ids)} {what}steps of run {run_id}{why}",
        )
        for (run_id, context_id), ids in per_run.items()
    ]


def _clear_run_copies(context_id: int, step_ids: list[int]) -> None:
    """A run's `task` and `final_answer` are copies of its task and final-answer steps' text:
    they go with the step when they are still the same text."""
    copies = Step.objects.filter(context_id=context_id, pk__in=step_ids).filter(
        Q(kind="task", task__gt="") | Q(is_final_answer=True, action_output__isnull=False)
    )
    for run_id, kind, task, output in copies.values_list("run_id", "kind", "task", "action_output"):
        run = Run.objects.filter(pk=run_id, context_id=context_id)
        if kind == "task":
            run.filter(task=task).update(task="")
        else:
            run.filter(final_answer=output).update(final_answer=None)


def _scrub_edits(*, target_type: str, ids: list[int]) -> None:
    if not ids:
        return
    AuditEvent.objects.filter(
        action="edit", target_type=target_type, target_ids__overlap=ids
    ).update(before={"purged": True}, after={"purged": True})


# Long-term memory curation (promote, edit, archive, merge, list) lives in memory_app.memories,
# the one implementation the API uses too.


def messages_set_pruned(
    *, context: Context, ids: list[int], pruned: bool, actor: Actor, note: str = ""
) -> tuple[list[int], AuditEvent | None]:
    """Prune (soft delete) or restore messages of one context; one audit event lists the ids.

    Ids not in the context raise NotFound (nothing changes); ids already in the wanted state are
    left alone and not listed.
    """
    return _set_pruned(
        model=Message,
        scope={"context": context},
        ids=ids,
        pruned=pruned,
        actor=actor,
        context_id=context.pk,
        note=note,
    )


def steps_set_pruned(
    *, run: Run, ids: list[int], pruned: bool, actor: Actor, note: str = ""
) -> tuple[list[int], AuditEvent | None]:
    return _set_pruned(
        model=Step,
        scope={"run": run},
        ids=ids,
        pruned=pruned,
        actor=actor,
        context_id=run.context_id,
        note=note,
    )


def _set_pruned(*, model, scope, ids, pruned, actor, context_id, note):
    ids = list(dict.fromkeys(int(i) for i in ids))
    with transaction.atomic():
        if model is Message:
            lock_contexts([context_id])
        rows = list(
            model.objects.select_for_update()
            .filter(pk__in=ids, context_id=context_id, **scope)
            .values_list("pk", "pruned_at")
        )
        if len(rows) != len(ids):
            missing = sorted(set(ids) - {pk for pk, _ in rows})
            raise NotFound(f"{model._meta.model_name} {missing[0]} not found")
        changing = sorted(pk for pk, at in rows if (at is None) == pruned)
        if not changing:
            return [], None
        if pruned:
            model.objects.filter(context_id=context_id, pk__in=changing).update(
                pruned_at=timezone.now(), pruned_by=actor.label
            )
        else:
            model.objects.filter(context_id=context_id, pk__in=changing).update(
                pruned_at=None, pruned_by=""
            )
        event = audit_record(
            actor=actor,
            action="prune" if pruned else "restore",
            target_type=model._meta.model_name,
            target_ids=changing,
            context_id=context_id,
            note=note,
        )
    return changing, event
