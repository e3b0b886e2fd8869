"""Export: the backup's records, referents first, read with server-side cursors in chunks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.db import models
from django.db.models import Q

from memory_app.backup.annotations import annotation_records
from memory_app.backup.checkpoints import checkpoint_records
from memory_app.backup.format import (
    CHUNK,
    CONTEXT_FIELDS,
    EMBEDDING_FIELDS,
    FORMAT,
    MEMORY_FIELDS,
    MESSAGE_FIELDS,
    RUN_FIELDS,
    STEP_FIELDS,
    TOOL_CALL_FIELDS,
    VERSION,
    dump_fields,
)
from memory_app.backup.lines import Summary
from memory_app.backup.versions import memory_version_records
from memory_app.models import (
    Context,
    Embedding,
    EmbeddingWaiting,
    MemoryEmbedding,
    MemoryEmbeddingWaiting,
    MemoryRecord,
    Message,
    Run,
    Step,
    ToolCall,
)
from memory_app.queries.memories import memories_visible


def _run_ref(run: Run) -> dict[str, Any]:
    return {"client_id": run.client_id, "created_at": run.created_at.isoformat()}


def contexts_matching(
    *, context_ids: list[int] | None = None, keys: dict | None = None
) -> models.QuerySet:
    qs = Context.objects.all()
    if context_ids:
        qs = qs.filter(pk__in=context_ids)
    if keys:
        qs = qs.filter(keys__contains=keys)
    return qs.order_by("pk")


def export_records(
    *,
    contexts: models.QuerySet | None = None,
    embeddings: bool = False,
    chunk_size: int = CHUNK,
    confined_to: dict[str, Any] | None = None,
    subsets: dict[str, Any] | None = None,
    memory_versions: bool = False,
) -> Iterator[dict[str, Any]]:
    """Yield the backup's records, one at a time, reading the database in chunks.

    A context's memory records are its own and those of every key subset its keys contain (an
    empty legacy subset too). `confined_to`, a confined API key's context keys, narrows them to
    what that key recalls (`memories_visible`, archived ones included), so a tenant's export
    holds no record its key may not read. `subsets` (a whole export: `{}`; one by keys: those
    keys) adds, after the contexts, the key-subset memories whose keys contain it that no
    exported context's keys contain (a LangGraph store's items under `{"user": "ada"}` when no
    context has ada's keys): a whole backup loses nothing. `memory_versions` adds each memory's
    history, past content and notes included: only the operator's and an admin key's export
    asks for it (a read key sees a memory as it stands, as the API shows it)."""
    contexts = contexts if contexts is not None else Context.objects.order_by("pk")
    yield {"type": "header", "format": FORMAT, "version": VERSION, "embeddings": embeddings}
    exported_memories: set[int] = set()
    for ctx in contexts.iterator(chunk_size=100):
        yield {"type": "context", "digest": ctx.keys_digest, **dump_fields(ctx, CONTEXT_FIELDS)}
        # Filled while the context's runs are written, read by its steps and messages after.
        run_refs: dict[int, dict] = {}
        yield from _run_records(ctx, run_refs, chunk_size)
        yield from _step_records(ctx, run_refs, chunk_size)
        yield from _message_records(ctx, run_refs, chunk_size)
        yield from annotation_records(ctx, run_refs, chunk_size)
        yield from checkpoint_records(ctx, run_refs, chunk_size)
        scoped = _memories_of(ctx, confined_to)
        written: set[int] = set()
        for mem in scoped.order_by("pk").iterator(chunk_size=chunk_size):
            # A key-subset memory falls under several contexts; the file holds it once.
            if mem.pk in exported_memories:
                continue
            exported_memories.add(mem.pk)
            written.add(mem.pk)
            yield _memory_record(mem)
        if memory_versions:
            yield from memory_version_records(scoped, written, chunk_size)
        if embeddings:
            yield from _embedding_records(ctx, scoped, chunk_size)
    if subsets is not None:
        yield from _subset_records(
            subsets, exported_memories, embeddings, memory_versions, chunk_size
        )


def _subset_records(
    subsets: dict[str, Any],
    exported: set[int],
    embeddings: bool,
    memory_versions: bool,
    chunk_size: int,
) -> Iterator[dict[str, Any]]:
    """The key-subset memories under `subsets` that no context's records held, then their
    versions and vectors."""
    rest = MemoryRecord.objects.filter(context__isnull=True, scope_keys__contains=subsets)
    written: set[int] = set()
    for mem in rest.order_by("pk").iterator(chunk_size=chunk_size):
        if mem.pk not in exported:
            written.add(mem.pk)
            yield _memory_record(mem)
    if memory_versions:
        yield from memory_version_records(rest, written, chunk_size)
    if embeddings:
        for record in _memory_embedding_records(rest, chunk_size):
            if record.pop("memory_id") not in exported:
                yield record


def _run_records(
    ctx: Context, run_refs: dict[int, dict], chunk_size: int
) -> Iterator[dict[str, Any]]:
    for run in Run.objects.filter(context=ctx).order_by("pk").iterator(chunk_size=chunk_size):
        run_refs[run.pk] = _run_ref(run)
        yield {
            "type": "run",
            "context": ctx.keys_digest,
            "ref": run_refs[run.pk],
            **dump_fields(run, RUN_FIELDS),
        }


def _step_records(
    ctx: Context, run_refs: dict[int, dict], chunk_size: int
) -> Iterator[dict[str, Any]]:
    steps = (
        Step.objects.filter(context=ctx)
        .order_by("run_id", "position")
        .prefetch_related(
            models.Prefetch("tool_calls", queryset=ToolCall.objects.order_by("position"))
        )
    )
    for step in steps.iterator(chunk_size=chunk_size):
        calls = [dump_fields(tc, TOOL_CALL_FIELDS) for tc in step.tool_calls.all()]
        yield {
            "type": "step",
            "run": run_refs[step.run_id],
            **dump_fields(step, STEP_FIELDS),
            "tool_calls": calls,
        }


def _message_records(
    ctx: Context, run_refs: dict[int, dict], chunk_size: int
) -> Iterator[dict[str, Any]]:
    step_positions = dict(Step.objects.filter(context=ctx).values_list("pk", "position"))
    step_runs = dict(Step.objects.filter(context=ctx).values_list("pk", "run_id"))
    for msg in Message.objects.filter(context=ctx).order_by("seq").iterator(chunk_size=chunk_size):
        record = {
            "type": "message",
            "context": ctx.keys_digest,
            **dump_fields(msg, MESSAGE_FIELDS),
        }
        record["run"] = run_refs.get(msg.run_id) if msg.run_id else None
        record["step"] = (
            {"run": run_refs[step_runs[msg.step_id]], "position": step_positions[msg.step_id]}
            if msg.step_id
            else None
        )
        yield record


def _memories_of(ctx: Context, confined_to: dict[str, Any] | None) -> models.QuerySet:
    """The memory records a context's export holds (see `export_records`)."""
    if confined_to:
        return memories_visible(context=ctx, include_archived=True, confined_to=confined_to)
    return MemoryRecord.objects.filter(
        Q(context=ctx) | Q(context__isnull=True, scope_keys__contained_by=ctx.keys)
    )


