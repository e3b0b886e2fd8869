"""Backup and restore as JSON Lines, streamed in constant memory, imported idempotently.

Export (`export_lines`) yields one JSON object per line, referents before what refers to them:

    {"type": "header", "format": "agentmemory-backup", "version": 1, "embeddings": bool}
    {"type": "context", "digest", "keys", ...}              per context, then its
    {"type": "run", "ref", "context", ...}                  runs,
    {"type": "step", "run", "position", ..., "tool_calls": [...]}   steps with their tool calls,
    {"type": "message", "context", "seq", ..., "run", "step"}       messages,
    {"type": "memory", "ref", ...}                          memory records (context-scoped ones and
                                                            key-scoped ones the contexts fall under)
    {"type": "embedding", "item": "message"|"memory", ...}  vectors, when asked for

Rows are read with server-side cursors (`iterator(chunk_size=...)`), so memory does not grow with
the size of a context. References use natural keys, never the source's primary keys: a context
by its keys digest, a run by its client id (or its creation instant when it has none), a step by
(run, position), a message by (context, seq), a memory record by (scope digest, content hash).

Import (`import_lines`) reads the same lines in chunks and writes each chunk with bulk inserts,
all in one transaction: a file that fails half-way (a bad line, a context the key may not
write) leaves nothing behind. A row whose natural key is already stored is left as it is, so
importing twice changes nothing.
Timestamps and agent-written values are restored verbatim; every value the server derives is
derived again, never taken from the file: keys and scope digests, content hashes, token counts,
vector dimensions, `recorded_by` (the importer), and the counters of every context and run the
import writes into (counted from their rows once the import is done; a merged context's
`last_seq` rises to the highest seq imported, so the agent's next append follows them).

A confined importer (an API key with context keys) writes only inside its keys: a context line
outside them is refused, and run, message and embedding lines reach only contexts the file itself
defines, so a digest of another tenant's context fails exactly like an unknown one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db import models, transaction
from django.db.models import Count, Max, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest

from memory_app import backlog, errors, memories, tokens
from memory_app.audit import Actor, audit_record
from memory_app.db import lock_contexts
from memory_app.errors import BackupFormatError, Forbidden
from memory_app.models import (
    Context,
    Embedding,
    MemoryRecord,
    Message,
    Run,
    Step,
    ToolCall,
    keys_digest,
)
from memory_app.queries.memories import memories_visible
from memory_app.search import fulltext

FORMAT = "agentmemory-backup"
VERSION = 1
CHUNK = 1000



# --- field handling -----------------------------------------------------------------------------

def _plain_fields(model: type[models.Model], *, skip: tuple[str, ...] = ()) -> list[models.Field]:
    """Concrete, stored, non-relational fields except the primary key (and `skip`)."""
    return [
        f for f in model._meta.concrete_fields
        if not f.primary_key and not f.is_relation and not isinstance(f, models.GeneratedField)
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
EMBEDDING_FIELDS = _plain_fields(Embedding, skip=("vector", "indexed"))


def _dump(obj: models.Model, fields: list[models.Field]) -> dict[str, Any]:
    out = {}
    for f in fields:
        value = getattr(obj, f.attname)
        if isinstance(value, datetime):
            value = value.isoformat()
        out[f.name] = value
    return out


def _load(data: dict[str, Any], fields: list[models.Field]) -> dict[str, Any]:
    out = {}
    for f in fields:
        if f.name not in data:
            continue
        value = data[f.name]
        if isinstance(f, models.DateTimeField) and isinstance(value, str):
            value = datetime.fromisoformat(value)
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
        return None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"
    if isinstance(f, models.FloatField):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return None if ok else "must be a number"
    if isinstance(f, models.DateTimeField):
        return None if _is_datetime(value) else "must be an ISO 8601 date and time"
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


def _check_fields(rec: dict[str, Any], fields: list[models.Field], what: str) -> None:
    for f in fields:
        if f.name not in rec:
            automatic = getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
            # Digests and hashes (not editable) are derived on import, so a line may omit them.
            if not (f.null or f.has_default() or automatic or not f.editable):
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


def check_record(kind: str, rec: dict[str, Any]) -> None:
    """Refuse a record whose fields or references do not have the types export writes, before
    anything is stored (a string for a number used to reach the database as a server error)."""
    if kind == "context":
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
        _check_ref(rec.get("step"), "a message's step", {"run": dict, "position": int}, optional=True)
        if rec.get("step") is not None:
            _check_run_ref(rec["step"]["run"], "a message's step run")
        _check_fields(rec, MESSAGE_FIELDS, "message")
    elif kind == "memory":
        _check_ref(rec, "a memory record", {"context": (str, type(None))})
        _check_ref(rec.get("source_message"), "a memory's source_message", {"context": str, "seq": int}, optional=True)
        _check_ref(rec.get("source_step"), "a memory's source_step", {"run": dict, "position": int}, optional=True)
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


def _run_ref(run: Run) -> dict[str, Any]:
    return {"client_id": run.client_id, "created_at": run.created_at.isoformat()}


# --- export -------------------------------------------------------------------------------------

def contexts_matching(*, context_ids: list[int] | None = None, keys: dict | None = None) -> models.QuerySet:
    qs = Context.objects.all()
    if context_ids:
        qs = qs.filter(pk__in=context_ids)
    if keys:
        qs = qs.filter(keys__contains=keys)
    return qs.order_by("pk")


def export_records(
    *, contexts: models.QuerySet | None = None, embeddings: bool = False, chunk_size: int = CHUNK,
    confined_to: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the backup's records, one at a time, reading the database in chunks.

    A context's memory records are its own and those of every key subset its keys contain (an
    empty legacy subset too: a whole backup loses nothing). `confined_to`, a confined API key's
    context keys, narrows them to what that key recalls (`memories_visible`, archived
    ones included), so a tenant's export holds no record its key may not read."""
    contexts = contexts if contexts is not None else Context.objects.order_by("pk")
    yield {"type": "header", "format": FORMAT, "version": VERSION, "embeddings": embeddings}
    exported_memories: set[int] = set()
    for ctx in contexts.iterator(chunk_size=100):
        yield {"type": "context", "digest": ctx.keys_digest, **_dump(ctx, CONTEXT_FIELDS)}
        run_refs: dict[int, dict] = {}
        for run in Run.objects.filter(context=ctx).order_by("pk").iterator(chunk_size=chunk_size):
            run_refs[run.pk] = _run_ref(run)
            yield {"type": "run", "context": ctx.keys_digest, "ref": run_refs[run.pk], **_dump(run, RUN_FIELDS)}
        steps = (
            Step.objects.filter(run__context=ctx).order_by("run_id", "position")
            .prefetch_related(models.Prefetch("tool_calls", queryset=ToolCall.objects.order_by("position")))
        )
        for step in steps.iterator(chunk_size=chunk_size):
            calls = [_dump(tc, TOOL_CALL_FIELDS) for tc in step.tool_calls.all()]
            yield {"type": "step", "run": run_refs[step.run_id], **_dump(step, STEP_FIELDS), "tool_calls": calls}
        step_positions = dict(Step.objects.filter(run__context=ctx).values_list("pk", "position"))
        step_runs = dict(Step.objects.filter(run__context=ctx).values_list("pk", "run_id"))
        for msg in Message.objects.filter(context=ctx).order_by("seq").iterator(chunk_size=chunk_size):
            record = {"type": "message", "context": ctx.keys_digest, **_dump(msg, MESSAGE_FIELDS)}
            record["run"] = run_refs.get(msg.run_id) if msg.run_id else None
            record["step"] = (
                {"run": run_refs[step_runs[msg.step_id]], "position": step_positions[msg.step_id]}
                if msg.step_id else None
            )
            yield record
        if confined_to:
            scoped = memories_visible(context=ctx, include_archived=True, confined_to=confined_to)
        else:
            scoped = MemoryRecord.objects.filter(Q(context=ctx) | Q(context__isnull=True, scope_keys__contained_by=ctx.keys))
        for mem in scoped.order_by("pk").iterator(chunk_size=chunk_size):
            if mem.pk in exported_memories:
                continue
            exported_memories.add(mem.pk)
            yield _memory_record(mem)
        if embeddings:
            rows = Embedding.objects.filter(message__context=ctx).select_related("message").order_by("pk")
            for emb in rows.iterator(chunk_size=chunk_size):
                yield {"type": "embedding", "item": "message", "context": ctx.keys_digest, "seq": emb.message.seq,
                       **_dump(emb, EMBEDDING_FIELDS), "vector": _vector(emb.vector)}
            rows = Embedding.objects.filter(memory_record__in=scoped).select_related("memory_record").order_by("pk")
            for emb in rows.iterator(chunk_size=chunk_size):
                mem = emb.memory_record
                yield {"type": "embedding", "item": "memory", "scope_digest": mem.scope_digest,
                       "content_hash": mem.content_hash, **_dump(emb, EMBEDDING_FIELDS), "vector": _vector(emb.vector)}


