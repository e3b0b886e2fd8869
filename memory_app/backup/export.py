"""Export: the backup's records, referents first, read with server-side cursors in chunks."""

from __future__ import annotations

import itertools
import json
from collections.abc import Generator, Iterable, Iterator
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
        # A key-subset memory falls under several contexts; the file holds it once.
        fresh = _not_in(scoped.order_by("pk").iterator(chunk_size=chunk_size), exported_memories)
        written = yield from _memory_records(fresh, ctx, run_refs, chunk_size)
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
    fresh = (m for m in rest.order_by("pk").iterator(chunk_size=chunk_size) if m.pk not in exported)
    written = yield from _memory_records(fresh, None, {}, chunk_size)
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
    # The tool calls are read in the steps' context too (on Citus, its shard alone).
    tool_calls = ToolCall.objects.filter(context=ctx).order_by("position")
    steps = (
        Step.objects.filter(context=ctx)
        .order_by("run_id", "position")
        .prefetch_related(models.Prefetch("tool_calls", queryset=tool_calls))
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
    steps = {pk: (run, position) for pk, run, position in _steps_of(ctx.pk)}
    for msg in Message.objects.filter(context=ctx).order_by("seq").iterator(chunk_size=chunk_size):
        record = {
            "type": "message",
            "context": ctx.keys_digest,
            **dump_fields(msg, MESSAGE_FIELDS),
        }
        record["run"] = _late_run_ref(ctx, run_refs, msg.run_id) if msg.run_id else None
        record["step"] = None
        if msg.step_id:
            if msg.step_id not in steps:
                # Written after the export read the context's steps (no snapshot holds them).
                for pk, run, position in _steps_of(ctx.pk, [msg.step_id]):
                    steps[pk] = (run, position)
            run_pk, position = steps[msg.step_id]
            record["step"] = {"run": _late_run_ref(ctx, run_refs, run_pk), "position": position}
        yield record


def _late_run_ref(ctx: Context, run_refs: dict[int, dict], run_pk: int) -> dict[str, Any]:
    """The reference of a run of the context: written already, or made since the export wrote
    the context's runs (read now, and kept)."""
    if run_pk not in run_refs:
        run_refs[run_pk] = _run_ref(
            Run.objects.only("client_id", "created_at").get(context_id=ctx.pk, pk=run_pk)
        )
    return run_refs[run_pk]


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


def _steps_of(context_id: int, pks: Iterable[int] | None = None) -> list[tuple[int, int, int]]:
    """(step, its run, its position) of the context's steps (those of `pks` only, when given)."""
    steps = Step.objects.filter(context_id=context_id)
    if pks is not None:
        steps = steps.filter(pk__in=pks)
    return list(steps.values_list("pk", "run_id", "position"))


def _not_in(memories: Iterator[MemoryRecord], exported: set[int]) -> Iterator[MemoryRecord]:
    """The memories not in `exported`, each added to it as it passes."""
    for mem in memories:
        if mem.pk not in exported:
            exported.add(mem.pk)
            yield mem


def _memory_records(
    memories: Iterator[MemoryRecord],
    ctx: Context | None,
    run_refs: dict[int, dict],
    chunk_size: int,
) -> Generator[dict[str, Any], None, set[int]]:
    """The memory lines of `memories` (those of `ctx`'s export, whose runs `run_refs` holds, or
    of no context), their sources read a chunk at a time; answers the memories written."""
    written: set[int] = set()
    while chunk := list(itertools.islice(memories, chunk_size)):
        sources = _Sources(ctx, run_refs, chunk)
        for mem in chunk:
            written.add(mem.pk)
            yield _memory_record(mem, ctx, sources)
    return written


class _Sources:
    """The messages and steps a chunk of memories names as sources, by natural key. Each is
    read in the exported context first (on Citus, its shard alone), where the write path puts
    the sources of its memories; a source it does not hold (a key-subset memory's in another
    context, one an import or an admin linked) is read by its id, its context unknown."""

    def __init__(self, ctx: Context | None, run_refs: dict[int, dict], chunk: list) -> None:
        self.messages: dict[int, dict[str, Any]] = {}  # message -> {"context", "seq"}
        self.steps: dict[int, dict[str, Any]] = {}  # step -> {"run", "position"}
        message_ids = {m.source_message_id for m in chunk} - {None}
        step_ids = {m.source_step_id for m in chunk} - {None}
        if ctx is not None and message_ids:
            found = Message.objects.filter(context_id=ctx.pk, pk__in=message_ids)
            for pk, seq in found.values_list("pk", "seq"):
                self.messages[pk] = {"context": ctx.keys_digest, "seq": seq}
        if ctx is not None and step_ids:
            for pk, run_pk, position in _steps_of(ctx.pk, step_ids):
                run = _late_run_ref(ctx, run_refs, run_pk)
                self.steps[pk] = {"run": run, "position": position}
        self._elsewhere(message_ids - set(self.messages), step_ids - set(self.steps))

    def _elsewhere(self, message_ids: set[int], step_ids: set[int]) -> None:
        """Sources outside the exported context, by id (a memory keeps no context of its
        sources): a message with its context's digest (joined on the context, which Citus
        keeps on the message's shard), a step with its run read in the step's context."""
        if message_ids:
            found = Message.objects.filter(pk__in=message_ids)
            for pk, digest, seq in found.values_list("pk", "context__keys_digest", "seq"):
                self.messages[pk] = {"context": digest, "seq": seq}
        if not step_ids:
            return
        by_context: dict[int, list[tuple[int, int, int]]] = {}
        found = Step.objects.filter(pk__in=step_ids)
        for pk, context_id, run_pk, position in found.values_list(
            "pk", "context_id", "run_id", "position"
        ):
            by_context.setdefault(context_id, []).append((pk, run_pk, position))
        for context_id, steps in by_context.items():
            runs = Run.objects.filter(context_id=context_id, pk__in={r for _, r, _ in steps})
            refs = {run.pk: _run_ref(run) for run in runs.only("pk", "client_id", "created_at")}
            for pk, run_pk, position in steps:
                self.steps[pk] = {"run": refs[run_pk], "position": position}


def _memory_record(mem: MemoryRecord, ctx: Context | None, sources: _Sources) -> dict[str, Any]:
    if mem.context_id is None:
        digest = None
    elif ctx is not None and mem.context_id == ctx.pk:
        digest = ctx.keys_digest  # a context's own memory, exported with it
    else:
        digest = mem.context.keys_digest
    record = {"type": "memory", "context": digest, **dump_fields(mem, MEMORY_FIELDS)}
    record["source_message"] = sources.messages.get(mem.source_message_id)
    record["source_step"] = sources.steps.get(mem.source_step_id)
    return record


def export_lines(**kwargs) -> Iterator[str]:
    """The backup as JSON Lines (each line ends with a newline), its trailer last."""
    summary = Summary()
    for record in export_records(**kwargs):
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        summary.add(line.encode("utf-8"), record["type"])
        yield line
    yield json.dumps(summary.trailer(), separators=(",", ":")) + "\n"
