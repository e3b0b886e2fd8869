"""Writes of long-term memories: record (all or nothing, the same content in a scope once, a
near-copy of a live record answered by that record; live or proposed for review), edit, archive
and restore, expiry and pinning, legal hold, promote a message or step, merge, purge. Every
change is audited with before/after and is the memory's next version (`memory_history`),
except that a purge erases the purged record's content from the audit too and its versions
with it. A new record names its provenance: its sources as the agent gives them (checked), who
recorded it as the server saw."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from memory_app import backlog
from memory_app.audit import Actor, admin_log_forget, audit_record
from memory_app.embeddings import client_vectors, providers, queue
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.memories import (
    EDITABLE,
    MAX_ITEMS,
    Scope,
    clean_content,
    clean_expiry,
    clean_keywords,
    clean_kind,
    content_hash,
    no_nul,
    record_hash,
    unexpired,
)
from memory_app.models import (
    AuditEvent,
    MemoryOrigin,
    MemoryRecord,
    MemoryReview,
    MemoryStatus,
    Message,
    Run,
    Step,
)
from memory_app.namespace_items import content_of
from memory_app.queries.memories import text_vectors
from memory_app.queries.memory_review import similar_live
from memory_app.services.memory_expiry import held_refusal, memory_set_expiry
from memory_app.services.memory_history import check_may_change, snapshot, versions_record


def _source_run(
    scope: Scope, *, message_id: int | None, step_id: int | None, run_id: int | None
) -> int | None:
    """Check what a memory says it was derived from, and answer its run. Each source must lie in
    a context the scope covers (no pointing into other tenants: 404 as if absent), and together
    they name one context, the step one of the run's. Without a run, the step's run, else the
    message's, is the source run."""
    message = _source(Message, message_id, scope)
    step = _source(Step, step_id, scope)
    run = _source(Run, run_id, scope)
    if step is not None and run is not None and step.run_id != run.pk:
        raise Invalid(f"step {step.pk} is not a step of run {run.pk}")
    if len({s.context_id for s in (message, step, run) if s is not None}) > 1:
        raise Invalid("the source message, step and run must belong to one context")
    if run is not None:
        return run.pk
    if step is not None:
        return step.run_id
    return message.run_id if message is not None else None


def _source(model, pk: int | None, scope: Scope):
    """The row `pk` of `model` (a message, step or run) in a context the scope covers, else
    NotFound. A context's scope reads it in that context (on Citus, on its shard alone); a key
    subset's covers contexts that only the row's own context tells, so it is read by its id."""
    if pk is None:
        return None
    rows = model.objects.filter(pk=pk)
    if scope.context is not None:
        row = rows.filter(context_id=scope.context.pk).first()
    else:
        row = rows.select_related("context").first()
        row = row if row is not None and scope.covers(row.context) else None
    if row is None:
        raise NotFound(f"{model._meta.model_name} {pk} not found in this scope")
    return row


def _origin(actor: Actor) -> dict[str, Any]:
    """Who records: always the server's (the request's key or user), never the client's word."""
    if actor.api_key is not None:
        return {"origin": MemoryOrigin.API_KEY, "source_api_key": actor.api_key}
    if actor.user is not None and actor.user.is_authenticated:
        return {"origin": MemoryOrigin.USER, "source_user": actor.user}
    return {"origin": MemoryOrigin.SYSTEM}


@dataclass(frozen=True)
class Recorded:
    """Unpacks as `record, created = ...`. `near_copy` is the similarity of the live record
    answered in place of a near-copy (None when the content was new or the same)."""

    record: MemoryRecord
    created: bool
    near_copy: float | None = None

    def __iter__(self) -> Iterator[Any]:
        return iter((self.record, self.created))


def status_for(scope: Scope, actor: Actor) -> str:
    """What an agent records is proposed when its key's policy says so, or when the scope lies in
    a key subset under review (`AGENTMEMORY_MEMORY_REVIEW_SCOPES`); an operator's is live."""
    key = actor.api_key
    if key is None:
        return MemoryStatus.LIVE
    if key.memory_review == MemoryReview.PROPOSED:
        return MemoryStatus.PROPOSED
    keys = scope.scope_keys
    for reviewed in settings.AGENTMEMORY_MEMORY_REVIEW_SCOPES:
        if isinstance(reviewed, dict) and reviewed and reviewed.items() <= keys.items():
            return MemoryStatus.PROPOSED
    return MemoryStatus.LIVE


