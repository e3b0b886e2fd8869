"""LangGraph checkpoints in and out: the saver's serialized bytes travel as base64."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from ninja import Schema
from pydantic import BeforeValidator, Field, PlainSerializer

from memory_app.schemas.fields import JsonObject, JsonValue, Seconds, Short, Text

MAX_BLOBS = 1000
MAX_WRITES = 1000


def _from_base64(value):
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be standard base64") from None


Bytes64 = Annotated[
    bytes,
    BeforeValidator(_from_base64),
    PlainSerializer(lambda b: base64.b64encode(bytes(b)).decode("ascii"), return_type=str),
]
Namespace = Short(500)
CheckpointIdText = Annotated[Short(200), Field(min_length=1)]


class Typed(Schema):
    """A value as the saver's serializer wrote it: its type name and its bytes (base64)."""

    type: Annotated[Short(100), Field(min_length=1)]
    data: Bytes64


class BlobIn(Schema):
    channel: Annotated[Short(500), Field(min_length=1)]
    version: Annotated[Short(200), Field(min_length=1)]
    value: Typed


class CheckpointPutIn(Schema):
    keys: JsonObject = Field(description="the thread's context keys")
    checkpoint_ns: Namespace = ""
    checkpoint_id: CheckpointIdText
    parent_checkpoint_id: Short(200) | None = None
    checkpoint: Typed
    channel_versions: JsonObject = Field(default_factory=dict)
    metadata: JsonObject = Field(
        default_factory=dict, description="the metadata as JSON, which `list` filters on"
    )
    metadata_typed: Typed
    blobs: list[BlobIn] = Field(default_factory=list, max_length=MAX_BLOBS)
    ts: Seconds | None = Field(None, description="the checkpoint's time (unix epoch seconds)")
    task: Text | None = Field(None, description="an input checkpoint's input, as the run's task")
    finished: bool = Field(False, description="no task runs after this checkpoint")
    answer: JsonValue = Field(None, description="the state a finished invocation ends with")


class WriteIn(Schema):
    idx: int = Field(ge=-(2**31), le=2**31 - 1)
    channel: Annotated[Short(500), Field(min_length=1)]
    value: Typed
    summary: JsonValue = Field(None, description="what the logbook shows of the value")


class WritesPutIn(Schema):
    keys: JsonObject
    checkpoint_ns: Namespace = ""
    checkpoint_id: CheckpointIdText
    task_id: Annotated[Short(200), Field(min_length=1)]
    task_path: Short(1000) = ""
    writes: list[WriteIn] = Field(max_length=MAX_WRITES)


class ConfigOut(Schema):
    thread_keys: dict
    checkpoint_ns: str
    checkpoint_id: str


class BlobOut(Schema):
    channel: str
    value: Typed


class WriteOut(Schema):
    task_id: str
    channel: str
    value: Typed


class CheckpointOut(Schema):
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: Typed
    metadata: Typed
    blobs: list[BlobOut]
    writes: list[WriteOut]
    run_id: int | None


class CheckpointPage(Schema):
    items: list[CheckpointOut]


class WrittenOut(Schema):
    written: int


class DeletedOut(Schema):
    deleted: int
