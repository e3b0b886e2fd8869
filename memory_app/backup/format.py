"""The backup format: its header constants, the fields each record carries, and the checks a
line passes before anything of it is stored (see the package docstring for the records)."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db import connection, models

from memory_app.errors import BackupFormatError
from memory_app.models import (
    Checkpoint,
    CheckpointBlob,
    CheckpointWrite,
    Comment,
    Context,
    Embedding,
    Label,
    MemoryRecord,
    MemoryVersion,
    Message,
    Run,
    Score,
    ScoreKind,
    Step,
    ToolCall,
)

FORMAT = "agentmemory-backup"
# Version 3 adds scores, labels, comments, checkpoints and memory versions; version 2 ends with
# a trailer (memory_app.backup.lines) and holds only the first six kinds; version 1 files had
# no trailer. Import reads all three.
VERSION = 3
# The record kinds after the header, in the order export writes a context's records.
KINDS_V2 = ("context", "run", "step", "message", "memory", "embedding")
KINDS = (
    "context",
    "run",
    "step",
    "message",
    "score",
    "label",
    "comment",
    "checkpoint",
    "checkpoint_blob",
    "checkpoint_write",
    "memory",
    "memory_version",
    "embedding",
)
CHUNK = 1000


def kinds_of(version: Any) -> tuple[str, ...]:
    """The record kinds a file of this header version may hold (a trailer counts these)."""
    return KINDS if version == VERSION else KINDS_V2


# --- field handling -----------------------------------------------------------------------------


def _plain_fields(model: type[models.Model], *, skip: tuple[str, ...] = ()) -> list[models.Field]:
    """Concrete, stored, non-relational fields except the primary key (and `skip`)."""
    return [
        f
        for f in model._meta.concrete_fields
        if not f.primary_key
        and not f.is_relation
        and not isinstance(f, models.GeneratedField)
        and f.name not in skip
    ]


# search_seq describes this database's full-text side table, not the context: an imported
# context starts at 0 and the indexer parses its messages (memory_app.search.fulltext).
CONTEXT_FIELDS = _plain_fields(Context, skip=("search_seq",))
RUN_FIELDS = _plain_fields(Run)
STEP_FIELDS = _plain_fields(Step)
TOOL_CALL_FIELDS = _plain_fields(ToolCall)
MESSAGE_FIELDS = _plain_fields(Message)
MEMORY_FIELDS = _plain_fields(MemoryRecord)
# `indexed` describes this database's HNSW graph, not the vector: imported rows go into it.
# A memory vector (`MemoryEmbedding`) and a vector waiting for its graph have the same plain
# columns: one line format for all.
EMBEDDING_FIELDS = _plain_fields(Embedding, skip=("vector", "indexed"))
# A score's, label's or comment's target is a reference beside these (see check_record).
SCORE_FIELDS = _plain_fields(Score)
LABEL_FIELDS = _plain_fields(Label)
COMMENT_FIELDS = _plain_fields(Comment)
# `run_id` is a run's primary key (no foreign key): the line names the run by its ref instead.
CHECKPOINT_FIELDS = _plain_fields(Checkpoint, skip=("run_id",))
CHECKPOINT_BLOB_FIELDS = _plain_fields(CheckpointBlob)
CHECKPOINT_WRITE_FIELDS = _plain_fields(CheckpointWrite)
# The user, API key and audit event of a version are rows a backup does not carry, and its
# `actor` (the dashboard user or key that made the change) is not written either: the importer
# replaces it, and a file's reader has no need of who edited what.
MEMORY_VERSION_FIELDS = _plain_fields(MemoryVersion, skip=("actor",))


def dump_fields(obj: models.Model, fields: list[models.Field]) -> dict[str, Any]:
    """A row's `fields` as a line carries them (date and time as ISO 8601 text)."""
    out = {}
    for f in fields:
        value = getattr(obj, f.attname)
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(f, models.BinaryField) and value is not None:
            # A saver's serialized bytes: JSON has no bytes, so they travel as base64 text.
            value = base64.b64encode(bytes(value)).decode("ascii")
        out[f.name] = value
    return out


def load_fields(data: dict[str, Any], fields: list[models.Field]) -> dict[str, Any]:
    """A line's `fields` as model keyword arguments; fields the line leaves out are left out."""
    out = {}
    for f in fields:
        if f.name not in data:
            continue
        value = data[f.name]
        if isinstance(f, models.DateTimeField) and isinstance(value, str):
            value = datetime.fromisoformat(value)
        elif isinstance(f, models.BinaryField) and isinstance(value, str):
            value = base64.b64decode(value, validate=True)
        out[f.attname] = value
    return out