def _embedding_records(
    ctx: Context, scoped: models.QuerySet, chunk_size: int
) -> Iterator[dict[str, Any]]:
    # The vectors in their graphs, then those waiting for it: a restore puts each into its graph.
    for table in (Embedding, EmbeddingWaiting):
        rows = (
            table.objects.filter(context=ctx, message__context=ctx)
            .select_related("message")
            .order_by("pk")
        )
        for emb in rows.iterator(chunk_size=chunk_size):
            yield {
                "type": "embedding",
                "item": "message",
                "context": ctx.keys_digest,
                "seq": emb.message.seq,
                **dump_fields(emb, EMBEDDING_FIELDS),
                "vector": _vector(emb.vector),
            }
    for record in _memory_embedding_records(scoped, chunk_size):
        del record["memory_id"]
        yield record


def _memory_embedding_records(scoped: models.QuerySet, chunk_size: int) -> Iterator[dict[str, Any]]:
    """The vectors of the `scoped` memories, each with its memory's id (`memory_id`) for the
    caller to drop before the line is written."""
    for table in (MemoryEmbedding, MemoryEmbeddingWaiting):
        rows = (
            table.objects.filter(memory_record__in=scoped)
            .select_related("memory_record")
            .order_by("pk")
        )
        for emb in rows.iterator(chunk_size=chunk_size):
            mem = emb.memory_record
            yield {
                "type": "embedding",
                "item": "memory",
                "scope_digest": mem.scope_digest,
                "content_hash": mem.content_hash,
                **dump_fields(emb, EMBEDDING_FIELDS),
                "vector": _vector(emb.vector),
                "memory_id": mem.pk,
            }


def _vector(value) -> list[float] | None:
    return None if value is None else [float(x) for x in value]


def _memory_record(mem: MemoryRecord) -> dict[str, Any]:
    record = {
        "type": "memory",
        "context": mem.context.keys_digest if mem.context_id else None,
        **dump_fields(mem, MEMORY_FIELDS),
    }
    record["source_message"] = (
        {"context": mem.source_message.context.keys_digest, "seq": mem.source_message.seq}
        if mem.source_message_id
        else None
    )
    record["source_step"] = (
        {"run": _run_ref(mem.source_step.run), "position": mem.source_step.position}
        if mem.source_step_id
        else None
    )
    return record


def export_lines(**kwargs) -> Iterator[str]:
    """The backup as JSON Lines (each line ends with a newline), its trailer last."""
    summary = Summary()
    for record in export_records(**kwargs):
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        summary.add(line.encode("utf-8"), record["type"])
        yield line
    yield json.dumps(summary.trailer(), separators=(",", ":")) + "\n"