def _near_copy_vectors(items: Sequence[dict[str, Any]], vectors: list) -> list[tuple]:
    """(vector, model) per item to look for near-copies with: the client's vector, else the
    provider's (one call for the batch; none when the check is off or no provider answers)."""
    out: list[tuple] = [(None, None)] * len(items)
    if not settings.AGENTMEMORY_MEMORY_NEAR_COPY_SIMILARITY:
        return out
    missing = [n for n, v in enumerate(vectors) if v is None]
    texts = [items[n].get("content") for n in missing]
    embedded, model = text_vectors([t for t in texts if isinstance(t, str)])
    if len(embedded) == len(missing):
        for n, vector in zip(missing, embedded, strict=True):
            out[n] = (vector, model if vector is not None else None)
    for n, v in enumerate(vectors):
        if v is not None:
            out[n] = (v.values.tolist(), v.model)
    return out


def _near_copy(scope: Scope, content: str, vector, model) -> tuple[MemoryRecord, float] | None:
    threshold = settings.AGENTMEMORY_MEMORY_NEAR_COPY_SIMILARITY
    if not threshold:
        return None
    # Without vectors, every word counts: "Ada is not vegan" is no copy of "Ada is vegan".
    similar = similar_live(
        scope_digest=scope.digest,
        content=content,
        vector=vector,
        model=model,
        limit=1,
        words="simple",
    )
    if similar and similar[0].similarity >= threshold:
        return similar[0].record, similar[0].similarity
    return None


def memories_record(
    *, scope: Scope, items: Sequence[dict[str, Any]], actor: Actor, thinking: str = ""
) -> list[Recorded]:
    """Record facts into `scope`, all or nothing. Each item: content, and optionally kind,
    thinking (defaults to the shared `thinking`), keywords, metadata, source_message_id,
    source_step_id. Content already in the scope returns the stored record (created False), and
    so does content nearly identical to a live record of the scope (`near_copy` its similarity,
    `AGENTMEMORY_MEMORY_NEAR_COPY_SIMILARITY`). An agent's records are live, or proposed for
    review by its key's policy (`status_for`)."""
    return _record(scope=scope, items=items, actor=actor, thinking=thinking, action="record")


def _fields(
    scope: Scope, item: dict[str, Any], *, thinking: str, actor: Actor, status: str
) -> dict[str, Any]:
    """The columns of a new record of `item`, checked (provenance from the scope's contexts)."""
    content = clean_content(item.get("content"))
    source_message_id, source_step_id = item.get("source_message_id"), item.get("source_step_id")
    source_run_id = _source_run(
        scope,
        message_id=source_message_id,
        step_id=source_step_id,
        run_id=item.get("source_run_id"),
    )
    return {
        "context": scope.context,
        "scope_keys": scope.scope_keys,
        "scope_digest": scope.digest,
        "content": content,
        "content_hash": content_hash(content),
        "kind": clean_kind(item.get("kind")),
        "thinking": no_nul(item.get("thinking") or thinking or "", "thinking"),
        "keywords": clean_keywords(item.get("keywords")),
        "metadata": item.get("metadata") or {},
        "source_message_id": source_message_id,
        "source_step_id": source_step_id,
        "source_run_id": source_run_id,
        **_origin(actor),
        "recorded_by": actor.label,
        "status": status,
        "expires_at": clean_expiry(item.get("expires_at"), item.get("ttl_seconds")),
        "pinned": bool(item.get("pinned")),
    }