def _field_error(f: models.Field, value: Any) -> str | None:
    """Why `value` cannot be stored in `f` as a backup writes it (None: it can)."""
    if value is None:
        return None if f.null else "cannot be null"
    if isinstance(f, models.JSONField):
        # Objects by default (keys, metadata, scope keys) are read as objects everywhere.
        return "must be an object" if f.default is dict and not isinstance(value, dict) else None
    if isinstance(f, ArrayField):
        ok = isinstance(value, list) and all(isinstance(v, str) and "\x00" not in v for v in value)
        return None if ok else "must be a list of strings"
    if isinstance(f, models.BooleanField):
        return None if isinstance(value, bool) else "must be true or false"
    if isinstance(f, models.IntegerField):
        if not isinstance(value, int) or isinstance(value, bool):
            return "must be an integer"
        # The column's range, so a value past it is the file's error, not the database's.
        low, high = connection.ops.integer_field_range(f.get_internal_type())
        if (low is not None and value < low) or (high is not None and value > high):
            return f"must be between {low} and {high}"
        return None
    if isinstance(f, models.FloatField):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else "must be a number"
    if isinstance(f, models.DateTimeField):
        return None if _is_datetime(value) else "must be an ISO 8601 date and time"
    if isinstance(f, models.BinaryField):
        return None if _is_base64(value) else "must be base64 text"
    if isinstance(f, models.CharField | models.TextField):
        if not isinstance(value, str) or "\x00" in value:
            return "must be a string without NUL characters"
        if f.max_length is not None and len(value) > f.max_length:
            return f"is longer than {f.max_length} characters"
    if f.choices and value not in {c for c, _ in f.flatchoices}:
        return f"must be one of {sorted(c for c, _ in f.flatchoices)}"
    return None


def _is_datetime(value: Any) -> bool:
    try:
        datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return False
    return True


def _is_base64(value: Any) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except (TypeError, ValueError, binascii.Error):
        return False
    return isinstance(value, str)


def _check_fields(
    rec: dict[str, Any],
    fields: list[models.Field],
    what: str,
    *,
    derived: tuple[str, ...] = (),
    required: tuple[str, ...] = (),
) -> None:
    """`derived`: fields the importer sets whatever the line says, so a line may omit them;
    `required`: fields a line needs though the column has a default (a natural key's part)."""
    for f in fields:
        if f.name not in rec:
            automatic = getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
            # Digests and hashes (not editable) are derived on import, so a line may omit them.
            optional = f.null or f.has_default() or automatic or not f.editable
            if f.name in required or not (optional or f.name in derived):
                raise BackupFormatError(f"a {what} record needs {f.name}")
            continue
        why = _field_error(f, rec[f.name])
        if why:
            raise BackupFormatError(f"{what} {f.name} {why}")


def _check_ref(value: Any, what: str, shape: dict[str, Any], *, optional: bool = False) -> None:
    """A reference (`shape`: key -> type, or a tuple of types) as export writes it."""
    if value is None and optional:
        return
    if not isinstance(value, dict) or not all(
        isinstance(value.get(k), t) and not (isinstance(value.get(k), bool) and t is int)
        for k, t in shape.items()
    ):
        raise BackupFormatError(f"{what} must be an object with {', '.join(shape)}")


RUN_REF = {"client_id": (str, type(None)), "created_at": str}


def _check_run_ref(value: Any, what: str, *, optional: bool = False) -> None:
    _check_ref(value, what, RUN_REF, optional=optional)
    if value is not None and not _is_datetime(value["created_at"]):
        raise BackupFormatError(f"{what}.created_at must be an ISO 8601 date and time")


ANNOTATION_FIELDS = {"score": SCORE_FIELDS, "label": LABEL_FIELDS, "comment": COMMENT_FIELDS}
# A score's and a comment's natural key ends with the instant it was written: a line without one
# would match nothing stored and go in again on every import.
ANNOTATION_REQUIRED = {"score": ("created_at",), "label": (), "comment": ("created_at",)}
CHECKPOINT_KIND_FIELDS = {
    "checkpoint": CHECKPOINT_FIELDS,
    "checkpoint_blob": CHECKPOINT_BLOB_FIELDS,
    "checkpoint_write": CHECKPOINT_WRITE_FIELDS,
}


