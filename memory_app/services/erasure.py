"""Erasure by key subset ("forget everything about user ada"): every context whose keys contain
the subset, with all it holds and every derived copy (messages and their full-text rows, runs,
steps, tool calls and the full-text rows of what they wrote, trace spans and the OTLP exports
still queued for mapping, memories and their vectors and retries), the memories of key subsets
inside it and the store namespaces their agents used, the audit trail's payloads about any of
them (redacted: the events stay, so the trail still says who did what and when), the Django
admin's log lines naming them, and the API keys confined inside the subset (they reach nothing
else) with their audit payloads (a key's creation names its confinement). Answers a receipt of
counts per kind; the erasure's own audit event names the subset by its digest, never by its
values.

A record under legal hold anywhere in the subset refuses the whole erasure (409) before anything
is deleted. Each context goes in its own transaction, its row locked first (one context at a
time, as every purge): an erasure of many contexts finishes, and running it again after a stop
takes what is left.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db import transaction
from django.db.models import Q, Sum

from memory_app.audit import Actor, admin_log_forget, audit_record
from memory_app.db import lock_contexts
from memory_app.errors import Invalid
from memory_app.models import (
    ApiKey,
    AuditEvent,
    Checkpoint,
    CheckpointBlob,
    CheckpointWrite,
    Comment,
    Context,
    Embedding,
    EmbeddingRetry,
    EmbeddingWaiting,
    Label,
    MemoryEmbedding,
    MemoryEmbeddingRetry,
    MemoryEmbeddingWaiting,
    MemoryRecord,
    MemoryVersion,
    Message,
    MessageSearch,
    Run,
    RunSearch,
    Score,
    SpanQueue,
    Step,
    StoreNamespace,
    ToolCall,
    TraceSpan,
    keys_digest,
)
from memory_app.services.context_delete import delete_in_context
from memory_app.services.memory_expiry import held_refusal

# What an admin types to confirm: hard to type by accident, easy to read.
ERASE_CONFIRMATION = "erase everything about these keys"
ERASED = {"erased": True}
KINDS = (
    "contexts",
    "messages",
    "full_text_rows",
    "run_full_text_rows",
    "runs",
    "steps",
    "tool_calls",
    "trace_spans",
    "queued_spans",
    "memories",
    "memory_versions",
    "store_namespaces",
    "scores",
    "labels",
    "comments",
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
    "vectors",
    "embedding_retries",
    "audit_events_redacted",
    "admin_log_entries",
    "api_keys",
)


# A context's rows that are neither agent memory nor run: reviewers' marks on its runs, steps and
# messages, and LangGraph's checkpoints of its thread.
CONTEXT_ROWS = {
    "scores": Score,
    "labels": Label,
    "comments": Comment,
    "checkpoints": Checkpoint,
    "checkpoint_blobs": CheckpointBlob,
    "checkpoint_writes": CheckpointWrite,
}


def clean_keys(keys: Any) -> dict[str, Any]:
    """A non-empty subset of plain values: an empty one is contained in every context."""
    if not isinstance(keys, dict) or not keys:
        raise Invalid('erase needs a non-empty key subset, e.g. {"user": "ada"}')
    for name, value in keys.items():
        if not isinstance(name, str) or not isinstance(value, str | int | float | bool):
            raise Invalid("the key subset's values must be strings, numbers or booleans")
        if "\x00" in name or (isinstance(value, str) and "\x00" in value):
            raise Invalid("the key subset contains a NUL character")
    return keys


def _subset_memories(keys: dict[str, Any]):
    return MemoryRecord.objects.filter(context__isnull=True, scope_keys__contains=keys)


def _contexts(keys: dict[str, Any]) -> list[int]:
    return list(
        Context.objects.filter(keys__contains=keys).order_by("pk").values_list("pk", flat=True)
    )


def _check_holds(keys: dict[str, Any], context_ids: list[int]) -> None:
    held = list(
        MemoryRecord.objects.filter(
            Q(context_id__in=context_ids) | Q(context__isnull=True, scope_keys__contains=keys)
        )
        .exclude(legal_hold="")
        .order_by("pk")
        .values_list("pk", "legal_hold")
    )
    if held:
        raise held_refusal(held, "erased")


def erase_preview(*, keys: dict[str, Any]) -> dict[str, int]:
    """What `erase` would remove, counted; changes nothing (the audit and admin-log counts are
    left out: they are known once the rows they name are)."""
    keys = clean_keys(keys)
    ids = _contexts(keys)
    in_ctx = Q(context_id__in=ids)
    memories = MemoryRecord.objects.filter(in_ctx | Q(pk__in=_subset_memories(keys).values("pk")))
    vectors = Embedding.objects.filter(in_ctx)
    memory_vectors = MemoryEmbedding.objects.filter(memory_record__in=memories.values("pk"))
    return {
        "contexts": len(ids),
        "messages": Message.objects.filter(in_ctx).count(),
        "full_text_rows": MessageSearch.objects.filter(context_id__in=ids).count(),
        "run_full_text_rows": RunSearch.objects.filter(context_id__in=ids).count(),
        "runs": Run.objects.filter(in_ctx).count(),
        "steps": Step.objects.filter(in_ctx).count(),
        "tool_calls": ToolCall.objects.filter(in_ctx).count(),
        "trace_spans": TraceSpan.objects.filter(in_ctx).count(),
        "queued_spans": _queued_spans(SpanQueue.objects.filter(in_ctx)),
        "memories": memories.count(),
        "memory_versions": MemoryVersion.objects.filter(memory__in=memories.values("pk")).count(),
        **{kind: model.objects.filter(in_ctx).count() for kind, model in CONTEXT_ROWS.items()},
        "vectors": vectors.count()
        + memory_vectors.count()
        + EmbeddingWaiting.objects.filter(in_ctx).count()
        + MemoryEmbeddingWaiting.objects.filter(memory_record__in=memories.values("pk")).count(),
        "embedding_retries": EmbeddingRetry.objects.filter(
            embedding__in=vectors.values("pk")
        ).count()
        + MemoryEmbeddingRetry.objects.filter(embedding__in=memory_vectors.values("pk")).count(),
        "store_namespaces": StoreNamespace.objects.filter(scope_keys__contains=keys).count(),
        "api_keys": ApiKey.objects.filter(context_keys__contains=keys).count(),
    }


def _queued_spans(queued) -> int:
    """The spans (and log records) the OTLP exports of `queued` hold."""
    return queued.aggregate(n=Sum("span_count"))["n"] or 0


def _deleted(qs) -> int:
    """The rows of `qs` itself a delete removed (not what its cascades took along)."""
    return qs.delete()[1].get(qs.model._meta.label, 0)


def _erased(model, context_id: int) -> int:
    """The context's rows of `model` deleted, with what they take along, by statements that
    all name the context (`delete_in_context`; Django's delete collects and deletes by ids
    alone, on Citus on every shard)."""
    rows = model.objects.filter(context_id=context_id).order_by().values_list("pk", flat=True)
    return delete_in_context(model, context_id=context_id, ids=list(rows))


def _redact(targets: Q) -> int:
    return AuditEvent.objects.filter(targets).update(before=ERASED, after=ERASED, note="erased")


def _erase_memory_vectors(memory_ids: list[int]) -> Counter:
    """The vectors of these memories and their retries (which go by their cascade), counted."""
    vectors = MemoryEmbedding.objects.filter(memory_record_id__in=memory_ids)
    return Counter(
        embedding_retries=MemoryEmbeddingRetry.objects.filter(
            embedding__in=vectors.values("pk")
        ).count(),
        vectors=_deleted(vectors)
        + _deleted(MemoryEmbeddingWaiting.objects.filter(memory_record_id__in=memory_ids)),
    )


def _erase_context(context_id: int, keys: dict[str, Any]) -> Counter:
    """Everything of one context, in one transaction, its row locked first."""
    got: Counter = Counter()
    with transaction.atomic():
        lock_contexts([context_id])
        if not Context.objects.filter(pk=context_id).exists():
            return got  # erased meanwhile
        _check_holds(keys, [context_id])
        of = {"context_id": context_id}
        # Rows the Django admin may have logged (a log line's text is the row's __str__: a
        # score's value, a label's name, a message's text).
        ids = {
            model: list(model.objects.filter(**of).order_by().values_list("pk", flat=True))
            for model in (
                Message,
                Run,
                Step,
                ToolCall,
                MemoryRecord,
                TraceSpan,
                Score,
                Label,
                Comment,
            )
        }
        got.update(_erase_memory_vectors(ids[MemoryRecord]))
        vectors = Embedding.objects.filter(**of)
        got["embedding_retries"] += EmbeddingRetry.objects.filter(
            context_id=context_id, embedding__in=vectors.values("pk")
        ).count()
        got["full_text_rows"] += MessageSearch.objects.filter(**of).count()
        # What the steps and tool calls wrote, indexed for the search across contexts: the
        # database's triggers take these rows along with them.
        got["run_full_text_rows"] += RunSearch.objects.filter(**of).count()
        got["vectors"] += _deleted(vectors) + _deleted(EmbeddingWaiting.objects.filter(**of))
        got["audit_events_redacted"] += _redact(
            Q(**of)
            | Q(target_type="context", target_ids__contains=[context_id])
            | Q(target_type="message", target_ids__overlap=ids[Message])
            | Q(target_type="run", target_ids__overlap=ids[Run])
            | Q(target_type="step", target_ids__overlap=ids[Step])
            | Q(target_type="toolcall", target_ids__overlap=ids[ToolCall])
            | Q(target_type="memoryrecord", target_ids__overlap=ids[MemoryRecord])
        )
        # Children before parents, each counted as it goes (the database's triggers take the
        # messages' full-text rows along; the vectors' retries and the memories' versions go by
        # their cascades).
        for kind, model in CONTEXT_ROWS.items():
            got[kind] += _deleted(model.objects.filter(**of))
        got["memory_versions"] += MemoryVersion.objects.filter(
            memory_id__in=ids[MemoryRecord]
        ).count()
        got["memories"] += _deleted(MemoryRecord.objects.filter(**of))
        got["messages"] += _erased(Message, context_id)
        got["tool_calls"] += _erased(ToolCall, context_id)
        got["steps"] += _erased(Step, context_id)
        got["trace_spans"] += _erased(TraceSpan, context_id)
        # OTLP exports not mapped yet (or set aside): the raw protobuf of the context's spans.
        queued = SpanQueue.objects.filter(**of)
        got["queued_spans"] += _queued_spans(queued)
        queued.delete()
        got["runs"] += _erased(Run, context_id)
        for model, pks in ids.items():
            got["admin_log_entries"] += admin_log_forget(model, pks)
        got["admin_log_entries"] += admin_log_forget(Context, [context_id])
        Context.objects.filter(pk=context_id).delete()
        got["contexts"] += 1
    return got


def _erase_subset_memories(keys: dict[str, Any]) -> Counter:
    got: Counter = Counter()
    with transaction.atomic():
        ids = list(
            _subset_memories(keys).select_for_update().order_by("pk").values_list("pk", flat=True)
        )
        if not ids:
            return got
        _check_holds(keys, [])
        got.update(_erase_memory_vectors(ids))
        got["audit_events_redacted"] += _redact(
            Q(target_type="memoryrecord", target_ids__overlap=ids)
        )
        got["admin_log_entries"] += admin_log_forget(MemoryRecord, ids)
        got["memory_versions"] += MemoryVersion.objects.filter(memory_id__in=ids).count()
        got["memories"] += _deleted(MemoryRecord.objects.filter(pk__in=ids))
    return got


def erase(*, keys: dict[str, Any], confirmation: str, actor: Actor) -> dict[str, Any]:
    """Erase everything about the key subset `keys` (see the module's docstring); `confirmation`
    is `ERASE_CONFIRMATION` typed out. Answers the receipt: counts per kind and the id of the
    audit event that keeps it."""
    keys = clean_keys(keys)
    if (confirmation or "").strip() != ERASE_CONFIRMATION:
        raise Invalid(f"type {ERASE_CONFIRMATION!r} to confirm the erasure")
    context_ids = _contexts(keys)
    _check_holds(keys, context_ids)
    total: Counter = Counter()
    for context_id in context_ids:
        total += _erase_context(context_id, keys)
    total += _erase_subset_memories(keys)
    with transaction.atomic():
        # The store's namespaces name what the subset's agents kept (e.g. a user's name).
        total["store_namespaces"] += _deleted(
            StoreNamespace.objects.filter(scope_keys__contains=keys)
        )
        key_ids = list(
            ApiKey.objects.filter(context_keys__contains=keys).values_list("pk", flat=True)
        )
        # A key's creation and changes name its confinement (the subset's values) and its name.
        if key_ids:
            total["audit_events_redacted"] += _redact(
                Q(target_type="apikey", target_ids__overlap=key_ids)
            )
        total["admin_log_entries"] += admin_log_forget(ApiKey, key_ids)
        total["api_keys"] += _deleted(ApiKey.objects.filter(pk__in=key_ids))
        receipt = {kind: total.get(kind, 0) for kind in KINDS}
        # The subset by its digest only: its values are what is being forgotten.
        event = audit_record(
            actor=actor,
            action="erase",
            target_type="keys",
            target_ids=[],
            after={"keys_digest": keys_digest(keys), "receipt": receipt},
            note=f"erased {receipt['contexts']} contexts and {receipt['memories']} memories",
        )
    return {"receipt": receipt, "keys_digest": keys_digest(keys), "audit_event_id": event.pk}