# One transaction from the checks to the audit and the versions: split, a failure between
# the parts would leave records without their audit event, vectors or history.
def _record(
    *,
    scope: Scope,
    items: Sequence[dict[str, Any]],
    actor: Actor,
    thinking: str,
    action: str,
    note: str = "",
) -> list[Recorded]:
    if not items:
        raise Invalid("nothing to record")
    if len(items) > MAX_ITEMS:
        raise Invalid(f"at most {MAX_ITEMS} memories per request")
    if scope.keys is not None and not scope.keys:
        # An empty subset is contained in every context's keys: it would be seen by every
        # tenant. A memory for one context takes that context's scope instead.
        raise Invalid(
            "scope_keys must name at least one key (an empty set would reach every context)"
        )
    # Client vectors are checked before anything is written (a wrong dimension names the item).
    vectors = client_vectors.client_vectors(
        [(i.get("vector"), i.get("vector_model"), i.get("where")) for i in items], label="items"
    )
    results: list[Recorded] = []
    status = status_for(scope, actor)
    near_vectors = _near_copy_vectors(items, vectors)
    with transaction.atomic():
        for item, (near_vector, near_model) in zip(items, near_vectors, strict=True):
            fields = _fields(scope, item, thinking=thinking, actor=actor, status=status)
            content = fields["content"]
            # The same content answers its record, whatever its status; else a near-copy of a
            # live record answers that record.
            same = MemoryRecord.objects.filter(
                scope_digest=fields["scope_digest"], content_hash=fields["content_hash"]
            ).first()
            if same is not None:
                results.append(Recorded(_renewed(same, fields, actor), False))
                continue
            near = _near_copy(scope, content, near_vector, near_model)
            if near is not None:
                results.append(Recorded(near[0], False, near_copy=near[1]))
                continue
            try:
                with transaction.atomic():
                    record = MemoryRecord.objects.create(**fields)
                created = True
            except IntegrityError:
                record = MemoryRecord.objects.get(
                    scope_digest=fields["scope_digest"], content_hash=fields["content_hash"]
                )
                created = False
            results.append(Recorded(record, created))
        new = [r.record for r in results if r.created]
        if new:
            # New records keep the vectors sent with them (a repeat stores nothing); the rest
            # wait for the configured model's worker.
            fresh = [(r.record, v) for r, v in zip(results, vectors, strict=True) if r.created]
            if client_vectors.vectors_copy(
                [(None, rec.pk, rec.context_id, v) for rec, v in fresh if v is not None]
            ):
                transaction.on_commit(backlog.wake_indexer)
            active = providers.active_model_name()
            queue.enqueue_memory_records(
                [rec for rec, v in fresh if v is None or v.model != active]
            )
            event = audit_record(
                actor=actor,
                action=action,
                target_type="memoryrecord",
                target_ids=[r.pk for r in new],
                context_id=scope.context.pk if scope.context else None,
                after=[{"id": r.pk, "content": r.content, "kind": r.kind} for r in new],
                note=note,
            )
            versions_record(
                new,
                actor=actor,
                action="promote" if action == "memory_promote" else action,
                event=event,
                note=note,
            )
    client_vectors.ensure_vector_indexes(vectors)
    return results


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Invalid("a namespace item's content is its value: a JSON object") from exc


def _renewed(record: MemoryRecord, fields: dict[str, Any], actor: Actor) -> MemoryRecord:
    """Content recorded again after its record expired (not yet removed) renews that record with
    the new expiry, as if it were recorded anew; a record still in force is answered as stored."""
    if MemoryRecord.objects.filter(unexpired(), pk=record.pk).exists():
        return record
    return memory_set_expiry(
        record=record,
        actor=actor,
        expires_at=fields["expires_at"],
        pinned=fields["pinned"] or None,
        note="recorded again after it expired",
    )


def memory_edit(
    *,
    record: MemoryRecord,
    actor: Actor,
    content: str | None = None,
    kind: str | None = None,
    thinking: str | None = None,
    keywords: list[str] | None = None,
    metadata: dict | None = None,
    note: str = "",
) -> MemoryRecord:
    """Edit a record; the audit event keeps the previous version."""
    with transaction.atomic():
        record = MemoryRecord.objects.select_for_update().get(pk=record.pk)
        check_may_change(record, actor)
        before = snapshot(record)
        if content is not None:
            record.content = clean_content(content)
            if record.namespace is not None:
                # A namespace item's content is its value: it stays a JSON object.
                record.content = content_of(_json_object(record.content))
            record.content_hash = record_hash(record)
        if kind is not None:
            record.kind = clean_kind(kind)
        if thinking is not None:
            record.thinking = no_nul(thinking, "thinking")
        if keywords is not None:
            record.keywords = clean_keywords(keywords)
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise Invalid("metadata must be an object")
            record.metadata = metadata
        after = snapshot(record)
        if after == before:
            return record
        try:
            with transaction.atomic():
                record.save()
        except IntegrityError as exc:
            raise Conflict("another memory in this scope already has this content") from exc
        event = audit_record(
            actor=actor,
            action="edit",
            target_type="memoryrecord",
            target_ids=[record.pk],
            context_id=record.context_id,
            before=before,
            after=after,
            note=note,
        )
        versions_record([record], actor=actor, action="edit", event=event, note=note)
        if before["content"] != after["content"]:
            queue.requeue_memory_record(record)
    return record


