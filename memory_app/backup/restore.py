"""Restore: backup lines imported in chunks with bulk inserts, in one transaction, idempotently."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import models, transaction
from django.db.models import Count, Max, Sum, Value
from django.db.models.functions import Coalesce, Greatest

from memory_app import backlog, errors, memories, tokens
from memory_app.audit import Actor, audit_record
from memory_app.backup.annotations import import_annotations
from memory_app.backup.checkpoints import import_checkpoints
from memory_app.backup.format import (
    CHUNK,
    CONTEXT_FIELDS,
    FORMAT,
    MEMORY_FIELDS,
    MESSAGE_FIELDS,
    RUN_FIELDS,
    STEP_FIELDS,
    TOOL_CALL_FIELDS,
    VERSION,
    check_record,
    kinds_of,
    load_fields,
)
from memory_app.backup.lines import read_backup
from memory_app.backup.provenance import memory_sources, stored_memories
from memory_app.backup.vectors import import_embeddings
from memory_app.backup.versions import import_memory_versions
from memory_app.db import lock_contexts
from memory_app.errors import BackupFormatError, Forbidden
from memory_app.models import (
    Context,
    ContextKey,
    MemoryOrigin,
    MemoryRecord,
    MemoryStatus,
    Message,
    Run,
    Step,
    StoreNamespace,
    ToolCall,
    keys_digest,
)
from memory_app.queries.lists import context_id_of_digest
from memory_app.search import fulltext
from memory_app.services.memories import status_for
from memory_app.services.memory_history import versions_record
from memory_app.services.runs import RECOUNT_BATCH, runs_recount


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
        # (context, run): each run is recounted in its context, on that context's shard.
        self.grown_runs: set[tuple[int, int]] = set()
        # The file's (scope_digest, content_hash) of each memory line -> the record it resolved
        # to here (inside the importer's confinement) and its context (the one its recomputed
        # scope names), for the memory version and embedding lines that follow.
        self.memories: dict[tuple[str, str], tuple[int, int | None]] = {}
        # The memories this import created: only these take the file's versions, and each
        # gets its `import` version once all lines are read (`versions_record_imported`).
        self.created_memories: set[int] = set()
        # (context, run reference) -> run, for each run a line of this file found; and by
        # context, the references found to name no stored run, until a run line of that context
        # creates one (`runs_created`).
        self._runs_found: dict[tuple[int, str], int] = {}
        self._runs_missing: dict[int, set[str]] = {}
        # digest -> the stored context of a memory's provenance outside this file, read once.
        self._source_contexts: dict[str, int | None] = {}
        self.kinds: tuple[str, ...] = ()  # the record kinds the header's version holds
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
        if digest not in self._source_contexts:
            found = (
                Context.objects.filter(pk=context_id_of_digest(digest))
                .values_list("pk", "keys")
                .first()
            )
            allowed = found is not None and (self.allowed is None or self.allowed(found[1]))
            self._source_contexts[digest] = found[0] if allowed else None
        return self._source_contexts[digest]

    def run_id(self, context_pk: int, ref: dict | None) -> int | None:
        """The run `ref` names in the context, each reference read once per import, found or
        not: one not found stays not found until the file's own run line creates a run in the
        context (`runs_created`), the only way this import adds one."""
        if not ref:
            return None
        ref_text = json.dumps(ref, sort_keys=True)
        key = (context_pk, ref_text)
        if key not in self._runs_found:
            if ref_text in self._runs_missing.get(context_pk, ()):
                return None
            found = self._stored_run_id(context_pk, ref)
            if found is None:
                self._runs_missing.setdefault(context_pk, set()).add(ref_text)
                return None
            self._runs_found[key] = found
        return self._runs_found[key]

    def runs_created(self, runs: list[Run]) -> None:
        """Runs this import created: the references of their contexts not found before are
        asked again, from the store (a run is found by its stored fields, which its line's
        reference need not spell as the other lines do)."""
        for run in runs:
            self._runs_missing.pop(run.context_id, None)

    def _stored_run_id(self, context_pk: int, ref: dict) -> int | None:
        qs = Run.objects.filter(context_id=context_pk)
        if ref.get("client_id"):
            qs = qs.filter(client_id=ref["client_id"])
        else:
            qs = qs.filter(
                client_id__isnull=True, created_at=datetime.fromisoformat(ref["created_at"])
            )
        return qs.values_list("pk", flat=True).first()

    def _check_allowed(self, keys: dict[str, Any]) -> None:
        if self.allowed is not None and not self.allowed(keys):
            raise Forbidden(f"this import may not write outside its permitted context keys: {keys}")

    # records ---------------------------------------------------------------------------------
    def feed(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "header":
            # Version 1 differs only in having no trailer; `read_backup` lets one through only
            # when the operator asked for it.
            if record.get("format") != FORMAT or record.get("version") not in (1, 2, VERSION):
                raise BackupFormatError(f"not an {FORMAT} v{VERSION} file")
            self.kinds = kinds_of(record["version"])
            return
        if kind not in self.kinds:
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
            if kind in ("score", "label", "comment"):
                import_annotations(self, kind, records)
            elif kind in ("checkpoint", "checkpoint_blob", "checkpoint_write"):
                import_checkpoints(self, kind, records)
            elif kind == "memory_version":
                import_memory_versions(self, records)
            elif kind == "embedding":
                import_embeddings(self, records)
            else:
                getattr(self, f"_import_{kind}")(records)

    def not_stored(
        self, model, rows: list[models.Model], names: tuple[str, ...], narrow: str
    ) -> list[models.Model]:
        """The rows whose natural key (`names`, the context first) is neither stored nor held by
        an earlier row, in order; the stored keys read by the rows' contexts and their values of
        `narrow`, one of `names`."""
        stored = set(
            model.objects.filter(
                context_id__in={r.context_id for r in rows},
                **{f"{narrow}__in": {getattr(r, narrow) for r in rows} - {None}},
            ).values_list(*names)
        )
        new = []
        for row in rows:
            key = tuple(getattr(row, n) for n in names)
            if key not in stored:
                stored.add(key)
                new.append(row)
        return new

    def insert(self, model, rows: list[models.Model], stamp_fields: list[str]) -> None:
        """Bulk insert, then put back the source's timestamps (auto_now* overwrite them on
        insert)."""
        if not rows:
            return
        # A stamp the line leaves out keeps the one given on insert (never put back as null).
        stamps = [
            {f: getattr(r, f) for f in stamp_fields if getattr(r, f) is not None} for r in rows
        ]
        model.objects.bulk_create(rows)
        for row, values in zip(rows, stamps, strict=True):
            for f, v in values.items():
                setattr(row, f, v)
        if not stamp_fields:
            return
        # Each update names its rows' context as well as their ids, so on Citus it goes to that
        # context's shard alone (a row without a context column, or of no context, by id).
        by_context: dict[int | None, list[models.Model]] = {}
        for row in rows:
            by_context.setdefault(getattr(row, "context_id", None), []).append(row)
        for ctx_pk, group in by_context.items():
            qs = model.objects.all() if ctx_pk is None else model.objects.filter(context_id=ctx_pk)
            qs.bulk_update(group, stamp_fields)

    def _import_context(self, records):
        for rec in records:
            # Contexts are found by digest: one that is not its keys' would reach another context.
            keys = rec.get("keys")
            if (
                not isinstance(keys, dict)
                or keys_digest(keys) != rec.get("digest")
                or rec.get("keys_digest", rec.get("digest")) != rec.get("digest")
            ):
                raise BackupFormatError("a context's digest must be the digest of its keys")
            self.context_keys[rec["digest"]] = keys
            existing = context_id_of_digest(rec["digest"])
            if existing is not None:
                self.contexts[rec["digest"]] = existing
                self.merged.add(existing)
                self.result.count("contexts", 0, 1)
                continue
            # Counters start from nothing and are counted from the rows imported (`recount`).
            ctx = Context(**load_fields(rec, CONTEXT_FIELDS))
            ctx.keys_digest = keys_digest(keys)
            ctx.last_seq = ctx.message_count = ctx.token_count = ctx.run_count = 0
            self.insert(Context, [ctx], ["created_at", "updated_at", "last_activity_at"])
            ContextKey.objects.create(digest=ctx.keys_digest, target_id=ctx.pk)
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
            run = Run(context_id=ctx_pk, **load_fields(rec, RUN_FIELDS))
            run.step_count = run.error_count = run.last_position = 0  # counted from its steps
            new.append(run)
        self.insert(Run, new, ["created_at", "updated_at"])
        self.runs_created(new)
        self.grown |= {r.context_id for r in new}
        self.grown_runs |= {(r.context_id, r.pk) for r in new}
        self.result.count("runs", len(new), 0)

    def _import_step(self, records):
        new, calls = [], []
        ctx_pk = self._current_context
        for rec in records:
            run_pk = self.run_id(ctx_pk, rec["run"]) if ctx_pk else None
            if run_pk is None:
                raise BackupFormatError("a step refers to a run that is not in the backup")
            new.append((run_pk, rec))
        existing = set(
            Step.objects.filter(context_id=ctx_pk, run_id__in={r for r, _ in new}).values_list(
                "run_id", "position"
            )
        )
        rows = []
        for run_pk, rec in new:
            if (run_pk, rec["position"]) in existing:
                self.result.count("steps", 0, 1)
                continue
            step = Step(run_id=run_pk, context_id=ctx_pk, **load_fields(rec, STEP_FIELDS))
            rows.append(step)
            calls.append(rec.get("tool_calls") or [])
        self.insert(Step, rows, ["created_at"])
        self.insert(
            ToolCall,
            [
                ToolCall(step_id=s.pk, context_id=ctx_pk, **load_fields(c, TOOL_CALL_FIELDS))
                for s, cs in zip(rows, calls, strict=True)
                for c in cs
            ],
            ["created_at"],
        )
        self.grown_runs |= {(s.context_id, s.run_id) for s in rows}
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
            existing = set(
                Message.objects.filter(context_id=ctx_pk, seq__in=seqs).values_list(
                    "seq", flat=True
                )
            )
            recs = [r for r in recs if r["seq"] not in existing]
            self.result.count("messages", 0, len(by_ctx[ctx_pk]) - len(recs))
            step_ids = self._message_steps(ctx_pk, recs)
            rows = []
            for rec in recs:
                msg = Message(context_id=ctx_pk, **load_fields(rec, MESSAGE_FIELDS))
                if rec.get("run"):
                    msg.run_id = self.run_id(ctx_pk, rec["run"])
                if rec.get("step"):
                    run_pk = self.run_id(ctx_pk, rec["step"]["run"])
                    msg.step_id = step_ids.get((run_pk, rec["step"]["position"]))
                rows.append(msg)
            _count_tokens(rows)
            self.insert(Message, rows, ["created_at", "updated_at"])
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

    def _message_steps(self, ctx_pk: int, recs: list[dict]) -> dict[tuple[int, int], int]:
        """(run, position) -> step of the steps these message lines of the context name, read in
        one query on the context (a line naming a step not stored finds none)."""
        wanted = set()
        for rec in recs:
            if rec.get("step"):
                run_pk = self.run_id(ctx_pk, rec["step"]["run"])
                if run_pk is not None:
                    wanted.add((run_pk, rec["step"]["position"]))
        if not wanted:
            return {}
        found = Step.objects.filter(
            context_id=ctx_pk,
            run_id__in={run for run, _ in wanted},
            position__in={position for _, position in wanted},
        ).values_list("run_id", "position", "pk")
        return {(run, position): pk for run, position, pk in found if (run, position) in wanted}

    def recount(self) -> None:
        """The counters of the contexts and runs this import wrote into, counted from their
        rows, never taken from the file: a merge adds to what a stored context already holds,
        and a file's counters may say anything."""
        by_context: dict[int, set[int]] = {}
        for ctx_pk, run_pk in self.grown_runs:
            by_context.setdefault(ctx_pk, set()).add(run_pk)
        for ctx_pk, run_pks in sorted(by_context.items()):
            # Each run's last position, read for all of the context's runs at once.
            last = dict(
                Step.objects.filter(context_id=ctx_pk, run_id__in=run_pks)
                .order_by()
                .values("run_id")
                .annotate(last=Max("position"))
                .values_list("run_id", "last")
            )
            # And written for all of them in one update on the context.
            Run.objects.filter(context_id=ctx_pk).bulk_update(
                [
                    Run(pk=run_pk, context_id=ctx_pk, last_position=last.get(run_pk, 0))
                    for run_pk in sorted(run_pks)
                ],
                ["last_position"],
                batch_size=RECOUNT_BATCH,
            )
        # Steps, errors, tool calls, models and cost, as the write path keeps them.
        runs_recount(runs=sorted(self.grown_runs))
        for ctx_pk in sorted(self.grown):
            with transaction.atomic():
                lock_contexts([ctx_pk])
                messages = Message.objects.filter(context_id=ctx_pk).aggregate(
                    n=Count("pk"),
                    tokens=Coalesce(Sum("token_count"), 0),
                    last=Coalesce(Max("seq"), 0),
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
            context = Context(
                pk=self.context_id(digest), keys=self.context_keys[digest], keys_digest=digest
            )
            return memories.Scope(context=context)
        return memories.Scope(keys=rec.get("scope_keys") or {})

    def _review_of_key(self, mem: MemoryRecord, scope: memories.Scope) -> None:
        """A key's import lands as the key's own records would: what the file says is live is
        proposed when its review says so, and a legal hold is a dashboard admin's act, never a
        key's. An operator's import restores the file as it was."""
        if self.actor.api_key is None:
            return
        if mem.status == MemoryStatus.LIVE:
            mem.status = status_for(scope, self.actor)
        mem.legal_hold = ""

    def _import_memory(self, records):
        lines = []
        for rec in records:
            scope = self._memory_scope(rec)
            mem = MemoryRecord(**load_fields(rec, MEMORY_FIELDS))
            # The limit every other path holds content to (a longer text could exceed what its
            # full-text vector may hold).
            if isinstance(mem.content, str) and len(mem.content) > memories.MAX_CONTENT_CHARS:
                raise BackupFormatError(
                    f"a memory's content is longer than {memories.MAX_CONTENT_CHARS} characters"
                )
            mem.context_id = scope.context.pk if scope.context is not None else None
            mem.scope_keys = scope.scope_keys
            mem.scope_digest = scope.digest
            mem.content_hash = memories.record_hash(mem)
            mem.recorded_by = self.actor.label
            # Provenance is this server's: an import, by whoever ran it (never the file's word).
            mem.origin = MemoryOrigin.IMPORT
            mem.source_api_key = self.actor.api_key
            user = self.actor.user
            mem.source_user = user if user is not None and user.is_authenticated else None
            mem.source_run_id = None
            self._review_of_key(mem, scope)
            file_ref = (
                rec.get("scope_digest", mem.scope_digest),
                rec.get("content_hash", mem.content_hash),
            )
            lines.append((file_ref, mem, rec))
        stored = stored_memories([mem for _, mem, _ in lines])
        rows = []
        for file_ref, mem, rec in lines:
            found = stored.get((mem.scope_digest, mem.content_hash))
            if found is not None:
                self.memories[file_ref] = (found, mem.context_id)
                self.result.count("memories", 0, 1)
                continue
            rows.append((file_ref, mem, rec))
        memory_sources(self, [(mem, rec) for _, mem, rec in rows])
        rows = [(file_ref, mem) for file_ref, mem, _ in rows]
        # Two lines of one file with the same content in the same scope are one record.
        unique = {(m.scope_digest, m.content_hash): m for _, m in rows}
        self.insert(MemoryRecord, list(unique.values()), ["created_at", "updated_at"])
        self.created_memories |= {m.pk for m in unique.values()}
        # A restored store item's namespace is in use, as a put makes it (list_namespaces).
        StoreNamespace.objects.bulk_create(
            [
                StoreNamespace(
                    scope_digest=m.scope_digest, scope_keys=m.scope_keys, namespace=m.namespace
                )
                for m in unique.values()
                if m.namespace is not None
            ],
            ignore_conflicts=True,
        )
        for file_ref, mem in rows:
            self.memories[file_ref] = (
                unique[(mem.scope_digest, mem.content_hash)].pk,
                mem.context_id,
            )
        self.result.count("memories", len(unique), len(rows) - len(unique))

    def versions_record_imported(self) -> None:
        """Each memory this import created gets its `import` version, after the versions the
        file gave it (version 1 when it gave none)."""
        created = sorted(self.created_memories)
        for at in range(0, len(created), CHUNK):
            chunk = MemoryRecord.objects.filter(pk__in=created[at : at + CHUNK]).order_by("pk")
            versions_record(chunk, actor=self.actor, action="import")

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
            counts = tokens.count_tokens(
                [tokens.token_text(m.text, m.content) for m in msgs], tokenizer=name
            )
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
    """Import backup records (see the `memory_app.backup` docstring); idempotent. `allowed(keys)`
    says whether the import may write into a context with those keys (a confined API key's
    check); a context line for any other context raises `Forbidden`. `actor` is audited as the
    importer and is the `recorded_by` of the memories it creates."""
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
        importer.versions_record_imported()
        importer.recount()
        importer.audit()
    return importer.result


def import_lines(
    lines: Iterable[str | bytes],
    *,
    allowed: Callable[[dict[str, Any]], bool] | None = None,
    actor: Actor | None = None,
    unchecked_version_1: bool = False,
) -> ImportResult:
    """Import a backup file's lines (with their line ends, as read from the file), each read as
    strict JSON and the trailer checked (`memory_app.backup.lines.read_backup`, which also says
    what `unchecked_version_1` allows); see `import_records`."""
    as_bytes = (line.encode("utf-8") if isinstance(line, str) else line for line in lines)
    records = read_backup(as_bytes, unchecked_version_1=unchecked_version_1)
    return import_records(records, allowed=allowed, actor=actor)
