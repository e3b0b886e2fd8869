"""Writes of LangGraph checkpoints (a thread is a context): put a checkpoint with the channel
values it brings, put a task's pending writes, delete a thread's checkpoints.

An invocation is a run of the context, written through `services.runs`: an input checkpoint
(`source` "input") opens it, each later checkpoint of the root namespace makes the super-step
that led to it one step (from the pending writes of its parent), and a checkpoint after which
no task runs finishes it; a task's error write fails it. A resumed interrupt continues its run;
going on from a checkpoint of a finished run (a fork, a replay, a retry) opens a new one.
A checkpoint put again (same id) is replaced, as LangGraph's savers do, and makes no second run
or step: runs and steps carry client ids named after the checkpoint.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from memory_app.db import lock_contexts
from memory_app.interop.langgraph import ERROR, error_item, superstep_item, tool_outputs
from memory_app.models import (
    Checkpoint,
    CheckpointBlob,
    CheckpointWrite,
    Context,
    Run,
    RunStatus,
    ToolCall,
)
from memory_app.services import runs as runs_service

FRAMEWORK = "langgraph"
TASK_CHARS = 10_000


def config_of(thread_keys: dict, checkpoint_ns: str, checkpoint_id: str) -> dict[str, Any]:
    """The config LangGraph resumes from: its thread is the context's `langgraph_thread` key."""
    return {
        "configurable": {
            "thread_id": thread_keys.get("langgraph_thread"),
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _moment(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, tz=UTC) if ts is not None else None


# One function for the whole put: the checkpoint, its blobs and its run's step are written in
# one transaction, so a checkpoint is never stored without the logbook entry it makes.
def checkpoint_put(
    *,
    context: Context,
    checkpoint_ns: str,
    checkpoint_id: str,
    parent_checkpoint_id: str | None,
    checkpoint: tuple[str, bytes],
    channel_versions: dict[str, Any],
    metadata: dict[str, Any],
    metadata_typed: tuple[str, bytes],
    blobs: list[tuple[str, str, str, bytes]],
    ts: float | None = None,
    task: str | None = None,
    finished: bool = False,
    answer: Any = None,
) -> Checkpoint:
    with transaction.atomic():
        # One writer of a thread at a time: a checkpoint and the writes on its parent (saved
        # from LangGraph's thread pool at once) each see what the other stored.
        lock_contexts([context.pk])
        stored = (
            Checkpoint.objects.select_for_update()
            .filter(context_id=context.pk, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id)
            .first()
        )
        row = stored or Checkpoint(
            context=context, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id
        )
        row.parent_checkpoint_id = parent_checkpoint_id
        row.checkpoint_type, row.checkpoint_data = checkpoint
        row.channel_versions = channel_versions
        row.metadata = metadata
        row.metadata_type, row.metadata_data = metadata_typed
        row.ts = ts
        CheckpointBlob.objects.bulk_create(
            [
                CheckpointBlob(
                    context=context,
                    checkpoint_ns=checkpoint_ns,
                    channel=channel,
                    version=version,
                    blob_type=kind,
                    blob_data=data,
                )
                for channel, version, kind, data in blobs
            ],
            ignore_conflicts=True,
        )
        if stored is None and checkpoint_ns == "":
            row.run_id = _logbook(
                context=context,
                row=row,
                ts=ts,
                task=task,
                finished=finished,
                answer=answer,
            )
        if stored is None:
            row.save(force_insert=True)
        else:
            row.save()
        if stored is None and checkpoint_ns == "":
            # LangGraph saves writes and checkpoints from a thread pool: a task's error may
            # arrive before the checkpoint it ran from.
            early = list(
                CheckpointWrite.objects.filter(
                    context_id=context.pk, checkpoint_ns="", checkpoint_id=checkpoint_id
                )
            )
            for task_id in dict.fromkeys(w.task_id for w in early if w.channel == ERROR):
                _failed(context=context, checkpoint=row, task_id=task_id, rows=early)
    return row


def _logbook(
    *,
    context: Context,
    row: Checkpoint,
    ts: float | None,
    task: str | None,
    finished: bool,
    answer: Any,
) -> int | None:
    """The run of this checkpoint's invocation, with the step its super-step made."""
    source = row.metadata.get("source")
    parent = None
    if row.parent_checkpoint_id:
        parent = Checkpoint.objects.filter(
            context_id=context.pk, checkpoint_ns="", checkpoint_id=row.parent_checkpoint_id
        ).first()
    thread_keys = context.keys
    if source == "input":
        run, _ = runs_service.run_create(
            context=context,
            client_id=f"langgraph:{row.checkpoint_id}",
            task=(task or "")[:TASK_CHARS],
            framework=FRAMEWORK,
            metadata={"langgraph": config_of(thread_keys, "", row.checkpoint_id)},
            started_at=_moment(ts),
        )
    elif parent is not None and parent.run_id is not None:
        run = Run.objects.filter(context_id=context.pk, pk=parent.run_id).first()
        if run is not None and source in ("loop", "fork") and run.status != RunStatus.RUNNING:
            run = _forked(context=context, run=run, row=row, parent=parent, ts=ts)
    else:
        return None
    if run is None:
        return None
    if source == "loop" and parent is not None:
        runs_service.steps_append(run=run, items=[_superstep(context, parent=parent, child=row)])
        _answer_tool_calls(context, run, parent)
    if finished and run.status == RunStatus.RUNNING:
        runs_service.run_finish(
            run=run, status=RunStatus.SUCCESS, final_answer=answer, finished_at=_moment(ts)
        )
    return run.pk


def _superstep(context: Context, *, parent: Checkpoint, child: Checkpoint) -> dict[str, Any]:
    """The step of the super-step from `parent` to `child`: the pending writes on `parent`."""
    step = child.metadata.get("step")
    return superstep_item(
        writes=_writes_on(context, parent.checkpoint_id),
        step=step if isinstance(step, int) else None,
        client_id=f"langgraph:{child.checkpoint_id}",
        payload={
            "checkpoint": config_of(context.keys, "", child.checkpoint_id),
            "parent_checkpoint": config_of(context.keys, "", parent.checkpoint_id),
        },
        start_time=parent.ts,
        end_time=child.ts,
    )


def _writes_on(context: Context, checkpoint_id: str) -> list[dict[str, Any]]:
    return list(
        CheckpointWrite.objects.filter(
            context_id=context.pk, checkpoint_ns="", checkpoint_id=checkpoint_id
        )
        .order_by("task_path", "task_id", "idx")
        .values("task_path", "channel", "summary")
    )


def _answer_tool_calls(context: Context, run: Run, parent: Checkpoint) -> None:
    """A tool's answer comes a super-step after the call that asked for it."""
    for call_id, text in tool_outputs(_writes_on(context, parent.checkpoint_id)).items():
        ToolCall.objects.filter(
            context_id=context.pk,
            step__context_id=context.pk,
            step__run_id=run.pk,
            call_id=call_id,
            output__isnull=True,
        ).update(output=text)


def _late_writes(context: Context, checkpoint_id: str) -> None:
    """Writes on a checkpoint whose next checkpoint is already stored (they are saved from a
    thread pool, in no set order): the super-step's step is written again with them."""
    child = (
        Checkpoint.objects.filter(
            context_id=context.pk,
            checkpoint_ns="",
            parent_checkpoint_id=checkpoint_id,
            metadata__source="loop",
            run_id__isnull=False,
        )
        .order_by("checkpoint_id")
        .first()
    )
    parent = Checkpoint.objects.filter(
        context_id=context.pk, checkpoint_ns="", checkpoint_id=checkpoint_id
    ).first()
    if child is None or parent is None:
        return
    run = Run.objects.filter(context_id=context.pk, pk=child.run_id).first()
    if run is None:
        return
    item = _superstep(context, parent=parent, child=child)
    if runs_service.step_replace(run=run, client_id=item["client_id"], item=item) is None:
        return
    _answer_tool_calls(context, run, parent)
    if run.status != RunStatus.RUNNING:
        # Its token totals are the sums over its steps, one of which changed.
        runs_service.run_finish(
            run=run,
            status=run.status,
            final_answer=run.final_answer,
            finished_at=run.finished_at,
        )


def _forked(*, context: Context, run: Run, row: Checkpoint, parent: Checkpoint, ts) -> Run:
    """Going on from a checkpoint of a finished invocation (a fork, a replay, a retry after an
    error) is an invocation of its own: a new run, with the task of the one it forks."""
    forked, _ = runs_service.run_create(
        context=context,
        client_id=f"langgraph:{row.checkpoint_id}",
        task=run.task,
        framework=FRAMEWORK,
        metadata={
            "langgraph": config_of(context.keys, "", row.checkpoint_id),
            "forked_from": {
                "run_id": run.pk,
                "checkpoint": config_of(context.keys, "", parent.checkpoint_id),
            },
        },
        started_at=_moment(parent.ts),
    )
    return forked


def writes_put(
    *,
    context: Context,
    checkpoint_ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    writes: list[tuple[int, str, str, bytes, Any]],
) -> int:
    """Store a task's pending writes; returns how many rows were written. As LangGraph's savers
    do: writes to its special channels (negative indexes) replace those stored, other writes
    already stored for (task, index) are kept as they were."""
    rows = [
        CheckpointWrite(
            context=context,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            task_id=task_id,
            idx=idx,
            task_path=task_path,
            channel=channel,
            value_type=kind,
            value_data=data,
            summary=summary,
        )
        for idx, channel, kind, data, summary in writes
    ]
    with transaction.atomic():
        lock_contexts([context.pk])
        if rows and all(r.idx < 0 for r in rows):
            CheckpointWrite.objects.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=["context", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                update_fields=["task_path", "channel", "value_type", "value_data", "summary"],
            )
        else:
            CheckpointWrite.objects.bulk_create(rows, ignore_conflicts=True)
        if checkpoint_ns == "":
            cp = Checkpoint.objects.filter(
                context_id=context.pk, checkpoint_ns="", checkpoint_id=checkpoint_id
            ).first()
            if cp is not None and any(r.channel == ERROR for r in rows):
                _failed(context=context, checkpoint=cp, task_id=task_id, rows=rows)
            _late_writes(context, checkpoint_id)
    return len(rows)


def _failed(*, context: Context, checkpoint: Checkpoint, task_id: str, rows) -> None:
    """A task raised: the running run gets the error as a step and fails; an error written
    again (a retry that failed the same way) replaces its step."""
    if checkpoint.run_id is None:
        return
    run = Run.objects.filter(context_id=context.pk, pk=checkpoint.run_id).first()
    if run is None:
        return
    item = error_item(
        writes=[
            {"task_path": r.task_path, "channel": r.channel, "summary": r.summary}
            for r in rows
            if r.task_id == task_id
        ],
        client_id=f"langgraph:{checkpoint.checkpoint_id}:error:{task_id}",
        payload={"parent_checkpoint": config_of(context.keys, "", checkpoint.checkpoint_id)},
    )
    if run.status == RunStatus.RUNNING:
        runs_service.steps_append(run=run, items=[item])
        runs_service.run_finish(run=run, status=RunStatus.FAILED)
    else:
        runs_service.step_replace(run=run, client_id=item["client_id"], item=item)


def thread_delete(*, context: Context) -> int:
    """Delete a thread's checkpoints, channel values and pending writes (its runs stay in the
    logbook). Returns how many checkpoints went."""
    with transaction.atomic():
        CheckpointWrite.objects.filter(context_id=context.pk).delete()
        CheckpointBlob.objects.filter(context_id=context.pk).delete()
        deleted, _ = Checkpoint.objects.filter(context_id=context.pk).delete()
    return deleted