def _vector(value) -> list[float] | None:
    return None if value is None else [float(x) for x in value]


def _memory_record(mem: MemoryRecord) -> dict[str, Any]:
    record = {"type": "memory", "context": mem.context.keys_digest if mem.context_id else None,
              **_dump(mem, MEMORY_FIELDS)}
    record["source_message"] = (
        {"context": mem.source_message.context.keys_digest, "seq": mem.source_message.seq}
        if mem.source_message_id else None
    )
    record["source_step"] = (
        {"run": _run_ref(mem.source_step.run), "position": mem.source_step.position} if mem.source_step_id else None
    )
    return record


def export_lines(**kwargs) -> Iterator[str]:
    """The backup as JSON Lines (each line ends with a newline)."""
    for record in export_records(**kwargs):
        yield json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


# --- import -------------------------------------------------------------------------------------

@dataclass
class ImportResult:
    created: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str, created: int, skipped: int) -> None:
        self.created[kind] = self.created.get(kind, 0) + created
        self.skipped[kind] = self.skipped.get(kind, 0) + skipped


class _Importer:
    def __init__(
        self, allowed: Callable[[dict[str, Any]], bool] | None = None, actor: Actor | None = None
    ) -> None:
        self.allowed = allowed  # may this import write into a context with these keys?
        self.actor = actor or Actor.system("import")
        self.result = ImportResult()
        self.contexts: dict[str, int] = {}  # digest -> target pk, for contexts this file defines
        self.context_keys: dict[str, dict[str, Any]] = {}  # digest -> keys
        # Contexts that were here before this import; every context and run the import wrote
        # into has its counters counted again from its rows at the end (`recount`).
        self.merged: set[int] = set()
        self.grown: set[int] = set()
        self.grown_runs: set[int] = set()
        # The file's (scope_digest, content_hash) of each memory line -> the record it resolved
        # to here (inside the importer's confinement), for the embedding lines that follow.
        self.memories: dict[tuple[str, str], int] = {}
        self.pending: list[dict] = []
        self.pending_type: str | None = None

    # references ------------------------------------------------------------------------------
    def context_id(self, digest: str) -> int:
        """A context this file defines. A digest of any other context, foreign or unknown, is
        the same error, so the answer tells a confined importer nothing about other tenants."""
        if digest not in self.contexts:
            raise BackupFormatError(f"context {digest[:12]}… is referenced before it is defined")
        return self.contexts[digest]

    def source_context_id(self, digest: str) -> int | None:
        """The context of a memory's provenance: one this file defines, else a stored one the
        importer may write into; None otherwise (the provenance is dropped, never an error)."""
        if digest in self.contexts:
            return self.contexts[digest]
        found = Context.objects.filter(keys_digest=digest).values_list("pk", "keys").first()
        if found is None or (self.allowed is not None and not self.allowed(found[1])):
            return None
        return found[0]

    def run_id(self, context_pk: int, ref: dict | None) -> int | None:
        if not ref:
            return None
        qs = Run.objects.filter(context_id=context_pk)
        if ref.get("client_id"):
            qs = qs.filter(client_id=ref["client_id"])
        else:
            qs = qs.filter(client_id__isnull=True, created_at=datetime.fromisoformat(ref["created_at"]))
        return qs.values_list("pk", flat=True).first()

    def _check_allowed(self, keys: dict[str, Any]) -> None:
        if self.allowed is not None and not self.allowed(keys):
            raise Forbidden(f"this import may not write outside its permitted context keys: {keys}")

    # records ---------------------------------------------------------------------------------
    def feed(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "header":
            if record.get("format") != FORMAT or record.get("version") != VERSION:
                raise BackupFormatError(f"not an {FORMAT} v{VERSION} file")
            return
        if kind not in ("context", "run", "step", "message", "memory", "embedding"):
            raise BackupFormatError(f"unknown record type {kind!r}")
        check_record(kind, record)
        # Confinement, before the line joins a chunk: a context's keys, and the subset a
        # key-subset memory is seen from (every context containing it; never the empty one for a
        # confined key). Other lines reach only the contexts this file defines.
        if kind == "context":
            self._check_allowed(record.get("keys") or {})
        elif kind == "memory" and not record.get("context"):
            self._check_allowed(record.get("scope_keys") or {})
        if kind != self.pending_type or len(self.pending) >= CHUNK:
            self.flush()
            self.pending_type = kind
        self.pending.append(record)

    def flush(self) -> None:
        if not self.pending:
            return
        records, kind = self.pending, self.pending_type
        self.pending = []
        with transaction.atomic():
            getattr(self, f"_import_{kind}")(records)

    def _insert(self, model, rows: list[models.Model], stamp_fields: list[str]) -> None:
        """Bulk insert, then put back the source's timestamps (auto_now* overwrite them on insert)."""
        if not rows:
            return
        # A stamp the line leaves out keeps the one given on insert (never put back as null).
        stamps = [{f: getattr(r, f) for f in stamp_fields if getattr(r, f) is not None} for r in rows]
        model.objects.bulk_create(rows)
        for row, values in zip(rows, stamps, strict=True):
            for f, v in values.items():
                setattr(row, f, v)
        if stamp_fields:
            model.objects.bulk_update(rows, stamp_fields)

    def _import_context(self, records):
        for rec in records:
            # Contexts are found by digest: one that is not its keys' would reach another context.
            keys = rec.get("keys")
            if not isinstance(keys, dict) or keys_digest(keys) != rec.get("digest") or rec.get(
                "keys_digest", rec.get("digest")
            ) != rec.get("digest"):
                raise BackupFormatError("a context's digest must be the digest of its keys")
            self.context_keys[rec["digest"]] = keys
            existing = Context.objects.filter(keys_digest=rec["digest"]).values_list("pk", flat=True).first()
            if existing is not None:
                self.contexts[rec["digest"]] = existing
                self.merged.add(existing)
                self.result.count("contexts", 0, 1)
                continue
            # Counters start from nothing and are counted from the rows imported (`recount`).
            ctx = Context(**_load(rec, CONTEXT_FIELDS))
            ctx.keys_digest = keys_digest(keys)
            ctx.last_seq = ctx.message_count = ctx.token_count = ctx.run_count = 0
            self._insert(Context, [ctx], ["created_at", "updated_at", "last_activity_at"])
            self.contexts[rec["digest"]] = ctx.pk
            self.grown.add(ctx.pk)
            self.result.count("contexts", 1, 0)

    def _import_run(self, records):
        new = []
        for rec in records:
            ctx_pk = self.context_id(rec["context"])
            if self.run_id(ctx_pk, rec["ref"]) is not None:
                self.result.count("runs", 0, 1)
                continue
            run = Run(context_id=ctx_pk, **_load(rec, RUN_FIELDS))
            run.step_count = run.error_count = run.last_position = 0  # counted from its steps
            new.append(run)
        self._insert(Run, new, ["created_at", "updated_at"])
        self.grown |= {r.context_id for r in new}
        self.grown_runs |= {r.pk for r in new}
        self.result.count("runs", len(new), 0)

    def _import_step(self, records):
        new, calls = [], []
        run_cache: dict[str, int | None] = {}
        for rec in records:
            key = json.dumps(rec["run"], sort_keys=True)
            if key not in run_cache:
                ctx_pk = self._current_context
                run_cache[key] = self.run_id(ctx_pk, rec["run"]) if ctx_pk else None
            run_pk = run_cache[key]
            if run_pk is None:
                raise BackupFormatError("a step refers to a run that is not in the backup")
            new.append((run_pk, rec))
        existing = set(
            Step.objects.filter(run_id__in={r for r, _ in new}).values_list("run_id", "position")
        )
        rows = []
        for run_pk, rec in new:
            if (run_pk, rec["position"]) in existing:
                self.result.count("steps", 0, 1)
                continue
            step = Step(run_id=run_pk, **_load(rec, STEP_FIELDS))
            rows.append(step)
            calls.append(rec.get("tool_calls") or [])
        self._insert(Step, rows, ["created_at"])
        self._insert(
            ToolCall,
            [ToolCall(step_id=s.pk, **_load(c, TOOL_CALL_FIELDS)) for s, cs in zip(rows, calls, strict=True) for c in cs],
            ["created_at"],
        )
        self.grown_runs |= {s.run_id for s in rows}
        self.result.count("steps", len(rows), 0)

    # Steps follow their context's runs in the file, so the last context seen is theirs.
    _current_context: int | None = None

    def _import_message(self, records):
        by_ctx: dict[int, list[dict]] = {}
        for rec in records:
            by_ctx.setdefault(self.context_id(rec["context"]), []).append(rec)
        # An agent appending meanwhile waits: it reads its next seq once last_seq has risen past
        # the seqs imported here.
        lock_contexts(by_ctx)
        for ctx_pk, recs in by_ctx.items():
            seqs = {r["seq"] for r in recs}
            existing = set(Message.objects.filter(context_id=ctx_pk, seq__in=seqs).values_list("seq", flat=True))
            run_refs = {json.dumps(r["run"], sort_keys=True) for r in recs if r.get("run")}
            run_ids = {k: self.run_id(ctx_pk, json.loads(k)) for k in run_refs}
            step_ids: dict[tuple[int | None, int], int | None] = {}
            rows = []
            for rec in recs:
                if rec["seq"] in existing:
                    self.result.count("messages", 0, 1)
                    continue
                msg = Message(context_id=ctx_pk, **_load(rec, MESSAGE_FIELDS))
                if rec.get("run"):
                    msg.run_id = run_ids[json.dumps(rec["run"], sort_keys=True)]
                if rec.get("step"):
                    run_pk = run_ids.get(json.dumps(rec["step"]["run"], sort_keys=True)) or self.run_id(
                        ctx_pk, rec["step"]["run"])
                    key = (run_pk, rec["step"]["position"])
                    if key not in step_ids:
                        step_ids[key] = Step.objects.filter(run_id=run_pk, position=key[1]).values_list(
                            "pk", flat=True).first()
                    msg.step_id = step_ids[key]
                rows.append(msg)
            _count_tokens(rows)
            self._insert(Message, rows, ["created_at", "updated_at"])
            self.result.count("messages", len(rows), 0)
            if rows:
                # The next append follows the highest seq stored, never one imported here.
                Context.objects.filter(pk=ctx_pk).update(
                    last_seq=Greatest("last_seq", Value(max(r.seq for r in rows)))
                )
                self.grown.add(ctx_pk)
                # Seqs below the context's search_seq (a merge into an existing context) are
                # matched from their text until the indexer has parsed them.
                fulltext.reindex_from(ctx_pk, min(r.seq for r in rows))
                transaction.on_commit(backlog.wake_indexer)

    def recount(self) -> None:
        """The counters of the contexts and runs this import wrote into, counted from their
        rows, never taken from the file: after a file cut short (the first lines of a backup)
        the full file finds the context the first one created already here, and a file's
        counters may say anything."""
        for run_pk in sorted(self.grown_runs):
            steps = Step.objects.filter(run_id=run_pk).aggregate(
                n=Count("pk"),
                errors=Count("pk", filter=Q(error_type__isnull=False) & ~Q(error_type="")),
                last=Coalesce(Max("position"), 0),
            )
            Run.objects.filter(pk=run_pk).update(
                step_count=steps["n"], error_count=steps["errors"], last_position=steps["last"]
            )
        for ctx_pk in sorted(self.grown):
            with transaction.atomic():
                lock_contexts([ctx_pk])
                messages = Message.objects.filter(context_id=ctx_pk).aggregate(
                    n=Count("pk"), tokens=Coalesce(Sum("token_count"), 0), last=Coalesce(Max("seq"), 0)
                )
                Context.objects.filter(pk=ctx_pk).update(
                    last_seq=Greatest("last_seq", Value(messages["last"])),
                    message_count=messages["n"],
                    token_count=messages["tokens"],
                    run_count=Run.objects.filter(context_id=ctx_pk).count(),
                )

    def _memory_scope(self, rec: dict[str, Any]) -> memories.Scope:
        """The scope a memory line lands in, from the context it names or its key subset."""
        if rec.get("context"):
            digest = rec["context"]
            context = Context(pk=self.context_id(digest), keys=self.context_keys[digest], keys_digest=digest)
            return memories.Scope(context=context)
        return memories.Scope(keys=rec.get("scope_keys") or {})

    def _import_memory(self, records):
        rows = []
        for rec in records:
            scope = self._memory_scope(rec)
            mem = MemoryRecord(**_load(rec, MEMORY_FIELDS))
            mem.context_id = scope.context.pk if scope.context is not None else None
            mem.scope_keys = scope.scope_keys
            mem.scope_digest = scope.digest
            mem.content_hash = memories.content_hash(mem.content)
            mem.recorded_by = self.actor.label
            file_ref = (rec.get("scope_digest", mem.scope_digest), rec.get("content_hash", mem.content_hash))
            found = MemoryRecord.objects.filter(
                scope_digest=mem.scope_digest, content_hash=mem.content_hash
            ).values_list("pk", flat=True).first()
            if found is not None:
                self.memories[file_ref] = found
                self.result.count("memories", 0, 1)
                continue
            if rec.get("source_message"):
                src = rec["source_message"]
                src_ctx = self.source_context_id(src["context"])
                mem.source_message_id = Message.objects.filter(
                    context_id=src_ctx, seq=src["seq"]).values_list("pk", flat=True).first() if src_ctx else None
            if rec.get("source_step") and mem.context_id:
                run_pk = self.run_id(mem.context_id, rec["source_step"]["run"])
                mem.source_step_id = Step.objects.filter(
                    run_id=run_pk, position=rec["source_step"]["position"]).values_list("pk", flat=True).first()
            rows.append((file_ref, mem))
        # Two lines of one file with the same content in the same scope are one record.
        unique = {(m.scope_digest, m.content_hash): m for _, m in rows}
        self._insert(MemoryRecord, list(unique.values()), ["created_at", "updated_at"])
        for file_ref, mem in rows:
            self.memories[file_ref] = unique[(mem.scope_digest, mem.content_hash)].pk
        self.result.count("memories", len(unique), len(rows) - len(unique))

    def _import_embedding(self, records):
        rows = []
        for rec in records:
            emb = Embedding(**_load(rec, EMBEDDING_FIELDS), vector=rec.get("vector"))
            emb.dimensions = len(rec["vector"]) if rec.get("vector") is not None else None
            if rec["item"] == "message":
                ctx_pk = self.context_id(rec["context"])
                emb.message_id = Message.objects.filter(context_id=ctx_pk, seq=rec["seq"]).values_list("pk", flat=True).first()
                emb.context_id = ctx_pk
                exists = Embedding.objects.filter(message_id=emb.message_id, model=emb.model).exists()
            else:
                # Only a memory a line of this file resolved to (inside the importer's
                # confinement): a digest and hash of any other record attach nothing.
                emb.memory_record_id = self.memories.get((rec["scope_digest"], rec["content_hash"]))
                emb.context_id = MemoryRecord.objects.filter(pk=emb.memory_record_id).values_list(
                    "context_id", flat=True).first()
                exists = Embedding.objects.filter(memory_record_id=emb.memory_record_id, model=emb.model).exists()
            if exists or (emb.message_id is None and emb.memory_record_id is None):
                self.result.count("embeddings", 0, 1)
                continue
            rows.append(emb)
        self._insert(Embedding, rows, [])
        self.result.count("embeddings", len(rows), 0)

    def audit(self) -> None:
        touched = sorted(set(self.contexts.values()))
        audit_record(
            actor=self.actor,
            action="import",
            target_type="context",
            target_ids=touched,
            context_id=touched[0] if len(touched) == 1 else None,
            after={"created": self.result.created, "skipped": self.result.skipped},
        )


def _count_tokens(rows: list[Message]) -> None:
    """Token counts are the server's, counted under each message's tokenizer (the default when
    the line names none); an unknown tokenizer is the file's error."""
    by_tokenizer: dict[str, list[Message]] = {}
    for msg in rows:
        msg.tokenizer = msg.tokenizer or tokens.default_tokenizer_name()
        by_tokenizer.setdefault(msg.tokenizer, []).append(msg)
    for name, msgs in by_tokenizer.items():
        try:
            counts = tokens.count_tokens([tokens.token_text(m.text, m.content) for m in msgs], tokenizer=name)
        except errors.UnknownTokenizer as exc:
            raise BackupFormatError(f"a message's tokenizer: {exc}") from exc
        for msg, count in zip(msgs, counts, strict=True):
            msg.token_count = count


def import_records(
    records: Iterable[dict[str, Any]],
    *,
    allowed: Callable[[dict[str, Any]], bool] | None = None,
    actor: Actor | None = None,
) -> ImportResult:
    """Import backup records (see module docstring); idempotent. `allowed(keys)` says whether
    the import may write into a context with those keys (a confined API key's check); a context
    line for any other context raises `Forbidden`. `actor` is audited as the importer and is the
    `recorded_by` of the memories it creates."""
    importer = _Importer(allowed, actor)
    # All or nothing: a bad line (or a forbidden context) half-way through leaves nothing of
    # the lines before it behind. The file is still read and written chunk by chunk.
    with transaction.atomic():
        saw_header = False
        for record in records:
            if not isinstance(record, dict):
                raise BackupFormatError("each line must be a JSON object")
            if not saw_header:
                if record.get("type") != "header":
                    raise BackupFormatError("the first line must be the backup header")
                saw_header = True
            if record.get("type") == "context":
                importer.flush()
            importer.feed(record)
            if record.get("type") == "context":
                importer.flush()
                importer._current_context = importer.contexts[record["digest"]]
        importer.flush()
        if not saw_header:
            raise BackupFormatError("empty backup")
        importer.recount()
        importer.audit()
    return importer.result


def import_lines(lines: Iterable[str | bytes], *, actor: Actor | None = None) -> ImportResult:
    def records():
        for number, line in enumerate(lines, start=1):
            if isinstance(line, bytes):
                line = line.decode("utf-8")
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise BackupFormatError(f"line {number} is not JSON: {exc.msg}") from exc

    return import_records(records(), actor=actor)
