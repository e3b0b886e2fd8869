"""LangGraph checkpoints in and out: the saver's serialized bytes travel as base64."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from ninja import Schema
from pydantic import BeforeValidator, Field, PlainSerializer

from memory_app.schemas.fields import JsonObject, JsonValue, Seconds, Short, Text, _examples

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
KEYS = {"user": "ada", "langgraph_thread": "42"}
CHECKPOINT_ID = "1f0e8c9a-3b7d-6c1e-8001-9a2b3c4d5e6f"
# msgpack of an empty map: what a serializer writes is opaque to the server.
TYPED = {"type": "msgpack", "data": "gA=="}
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
    model_config = _examples(
        {
            "keys": KEYS,
            "checkpoint_ns": "",
            "checkpoint_id": CHECKPOINT_ID,
            "parent_checkpoint_id": None,
            "checkpoint": TYPED,
            "channel_versions": {"__start__": 1},
            "metadata": {"source": "input", "step": -1, "parents": {}},
            "metadata_typed": TYPED,
            "blobs": [{"channel": "__start__", "version": "1", "value": TYPED}],
            "ts": 1767225600.0,
            "task": "What's the weather in Paris?",
            "finished": False,
        }
    )
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
    model_config = _examples(
        {
            "keys": KEYS,
            "checkpoint_ns": "",
            "checkpoint_id": CHECKPOINT_ID,
            "task_id": "b20bcd16-40cb-8ecb-093f-eb76ebb8dc32",
            "task_path": "~__pregel_pull, agent",
            "writes": [{"idx": 0, "channel": "count", "value": TYPED, "summary": {"value": 1}}],
        }
    )
    keys: JsonObject
    checkpoint_ns: Namespace = ""
    checkpoint_id: CheckpointIdText
    task_id: Annotated[Short(200), Field(min_length=1)]
    task_path: Short(1000) = ""
    writes: list[WriteIn] = Field(max_length=MAX_WRITES)


class ConfigOut(Schema):
    model_config = _examples(
        {"thread_keys": KEYS, "checkpoint_ns": "", "checkpoint_id": CHECKPOINT_ID}
    )
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
    model_config = _examples(
        {
            "items": [
                {
                    "checkpoint_ns": "",
                    "checkpoint_id": CHECKPOINT_ID,
                    "parent_checkpoint_id": None,
                    "checkpoint": TYPED,
                    "metadata": TYPED,
                    "blobs": [{"channel": "__start__", "value": TYPED}],
                    "writes": [{"task_id": "b20bcd16", "channel": "count", "value": TYPED}],
                    "run_id": 3,
                }
            ]
        }
    )
    items: list[CheckpointOut]


class WrittenOut(Schema):
    model_config = _examples({"written": 1})
    written: int


class DeletedOut(Schema):
    model_config = _examples({"deleted": 4})
    deleted: int
