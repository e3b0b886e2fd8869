"""LangGraph checkpoints of a thread (a context): each checkpoint, the channel values it points
at by version, and the pending writes of its tasks.

The bytes are the saver's serializer output as it gave them (a type name and the bytes), as
LangGraph's own savers keep them: the server never decodes them. Metadata is kept twice: the
serializer's bytes, given back as written, and its JSON, which `list` filters with `@>`.

Every row carries its context in its primary key (docs/scale-out.md); `run_id` names the run
the checkpoint's invocation maps to (in the same context, no foreign key: a purged run leaves
the checkpoints of its thread resumable).
"""

from __future__ import annotations

from django.db import models

from memory_app.models.contexts import Context
from memory_app.models.shared import OrderedJSONField


class Checkpoint(models.Model):
    pk = models.CompositePrimaryKey("context_id", "checkpoint_ns", "checkpoint_id")
    context = models.ForeignKey(Context, on_delete=models.CASCADE, related_name="+", db_index=False)
    checkpoint_ns = models.CharField(max_length=500, blank=True)
    checkpoint_id = models.CharField(max_length=200)
    parent_checkpoint_id = models.CharField(max_length=200, null=True, blank=True)
    checkpoint_type = models.CharField(max_length=100)
    checkpoint_data = models.BinaryField()
    # The channel versions the checkpoint holds (as the saver sent them beside the bytes): its
    # values are the blobs of these versions.
    channel_versions = models.JSONField(default=dict)
    metadata = models.JSONField(default=dict)
    metadata_type = models.CharField(max_length=100)
    metadata_data = models.BinaryField()
    run_id = models.BigIntegerField(null=True, blank=True)
    # When the agent took it (unix epoch seconds): the next super-step's step starts here.
    ts = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"checkpoint {self.checkpoint_id} of context {self.context_id}"


class CheckpointBlob(models.Model):
    """One channel's value at one version (checkpoints name the versions they hold)."""

    pk = models.CompositePrimaryKey("context_id", "checkpoint_ns", "channel", "version")
    context = models.ForeignKey(Context, on_delete=models.CASCADE, related_name="+", db_index=False)
    checkpoint_ns = models.CharField(max_length=500, blank=True)
    channel = models.CharField(max_length=500)
    version = models.CharField(max_length=200)
    blob_type = models.CharField(max_length=100)
    blob_data = models.BinaryField()

    def __str__(self) -> str:
        return f"{self.channel}@{self.version}"


class CheckpointWrite(models.Model):
    """A pending write of a task on a checkpoint; `summary` is what the logbook shows of it."""

    pk = models.CompositePrimaryKey(
        "context_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx"
    )
    context = models.ForeignKey(Context, on_delete=models.CASCADE, related_name="+", db_index=False)
    checkpoint_ns = models.CharField(max_length=500, blank=True)
    checkpoint_id = models.CharField(max_length=200)
    task_id = models.CharField(max_length=200)
    idx = models.IntegerField()
    task_path = models.CharField(max_length=1000, blank=True, default="")
    channel = models.CharField(max_length=500)
    value_type = models.CharField(max_length=100)
    value_data = models.BinaryField()
    # The super-step's step is made from it: tool-call arguments in the order the model wrote.
    summary = OrderedJSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"write {self.task_id}/{self.idx} on {self.checkpoint_id}"