def memory_set_archived(
    *, record: MemoryRecord, archived: bool, actor: Actor, note: str = ""
) -> MemoryRecord:
    """Archive (hide from retrieval) or restore a record; audited, nothing is lost."""
    with transaction.atomic():
        record = MemoryRecord.objects.select_for_update().get(pk=record.pk)
        check_may_change(record, actor)
        if (record.archived_at is not None) == archived:
            return record
        before = snapshot(record)
        record.archived_at = timezone.now() if archived else None
        record.save(update_fields=["archived_at", "updated_at"])
        event = audit_record(
            actor=actor,
            action="archive" if archived else "restore",
            target_type="memoryrecord",
            target_ids=[record.pk],
            context_id=record.context_id,
            before=before,
            after=snapshot(record),
            note=note,
        )
        versions_record(
            [record],
            actor=actor,
            action="archive" if archived else "unarchive",
            event=event,
            note=note,
        )
    return record


def memory_change(
    *, record: MemoryRecord, actor: Actor, expiry: dict[str, Any], note: str = "", **edit: Any
) -> MemoryRecord:
    """An edit and an expiry change (`memory_set_expiry`'s arguments) together, all or nothing:
    the API's and MCP's correction of a memory."""
    with transaction.atomic():
        record = memory_edit(record=record, actor=actor, note=note, **edit)
        if expiry:
            record = memory_set_expiry(record=record, actor=actor, note=note, **expiry)
    return record


def memory_promote(
    *, actor: Actor, message: Message | None = None, step: Step | None = None, kind: str = "fact"
) -> Recorded:
    """Record a message's text or a step's observations as a memory of its context, linked back
    to its source (provenance). It goes through the same path as an agent's record, so promoting
    content already recorded in that context's scope returns the existing record."""
    if (message is None) == (step is None):
        raise Invalid("promote exactly one message or one step")
    if message is not None:
        context, content, source = message.context, message.text, "message"
    else:
        context, content, source = step.run.context, step.observations, "step"
    if not (content or "").strip():
        raise Invalid("there is no text to promote")
    [recorded] = _record(
        scope=Scope(context=context),
        items=[
            {
                "content": content,
                "kind": kind,
                "metadata": {"promoted_from": source},
                "source_message_id": message.pk if message is not None else None,
                "source_step_id": step.pk if step is not None else None,
            }
        ],
        actor=actor,
        thinking="",
        action="memory_promote",
        note=f"from {source} {(message or step).pk}",
    )
    return recorded


def memories_merge(*, keep_id: int, ids: Sequence[int], actor: Actor) -> MemoryRecord:
    """Merge duplicates into `keep_id`: keywords are united, the others archived (not deleted)
    with `merged_into` in their metadata, and one audit event keeps every merged version."""
    ids = list(dict.fromkeys(int(i) for i in ids))
    if keep_id not in ids:
        ids.append(keep_id)
    if len(ids) < 2:
        raise Invalid("select at least two memories to merge")
    with transaction.atomic():
        rows = {r.pk: r for r in MemoryRecord.objects.select_for_update().filter(pk__in=ids)}
        if len(rows) != len(ids):
            raise NotFound(f"memory {sorted(set(ids) - set(rows))[0]} not found")
        if any(r.status != MemoryStatus.LIVE for r in rows.values()):
            raise Invalid("merge live memories only (a proposal is merged from the review inbox)")
        keep = rows[keep_id]
        others = [rows[i] for i in ids if i != keep_id]
        before = {str(r.pk): snapshot(r) for r in rows.values()}
        keep.keywords = list(
            dict.fromkeys([*keep.keywords, *(k for r in others for k in r.keywords)])
        )
        keep.save(update_fields=["keywords", "updated_at"])
        now = timezone.now()
        for r in others:
            r.archived_at = r.archived_at or now
            r.metadata = {**r.metadata, "merged_into": keep.pk}
            r.save(update_fields=["archived_at", "metadata", "updated_at"])
        event = audit_record(
            actor=actor,
            action="memory_merge",
            target_type="memoryrecord",
            target_ids=ids,
            context_id=keep.context_id,
            before=before,
            after={"kept": keep.pk, **snapshot(keep)},
        )
        versions_record([keep], actor=actor, action="merge", event=event)
        versions_record(others, actor=actor, action="merged", event=event)
    return keep


