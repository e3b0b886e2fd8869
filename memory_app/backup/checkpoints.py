"""LangGraph checkpoints in a backup: a thread's checkpoints, channel values and pending writes
are rows of its context, exported with it after its messages, so a restored thread resumes
where it stood rather than starting anew.

Each row's natural key is its primary key with the context's digest for the context's id: a
checkpoint (context, namespace, checkpoint id), a channel value (context, namespace, channel,
version), a pending write (context, namespace, checkpoint id, task id, index). The saver's
bytes travel as base64 text and come back byte for byte; a checkpoint names the run of its
invocation by the run's ref (a run purged since leaves it without one, as it stood).
Checkpoints are restored as rows, not put again: the runs and steps they made are lines of
their own, so a restore makes no second run or step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import models

from memory_app.backup.format import CHECKPOINT_KIND_FIELDS, dump_fields, load_fields
from memory_app.errors import BackupFormatError
from memory_app.models import Checkpoint, CheckpointBlob, CheckpointWrite, Context

MODELS: dict[str, type[models.Model]] = {
    "checkpoint": Checkpoint,
    "checkpoint_blob": CheckpointBlob,
    "checkpoint_write": CheckpointWrite,
}
# Each kind's primary key after the context, in the order export writes the rows.
NATURAL_KEYS = {
    "checkpoint": ("checkpoint_ns", "checkpoint_id"),
    "checkpoint_blob": ("checkpoint_ns", "channel", "version"),
    "checkpoint_write": ("checkpoint_ns", "checkpoint_id", "task_id", "idx"),
}
_STAMPS = {"checkpoint": ["created_at"], "checkpoint_blob": [], "checkpoint_write": ["created_at"]}


def checkpoint_records(
    ctx: Context, run_refs: dict[int, dict], chunk_size: int
) -> Iterator[dict[str, Any]]:
    """A context's checkpoints, then its channel values, then its pending writes."""
    for kind, model in MODELS.items():
        rows = model.objects.filter(context=ctx).order_by(*NATURAL_KEYS[kind])
        for row in rows.iterator(chunk_size=chunk_size):
            record = {
                "type": kind,
                "context": ctx.keys_digest,
                **dump_fields(row, CHECKPOINT_KIND_FIELDS[kind]),
            }
            if kind == "checkpoint":
                record["run"] = run_refs.get(row.run_id) if row.run_id is not None else None
            yield record


def import_checkpoints(importer: Any, kind: str, records: list[dict[str, Any]]) -> None:
    """One chunk of lines of one checkpoint kind (`importer`: restore's `_Importer`), only into
    contexts the file defines; a checkpoint's run only one of its context."""
    model = MODELS[kind]
    rows = []
    for rec in records:
        ctx_pk = importer.context_id(rec["context"])
        row = model(context_id=ctx_pk, **load_fields(rec, CHECKPOINT_KIND_FIELDS[kind]))
        if kind == "checkpoint" and rec.get("run") is not None:
            row.run_id = importer.run_id(ctx_pk, rec["run"])
            if row.run_id is None:
                raise BackupFormatError("a checkpoint refers to a run that is not in the backup")
        rows.append(row)
    names = ("context_id", *NATURAL_KEYS[kind])
    new = importer.not_stored(model, rows, names, narrow=names[2])
    importer.insert(model, new, _STAMPS[kind])
    importer.result.count(f"{kind}s", len(new), len(rows) - len(new))
