"""Memory lines in a backup: the stored records their keys name, and the message and step each
names as its sources, read for a chunk of lines at once (`importer`: restore's `_Importer`)."""

from __future__ import annotations

from typing import Any

from memory_app.models import MemoryRecord, Message, Step


def memory_sources(importer: Any, lines: list[tuple[MemoryRecord, dict[str, Any]]]) -> None:
    """The message and step each memory line names as its sources, each read in its
    context: the message in the one its line names, the step in the memory's own; the
    chunk's messages of a context in one read, its steps likewise."""
    # Each line's (message key, step key), resolved once: (context, seq), (context, run, position).
    keys = []
    for mem, rec in lines:
        message_key = step_key = None
        if src := rec.get("source_message"):
            message_key = (importer.source_context_id(src["context"]), src["seq"])
        if (src := rec.get("source_step")) and mem.context_id:
            run_pk = importer.run_id(mem.context_id, src["run"])
            step_key = (mem.context_id, run_pk, src["position"])
        keys.append((message_key, step_key))
    messages: dict[int, set[int]] = {}
    steps: dict[int, set[tuple[int, int]]] = {}
    for message_key, step_key in keys:
        if message_key is not None and message_key[0]:
            messages.setdefault(message_key[0], set()).add(message_key[1])
        if step_key is not None and step_key[1] is not None:
            steps.setdefault(step_key[0], set()).add(step_key[1:])
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
    for (mem, _), (message_key, step_key) in zip(lines, keys, strict=True):
        if message_key is not None:
            mem.source_message_id, mem.source_run_id = found_messages.get(message_key, (None, None))
        if step_key is not None:
            mem.source_step_id, mem.source_run_id = found_steps.get(step_key, (None, None))


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