def memory_purge(*, record: MemoryRecord, actor: Actor, note: str = "") -> AuditEvent:
    """Delete a record for good with every copy of its content: its vectors (and their retries),
    its full-text vector (a column of its row), its versions in the audit trail (each event
    keeps who did what and when, the record's content becomes `{"purged": true}`) and the Django
    admin's log lines naming it. Audited as a
    purge, without the content. Callers ask for the typed confirmation first."""
    with transaction.atomic():
        record = MemoryRecord.objects.select_for_update().filter(pk=record.pk).first()
        if record is None:
            raise NotFound("memory not found")
        if record.legal_hold:
            raise held_refusal([(record.pk, record.legal_hold)], "purged")
        pk, context_id = record.pk, record.context_id
        # Its embeddings go with it (their retries by the database's cascade).
        MemoryRecord.objects.filter(pk=pk).delete()
        admin_log_forget(MemoryRecord, [pk])
        events = AuditEvent.objects.select_for_update().filter(
            target_type="memoryrecord", target_ids__contains=[pk]
        )
        for event in events:
            sole = list(event.target_ids) == [pk]
            before, after = _redacted(event.before, pk, sole), _redacted(event.after, pk, sole)
            if (before, after) != (event.before, event.after):
                event.before, event.after = before, after
                event.save(update_fields=["before", "after"])
        return audit_record(
            actor=actor,
            action="purge",
            target_type="memoryrecord",
            target_ids=[pk],
            context_id=context_id,
            after={"count": 1},
            note=note,
        )


PURGED = {"purged": True}


def _redacted(payload: Any, pk: int, sole: bool) -> Any:
    """An audit payload without record `pk`'s content. Events about several records keep the
    others': a list of `{"id", ...}` (record, promote), a dict of versions by id (merge), the
    kept record's version beside `kept` (merge). An event about this record alone loses it all."""
    if payload is None:
        return None
    if sole:
        return PURGED
    if isinstance(payload, list):
        return [
            {"id": pk, **PURGED} if isinstance(i, dict) and i.get("id") == pk else i
            for i in payload
        ]
    if isinstance(payload, dict):
        if payload.get("kept") == pk:
            return {"kept": pk, **PURGED}
        if str(pk) in payload:
            return {**payload, str(pk): PURGED}
    return payload


def memory_admin_save(record: MemoryRecord, changed: list[str] | None, user) -> list[str]:
    """An admin form's memory through the write path: a new one recorded as the user's (None
    `changed`), the content fields edited and the archive set on a stored one, each audited with
    its version. `record` then holds what is stored; answers the other changed fields (plain
    columns, such as the sources, which the admin saves and audits itself)."""
    actor = Actor.for_user(user)
    if changed is None:
        scope = Scope(keys=record.scope_keys) if record.context_id is None else None
        item = {f: getattr(record, f) for f in EDITABLE} | {
            f"{f}_id": getattr(record, f"{f}_id")
            for f in ("source_message", "source_step", "source_run")
        }
        [recorded] = memories_record(
            scope=scope or Scope(context=record.context), items=[item], actor=actor
        )
        record.pk = recorded.record.pk
        return []
    values = {f: getattr(record, f) for f in EDITABLE if f in changed}
    if values:
        memory_edit(record=record, actor=actor, note="via admin", **values)
    if "archived_at" in changed:
        archived = record.archived_at is not None
        memory_set_archived(record=record, archived=archived, actor=actor, note="via admin")
    stored = MemoryRecord.objects.get(pk=record.pk)
    for f in (*EDITABLE, "content_hash", "archived_at", "status"):
        setattr(record, f, getattr(stored, f))
    return [f for f in changed if f not in EDITABLE and f != "archived_at"]
