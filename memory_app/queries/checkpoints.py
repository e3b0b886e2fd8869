"""Reads of LangGraph checkpoints: a thread's context by its exact keys, and its checkpoints
newest first with their channel values and pending writes. Every query names the context."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from memory_app.models import (
    Checkpoint,
    CheckpointBlob,
    CheckpointWrite,
    Context,
    keys_digest,
)

EMPTY = "empty"


def thread_context(*, within: QuerySet, keys: dict[str, Any]) -> Context | None:
    """The context whose keys are exactly `keys` (order-insensitive), if the caller may see it."""
    return within.filter(keys_digest=keys_digest(keys)).first()


def _typed(kind: str, data) -> dict[str, Any]:
    return {"type": kind, "data": bytes(data)}


def checkpoints_list(
    *,
    context: Context,
    checkpoint_ns: str | None,
    checkpoint_id: str | None = None,
    before: str | None = None,
    metadata_filter: dict | None = None,
    limit: int,
) -> list[dict[str, Any]]:
    """A thread's checkpoints, newest first (LangGraph's ids sort by time), each with the channel
    values its versions name and its pending writes in the order they were written."""
    rows = Checkpoint.objects.filter(context_id=context.pk)
    if checkpoint_ns is not None:
        rows = rows.filter(checkpoint_ns=checkpoint_ns)
    if checkpoint_id is not None:
        rows = rows.filter(checkpoint_id=checkpoint_id)
    if before is not None:
        rows = rows.filter(checkpoint_id__lt=before)
    if metadata_filter:
        rows = rows.filter(metadata__contains=metadata_filter)
    rows = rows.order_by("-checkpoint_id", "checkpoint_ns")
    checkpoints = list(rows[:limit])
    if not checkpoints:
        return []
    wanted = Q(pk__in=[])
    for cp in checkpoints:
        for channel, version in cp.channel_versions.items():
            wanted |= Q(checkpoint_ns=cp.checkpoint_ns, channel=channel, version=str(version))
    blobs = {
        (b.checkpoint_ns, b.channel, b.version): b
        for b in CheckpointBlob.objects.filter(Q(context_id=context.pk) & wanted)
    }
    writes: dict[tuple[str, str], list[CheckpointWrite]] = {}
    for w in CheckpointWrite.objects.filter(
        context_id=context.pk,
        checkpoint_id__in=[cp.checkpoint_id for cp in checkpoints],
    ).order_by("checkpoint_ns", "checkpoint_id", "task_path", "task_id", "idx"):
        writes.setdefault((w.checkpoint_ns, w.checkpoint_id), []).append(w)
    out = []
    for cp in checkpoints:
        found = [
            (channel, blobs.get((cp.checkpoint_ns, channel, str(version))))
            for channel, version in cp.channel_versions.items()
        ]
        out.append(
            {
                "checkpoint_ns": cp.checkpoint_ns,
                "checkpoint_id": cp.checkpoint_id,
                "parent_checkpoint_id": cp.parent_checkpoint_id,
                "checkpoint": _typed(cp.checkpoint_type, cp.checkpoint_data),
                "metadata": _typed(cp.metadata_type, cp.metadata_data),
                "blobs": [
                    {"channel": channel, "value": _typed(b.blob_type, b.blob_data)}
                    for channel, b in found
                    if b is not None and b.blob_type != EMPTY
                ],
                "writes": [
                    {
                        "task_id": w.task_id,
                        "channel": w.channel,
                        "value": _typed(w.value_type, w.value_data),
                    }
                    for w in writes.get((cp.checkpoint_ns, cp.checkpoint_id), [])
                ],
                "run_id": cp.run_id,
            }
        )
    return out