def _check_annotation(kind: str, rec: dict[str, Any]) -> None:
    """A score, label or comment: its context and exactly one target, a run (its ref), a step
    ((run ref, position)) or a message (its seq in the line's context)."""
    _check_ref(rec, f"a {kind} record", {"context": str})
    targets = [t for t in ("run", "step", "message") if rec.get(t) is not None]
    if len(targets) != 1:
        raise BackupFormatError(f"a {kind} names one target: a run, a step or a message")
    if targets == ["run"]:
        _check_run_ref(rec["run"], f"a {kind}'s run")
    elif targets == ["step"]:
        _check_ref(rec["step"], f"a {kind}'s step", {"run": dict, "position": int})
        _check_run_ref(rec["step"]["run"], f"a {kind}'s step run")
    else:
        _check_ref(rec, f"a {kind} record", {"message": int})
    # The author is the importer's (see memory_app.backup.annotations).
    _check_fields(
        rec, ANNOTATION_FIELDS[kind], kind, derived=("author",), required=ANNOTATION_REQUIRED[kind]
    )
    if kind == "score":
        # The value's column is the kind's (the table's check constraint says the same).
        number, category = rec.get("number"), rec.get("category")
        fits = {
            ScoreKind.NUMERIC: number is not None and category is None,
            ScoreKind.BOOLEAN: number in (0, 1) and category is None,
            ScoreKind.CATEGORICAL: number is None and category is not None,
        }
        if not fits.get(rec.get("kind")):
            raise BackupFormatError(f"a {rec.get('kind')} score's value is not of its kind")


def _check_checkpoint(kind: str, rec: dict[str, Any]) -> None:
    _check_ref(rec, f"a {kind} record", {"context": str})
    if kind == "checkpoint":
        _check_run_ref(rec.get("run"), "a checkpoint's run", optional=True)
    _check_fields(rec, CHECKPOINT_KIND_FIELDS[kind], kind.replace("_", " "))


def _check_memory_version(rec: dict[str, Any]) -> None:
    _check_ref(rec, "a memory version", {"scope_digest": str, "content_hash": str})
    _check_fields(rec, MEMORY_VERSION_FIELDS, "memory version")
    if rec["version"] < 1:
        raise BackupFormatError("a memory version's number starts at 1")


def check_record(kind: str, rec: dict[str, Any]) -> None:
    """Refuse a record whose fields or references do not have the types export writes, before
    anything is stored (a string for a number used to reach the database as a server error)."""
    if kind in ANNOTATION_FIELDS:
        _check_annotation(kind, rec)
    elif kind in CHECKPOINT_KIND_FIELDS:
        _check_checkpoint(kind, rec)
    elif kind == "memory_version":
        _check_memory_version(rec)
    elif kind == "context":
        _check_fields(rec, CONTEXT_FIELDS, "context")
    elif kind == "run":
        _check_ref(rec, "a run record", {"context": str})
        _check_run_ref(rec.get("ref"), "a run's ref")
        _check_fields(rec, RUN_FIELDS, "run")
    elif kind == "step":
        _check_run_ref(rec.get("run"), "a step's run")
        _check_fields(rec, STEP_FIELDS, "step")
        calls = rec.get("tool_calls", [])
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise BackupFormatError("a step's tool_calls must be a list of objects")
        for call in calls:
            _check_fields(call, TOOL_CALL_FIELDS, "tool call")
    elif kind == "message":
        _check_ref(rec, "a message record", {"context": str})
        _check_run_ref(rec.get("run"), "a message's run", optional=True)
        _check_ref(
            rec.get("step"), "a message's step", {"run": dict, "position": int}, optional=True
        )
        if rec.get("step") is not None:
            _check_run_ref(rec["step"]["run"], "a message's step run")
        _check_fields(rec, MESSAGE_FIELDS, "message")
    elif kind == "memory":
        _check_ref(rec, "a memory record", {"context": (str, type(None))})
        _check_ref(
            rec.get("source_message"),
            "a memory's source_message",
            {"context": str, "seq": int},
            optional=True,
        )
        _check_ref(
            rec.get("source_step"),
            "a memory's source_step",
            {"run": dict, "position": int},
            optional=True,
        )
        if rec.get("source_step") is not None:
            _check_run_ref(rec["source_step"]["run"], "a memory's source_step run")
        _check_fields(rec, MEMORY_FIELDS, "memory")
    elif kind == "embedding":
        if rec.get("item") == "message":
            _check_ref(rec, "a message embedding", {"context": str, "seq": int})
        elif rec.get("item") == "memory":
            _check_ref(rec, "a memory embedding", {"scope_digest": str, "content_hash": str})
        else:
            raise BackupFormatError("an embedding's item must be 'message' or 'memory'")
        vector = rec.get("vector")
        if vector is not None and not (
            isinstance(vector, list)
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector)
        ):
            raise BackupFormatError("an embedding's vector must be a list of numbers or null")
        _check_fields(rec, EMBEDDING_FIELDS, "embedding")
