"""Memory lines in a backup: the stored records their keys name, and the message and step each
names as its sources, read for a chunk of lines at once (`importer`: restore's `_Importer`)."""

from __future__ import annotations

from typing import Any

from memory_app.models import MemoryRecord, Message, Step


def memory_sources(importer: Any, lines: list[tuple[MemoryRecord, dict[str, Any]]]) -> None:
    """The message and step each memory line names as its sources, each read in its
    context: the message in the one its line names, the step in the memory's own; the
    chunk's messages of a context in one read, its steps likewise."""
    messages: dict[int, set[int]] = {}
    steps: dict[int, set[tuple[int | None, int]]] = {}
    for mem, rec in lines:
        if rec.get("source_message"):
            src_ctx = importer.source_context_id(rec["source_message"]["context"])
            if src_ctx:
                messages.setdefault(src_ctx, set()).add(rec["source_message"]["seq"])
        if rec.get("source_step") and mem.context_id:
            run_pk = importer.run_id(mem.context_id, rec["source_step"]["run"])
            if run_pk is not None:
                steps.setdefault(mem.context_id, set()).add(
                    (run_pk, rec["source_step"]["position"])
                )
    found_messages = {
        (ctx_pk, seq): (pk, run_pk)
        for ctx_pk, seqs in messages.items()
        for seq, pk, run_pk in Message.objects.filter(context_id=ctx_pk, seq__in=seqs).values_list(
            "seq", "pk", "run_id"
        )
    }
    found_steps = {
        (ctx_pk, run_pk, position): (pk, run_pk)
        for ctx_pk, wanted in steps.items()
        for run_pk, position, pk in Step.objects.filter(
            context_id=ctx_pk,
            run_id__in={run for run, _ in wanted},
            position__in={position for _, position in wanted},
        ).values_list("run_id", "position", "pk")
    }
    for mem, rec in lines:
        if rec.get("source_message"):
            src = rec["source_message"]
            key = (importer.source_context_id(src["context"]), src["seq"])
            mem.source_message_id, mem.source_run_id = found_messages.get(key, (None, None))
        if rec.get("source_step") and mem.context_id:
            src = rec["source_step"]
            key = (mem.context_id, importer.run_id(mem.context_id, src["run"]), src["position"])
            mem.source_step_id, mem.source_run_id = found_steps.get(key, (None, None))


def stored_memories(mems: list[MemoryRecord]) -> dict[tuple[str, str], int]:
    """(scope digest, content hash) -> the stored record, for these records' keys, in one
    read."""
    if not mems:
        return {}
    found = MemoryRecord.objects.filter(
        scope_digest__in={m.scope_digest for m in mems},
        content_hash__in={m.content_hash for m in mems},
    ).values_list("scope_digest", "content_hash", "pk")
    wanted = {(m.scope_digest, m.content_hash) for m in mems}
    stored: dict[tuple[str, str], int] = {}
    # The first of a key's records by id, as a read of that key alone finds it.
    for scope_digest, content_hash, pk in found.order_by("pk"):
        if (scope_digest, content_hash) in wanted:
            stored.setdefault((scope_digest, content_hash), pk)
    return stored
