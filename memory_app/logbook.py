"""Writes: contexts, messages, runs, steps, tool calls, prune/restore/edit, audit.

Every function here is keyword-only, runs in one transaction, and either does all its work or
none of it. Idempotency: a write carrying a client id that is already stored returns the stored
row and writes nothing when the content is the same, and raises `Conflict` naming the fields that
differ when it is not.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
from django.db import IntegrityError, connection, transaction
from django.db.models import BooleanField, F, Max, Min, Sum
from django.db.models.base import ModelState
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from memory_app import backlog, fulltext, tokens
from memory_app.audit import Actor, audit_record
from memory_app.embeddings import client_vectors, providers, queue
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.models import (
    AuditEvent,
    Context,
    Message,
    Run,
    RunStatus,
    Step,
    ToolCall,
    TraceSpan,
    keys_digest,
)

MAX_BATCH = 1000


# --- contexts ---------------------------------------------------------------------------------


def context_get_or_create(
    *, keys: dict[str, Any], title: str | None = None, metadata: dict | None = None
) -> tuple[Context, bool]:
    """The context for `keys` (order-insensitive), created when missing; safe under races."""
    digest = keys_digest(keys)
    defaults = {"keys": keys, "title": title or "", "metadata": metadata or {}}
    # Django's get_or_create retries the read when a concurrent insert wins the unique index.
    return Context.objects.get_or_create(keys_digest=digest, defaults=defaults)


def context_update(*, context: Context, title: str | None = None, metadata: dict | None = None, actor: Actor) -> Context:
    before = {"title": context.title, "metadata": context.metadata}
    if title is not None:
        context.title = title
    if metadata is not None:
        context.metadata = metadata
    with transaction.atomic():
        context.save(update_fields=["title", "metadata", "updated_at"])
        audit_record(
            actor=actor, action="edit", target_type="context", target_ids=[context.pk], context_id=context.pk,
            before=before, after={"title": context.title, "metadata": context.metadata},
        )
    return context


# --- messages ---------------------------------------------------------------------------------

MESSAGE_FIELDS = ("role", "name", "text", "content", "tags", "metadata", "run_id", "step_id", "source_timestamp")


def _message_defaults(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": item["role"],
        "name": item.get("name") or "",
        "text": item.get("text") or "",
        "content": item.get("content"),
        "tags": list(item.get("tags") or []),
        "metadata": item.get("metadata") or {},
        "run_id": item.get("run_id"),
        "step_id": item.get("step_id"),
        "source_timestamp": item.get("source_timestamp") or "",
        # Not in MESSAGE_FIELDS: a repeat that differs only in key order is the same message.
        "key_order": item.get("key_order"),
    }


def differences(stored: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    return {k: {"stored": stored[k], "sent": sent[k]} for k in sent if stored.get(k) != sent[k]}


@dataclass
class AppendResult:
    messages: list[Message]
    created: list[bool] = field(default_factory=list)

    @property
    def any_created(self) -> bool:
        return any(self.created)


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False
_gc_paused_since = 0.0
# Overlapping pauses (batch writers back to back on several threads) must not keep collection
# off for good: a pause that ends after this long with others still running collects once.
GC_PAUSE_MAX_SECONDS = 5.0


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (nested and concurrent uses count).

    A 1,000-message batch allocates ~13,000 container objects (parsed items, rows, echo) that
    live until its response is written: about 20 young collections ran during it and moved
    them to the oldest generation, so every few batches a full collection walked the whole
    heap (80-95 ms, ≈ 15 ms a batch on average). Paused, they are freed by reference counting
    when the request ends and never promoted; cycles made meanwhile wait for the next
    collection. Only time changes, never what is stored or answered."""
    global _gc_pauses, _gc_was_enabled, _gc_paused_since
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            _gc_paused_since = time.monotonic()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0:
                if _gc_was_enabled:
                    gc.enable()
            elif _gc_was_enabled and time.monotonic() - _gc_paused_since > GC_PAUSE_MAX_SECONDS:
                gc.collect()
                _gc_paused_since = time.monotonic()


def messages_append(*, context: Context, items: list[dict[str, Any]], tokenizer: str | None = None) -> AppendResult:
    """Append messages to a context, all or nothing.

    `items` are dicts with role, name, text, content, tags, metadata, run_id, step_id,
    source_timestamp and an optional client_id. Seqs are allocated under the context's row lock,
    so they are gap-free and strictly increasing whatever the number of concurrent writers.
    """
    if len(items) < COPY_THRESHOLD:
        return _messages_append(context=context, items=items, tokenizer=tokenizer)
    with gc_paused():
        return _messages_append(context=context, items=items, tokenizer=tokenizer)


def _messages_append(*, context: Context, items: list[dict[str, Any]], tokenizer: str | None) -> AppendResult:
    if not items:
        return AppendResult(messages=[])
    if len(items) > MAX_BATCH:
        raise Invalid(f"at most {MAX_BATCH} messages per request, got {len(items)}")
    client_ids = [i.get("client_id") for i in items if i.get("client_id")]
    if len(set(client_ids)) != len(client_ids):
        raise Invalid("client ids repeat within the batch")

    # Client vectors are checked before anything is written (a wrong dimension names the item).
    vectors = client_vectors.client_vectors(items, label="messages")
    tokenizer = tokenizer or tokens.default_tokenizer_name()
    tokens.get_encoding(tokenizer)  # an unknown tokenizer fails before any work
    prepared = [_message_defaults(i) for i in items]
    _check_links(context=context, items=prepared)

    args = {"context": context, "items": items, "prepared": prepared, "vectors": vectors,
            "client_ids": client_ids, "tokenizer": tokenizer}
    try:
        result = _append_once(**args)
    except IntegrityError as exc:
        # A concurrent writer stored one of our client ids between our check and our insert;
        # everything rolled back (seqs included). Once more: the check now finds it.
        if "message_client_id_unique" not in str(exc):
            raise
        result = _append_once(**args)
    client_vectors.ensure_vector_indexes(vectors)
    return result


def _append_once(*, context, items, prepared, vectors, client_ids, tokenizer) -> AppendResult:
    with transaction.atomic():
        # `= ANY(array)`: one parameter instead of an IN list of up to 1,000 that Django compiles
        # and psycopg merges into the text (~7 ms of a 1,000-message batch).
        existing = {
            m.client_id: m
            for m in Message.objects.filter(
                RawSQL("client_id = ANY(%s)", [client_ids], output_field=BooleanField()),  # noqa: S611 - constant SQL
                context=context,
            )
        } if client_ids else {}
        results: list[Message | None] = []
        created_flags: list[bool] = []
        new: list[int] = []  # positions in `items` of the messages stored now
        for n, (item, data) in enumerate(zip(items, prepared, strict=True)):
            cid = item.get("client_id")
            if cid and cid in existing:
                stored = existing[cid]
                diff = differences(
                    {k: getattr(stored, k) for k in MESSAGE_FIELDS}, {k: data[k] for k in MESSAGE_FIELDS}
                )
                if diff:
                    raise Conflict(f"message {cid!r} already exists with different content", diff)
                results.append(stored)
                created_flags.append(False)
                continue
            new.append(n)
            results.append(None)
            created_flags.append(True)
        if new:
            specs = [(items[n].get("client_id") or None, prepared[n]) for n in new]
            copy = len(new) >= COPY_THRESHOLD
            # Repeats are not counted. A small batch is counted before the lock (the UPDATE below
            # takes it); a large one inside its COPY stream (`_copy_messages`).
            counts = None if copy else tokens.count_tokens(
                [tokens.token_text(d["text"], d["content"]) for _, d in specs], tokenizer=tokenizer
            )
            # One statement takes the context's row lock and allocates the seqs: concurrent
            # appenders queue here, so seqs are gap-free and strictly increasing. A small batch
            # to a context whose full-text vectors are caught up writes its own (below) and
            # moves search_seq along; a large one leaves them to the indexer (memory_app.fulltext).
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {Context._meta.db_table} SET last_seq = last_seq + %s, "  # noqa: S608 - constant
                    "search_seq = CASE WHEN %s AND search_seq = last_seq THEN last_seq + %s ELSE search_seq END, "
                    "message_count = message_count + %s, token_count = token_count + %s, "
                    "last_activity_at = %s WHERE id = %s RETURNING last_seq, search_seq",
                    [len(new), not copy, len(new), len(new), sum(counts or ()), timezone.now(), context.pk],
                )
                last, searched = cursor.fetchone()
            first = last - len(new) + 1
            if copy:
                new_rows = _copy_messages(context_id=context.pk, specs=specs, first_seq=first, tokenizer=tokenizer)
                with connection.cursor() as cursor:
                    cursor.execute(
                        f"UPDATE {Context._meta.db_table} SET token_count = token_count + %s WHERE id = %s",  # noqa: S608
                        [sum(r.token_count for r in new_rows), context.pk],
                    )
            else:
                new_rows = [
                    _new_message(context_id=context.pk, client_id=cid, seq=first + offset, token_count=count,
                                 tokenizer=tokenizer, **data)
                    for offset, ((cid, data), count) in enumerate(zip(specs, counts, strict=True))
                ]
                Message.objects.bulk_create(new_rows)
            for n, row in zip(new, new_rows, strict=True):
                results[n] = row
            if searched == last:
                fulltext.index_messages(context.pk, first, last)
            else:
                transaction.on_commit(_wake_indexer)
            _after_messages_created(new_rows, [vectors[n] for n in new])
    return AppendResult(messages=results, created=created_flags)


def lock_contexts(ids) -> None:
    """Take the row locks of these contexts (in id order) before any of their messages' rows.

    Writers that change a message's text, pruned state or existence fire migration 0013's
    triggers, which lock the message's context row (the full-text indexer holds it while it
    writes a context's vectors). Locking the context first keeps one order, context then
    message, with appenders and AgentScope's state import, which lock it first too: two
    writers never each hold what the other waits for."""
    ids = sorted({int(i) for i in ids})
    if ids:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {Context._meta.db_table} WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE",  # noqa: S608
                [ids],
            )


def _wake_indexer() -> None:

    backlog.wake_indexer()


_MESSAGE_COLUMNS = [(f.attname, f) for f in Message._meta.concrete_fields]
_MESSAGE_ATTNAMES = frozenset(a for a, _ in _MESSAGE_COLUMNS)


def _new_message(**values: Any) -> Message:
    """`Message(**values)` built positionally, as `Model.from_db` builds rows: Django's keyword
    path (a default and a descriptor per field) cost ~15 ms of a 1,000-message batch."""
    _check_message_fields(values)
    return Message(*[values[a] if a in values else f.get_default() for a, f in _MESSAGE_COLUMNS])


def _check_message_fields(values: dict[str, Any]) -> None:
    if unknown := values.keys() - _MESSAGE_ATTNAMES:
        raise TypeError(f"Message has no field {sorted(unknown)[0]!r}")


def _message_factory():
    """What `_new_message` builds, for a batch: when nothing listens to the model's pre_init /
    post_init signals, the instance's `__dict__` is filled directly (what `Model.__init__`'s
    per-field setattr leaves there for a new instance: no related object is cached yet), in a
    third of the time (≈ 4 against 12 µs a row)."""
    if pre_init.has_listeners(Message) or post_init.has_listeners(Message):
        return _new_message
    new, state, defaults = Message.__new__, ModelState, _MESSAGE_COLUMNS

    def build(**values: Any) -> Message:
        _check_message_fields(values)
        row = new(Message)
        row._state = state()
        fields = row.__dict__
        fields.update(values)
        for attname, f in defaults:
            if attname not in fields:
                fields[attname] = f.get_default()
        return row

    return build


# From this many rows on, COPY beats a multi-row INSERT: psycopg merges every parameter of an
# INSERT into its text (19 per message) and Django compiles it, ~200 ms for 1,000 messages.
COPY_THRESHOLD = 50
# Rows counted and written per step of the COPY stream (≈ 35 KB of typical messages: about one
# of psycopg's 32 KB sends).
COPY_CHUNK = 100
_COPY_COLUMNS = (
    "id", "context_id", "seq", "client_id", "role", "name", "text", "content", "tags", "metadata",
    "run_id", "step_id", "token_count", "tokenizer", "source_timestamp", "created_at", "updated_at",
    "pruned_by", "key_order",
)


def _json_text(value: Any) -> str:
    """A JSON column's value as COPY text: orjson (a tenth of psycopg's per-row `json.dumps`),
    the standard library for what orjson cannot write exactly (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value)


# COPY's text format: one line per row, columns separated by tabs, NULL as \N; a backslash,
# newline, carriage return or tab inside a value is written as a backslash escape.
_COPY_SPECIAL = re.compile(r"[\\\n\r\t]")
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})
_COPY_NULL = "\\N"


def _copy_text(value: str) -> str:
    return value.translate(_COPY_ESCAPES) if _COPY_SPECIAL.search(value) else value


def _copy_array(values: list) -> str:
    """A text[] value as COPY text: an array literal with every element quoted (None is a NULL
    element, anything else its `str`, as Django's ArrayField of CharField writes it)."""
    if not values:
        return "{}"
    quoted = ",".join(
        "NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values
    )
    return _copy_text("{" + quoted + "}")


def _copy_line(values: tuple) -> str:
    """One row in COPY text format (written here rather than by psycopg's per-value dumpers,
    ≈ 4 against 11 µs a row): None, `int`, a list (text[]), anything else as its `str` (as
    Django's CharField and TextField write it: a TextChoices member is its value); JSON and
    timestamps come as their text already."""
    out = []
    for v in values:
        if v is None:
            out.append(_COPY_NULL)
        elif type(v) is str:
            out.append(_copy_text(v))
        elif type(v) is int:
            out.append(str(v))
        elif type(v) is list:
            out.append(_copy_array(v))
        else:
            out.append(_copy_text(str(v)))
    return "\t".join(out) + "\n"


def _copy_messages(
    *, context_id: int, specs: list[tuple[str | None, dict[str, Any]]], first_seq: int, tokenizer: str
) -> list[Message]:
    """Insert new messages (`(client_id, prepared fields)`, seqs from `first_seq` on) with one
    COPY and return them as saved rows; ids are drawn from the table's sequence first so the
    objects come back with their primary keys, as bulk_create would give them.

    Tokens are counted and rows built chunk by chunk while the COPY is open: psycopg sends the
    rows every 32 KB, so PostgreSQL (another process, on another core) parses a chunk and
    stores it while Python counts the next one, instead of waiting for all
    of Python's work first (tiktoken was a fifth of a 1,000-message batch, the server's side of
    the COPY about a third). Chunks rather than rows: tiktoken's tables and Python's objects
    each stay in the CPU's caches for a run of rows (interleaving them row by row cost more
    CPU than it overlapped)."""
    table = Message._meta.db_table
    now = timezone.now()
    stamp = now.isoformat()
    encode = tokens.get_encoding(tokenizer).encode_ordinary
    token_text = tokens.token_text
    build = _message_factory()
    rows: list[Message] = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [table, len(specs)],
        )
        ids = [pk for (pk,) in cursor.fetchall()]
        columns = ", ".join(_COPY_COLUMNS)
        with _copy_errors_as_django(), cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:  # noqa: S608 - constants
            for lo in range(0, len(specs), COPY_CHUNK):
                chunk = specs[lo:lo + COPY_CHUNK]
                counts = [len(encode(token_text(d["text"], d["content"]))) for _, d in chunk]
                lines = []
                for offset, ((cid, d), count) in enumerate(zip(chunk, counts, strict=True), start=lo):
                    pk, seq = ids[offset], first_seq + offset
                    r = build(
                        id=pk, context_id=context_id, client_id=cid, seq=seq, tokenizer=tokenizer,
                        token_count=count, created_at=now, updated_at=now, **d,
                    )
                    rows.append(r)
                    lines.append(_copy_line((
                        pk, context_id, seq, cid, r.role, r.name, r.text,
                        None if r.content is None else _json_text(r.content), list(r.tags),
                        _json_text(r.metadata), r.run_id, r.step_id, count, tokenizer, r.source_timestamp,
                        stamp, stamp, r.pruned_by, None if r.key_order is None else _json_text(r.key_order),
                    )))
                copy.write("".join(lines))
    return rows


@contextlib.contextmanager
def _copy_errors_as_django() -> Iterator[None]:
    """A COPY runs on psycopg's own cursor, whose errors Django does not translate: a client id
    stored by a concurrent writer between our check and our COPY must still be Django's
    IntegrityError (messages_append retries on it; elsewhere the API's 409)."""
    try:
        yield
    except psycopg.errors.IntegrityError as exc:
        raise IntegrityError(str(exc)) from exc


def _check_links(*, context: Context, items: list[dict[str, Any]]) -> None:
    """Messages may link only to runs and steps of their own context (others: NotFound)."""
    for link, qs in (
        ("run_id", Run.objects.filter(context=context)),
        ("step_id", Step.objects.filter(run__context=context)),
    ):
        wanted = {i[link] for i in items if i.get(link)}
        if wanted:
            found = set(qs.filter(pk__in=wanted).values_list("pk", flat=True))
            if missing := wanted - found:
                raise NotFound(f"{link.removesuffix('_id')} {sorted(missing)[0]} not found in this context")


def _after_messages_created(rows: list[Message], vectors: list | None = None) -> None:
    """Work that follows every new message: client vectors stored (COPY), and the others queued
    for the configured model's worker."""

    vectors = vectors or [None] * len(rows)
    client_vectors.vectors_copy(
        [(row.pk, None, row.context_id, v) for row, v in zip(rows, vectors, strict=True) if v is not None]
    )
    active = providers.active_model_name()
    queue.enqueue_messages(
        [row for row, v in zip(rows, vectors, strict=True) if v is None or v.model != active]
    )


def message_edit(
    *, message: Message, actor: Actor, text: str | None = None, tags: list[str] | None = None,
    metadata: dict | None = None,
) -> Message:
    """Edit a message; the previous version is kept in the audit event."""
    if _unstorable(text) or _unstorable(tags) or _unstorable(metadata):
        raise Invalid(
            "text, tags and metadata cannot hold NUL characters or lone surrogates"
            " (PostgreSQL stores UTF-8 text without NUL)"
        )
    with transaction.atomic():
        lock_contexts([message.context_id])
        message = Message.objects.select_for_update().get(pk=message.pk)
        before = {"text": message.text, "tags": message.tags, "metadata": message.metadata}
        update_fields = ["updated_at"]
        if text is not None and text != message.text:
            [count] = tokens.count_tokens(
                [tokens.token_text(text, message.content)], tokenizer=message.tokenizer or None
            )
            Context.objects.filter(pk=message.context_id).update(token_count=F("token_count") + count - message.token_count)
            message.text, message.token_count = text, count
            update_fields += ["text", "token_count"]
        if tags is not None:
            message.tags = list(tags)
            update_fields.append("tags")
        if metadata is not None:
            message.metadata = metadata
            update_fields.append("metadata")
        message.save(update_fields=update_fields)
        after = {"text": message.text, "tags": message.tags, "metadata": message.metadata}
        if after != before:
            audit_record(
                actor=actor, action="edit", target_type="message", target_ids=[message.pk],
                context_id=message.context_id, before=before, after=after,
            )
            if "text" in update_fields:

                queue.requeue_message(message)
    return message


def messages_retag(
    *, context: Context, tags_by_id: dict[int, list[str]], actor: Actor, note: str = ""
) -> list[int]:
    """Set the tags of several messages of one context at once (AgentScope's marks); one audit
    event keeps every changed message's tags before and after. Answers the changed ids."""
    if _unstorable(list(tags_by_id.values())):
        raise Invalid("tags cannot hold NUL characters (PostgreSQL cannot store them)")
    with transaction.atomic():
        rows = list(
            Message.objects.select_for_update().filter(context=context, pk__in=list(tags_by_id)).order_by("pk")
        )
        if len(rows) != len(tags_by_id):
            missing = sorted(set(tags_by_id) - {r.pk for r in rows})
            raise NotFound(f"message {missing[0]} not found")
        changed = [r for r in rows if list(r.tags) != list(tags_by_id[r.pk])]
        if not changed:
            return []
        before = {str(r.pk): list(r.tags) for r in changed}
        for r in changed:
            r.tags = list(tags_by_id[r.pk])
        Message.objects.bulk_update(changed, ["tags"])
        audit_record(
            actor=actor, action="edit", target_type="message", target_ids=[r.pk for r in changed],
            context_id=context.pk, before={"tags": before},
            after={"tags": {str(r.pk): r.tags for r in changed}}, note=note,
        )
    return [r.pk for r in changed]


def _unstorable(value: Any) -> bool:
    """True when a NUL character or a lone surrogate (no UTF-8 form) hides anywhere in a string,
    list or dict (keys included): PostgreSQL text can hold neither."""
    if isinstance(value, str):
        return "\x00" in value or not value.isascii() and _has_surrogate(value)
    if isinstance(value, dict):
        return any(_unstorable(k) or _unstorable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_unstorable(v) for v in value)
    return False


def _has_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def messages_set_pruned(
    *, context: Context, ids: list[int], pruned: bool, actor: Actor, note: str = ""
) -> tuple[list[int], AuditEvent | None]:
    """Prune (soft delete) or restore messages of one context; one audit event lists the ids.

    Ids not in the context raise NotFound (nothing changes); ids already in the wanted state are
    left alone and not listed.
    """
    return _set_pruned(model=Message, scope={"context": context}, ids=ids, pruned=pruned, actor=actor,
                       context_id=context.pk, note=note)


def steps_set_pruned(
    *, run: Run, ids: list[int], pruned: bool, actor: Actor, note: str = ""
) -> tuple[list[int], AuditEvent | None]:
    return _set_pruned(model=Step, scope={"run": run}, ids=ids, pruned=pruned, actor=actor,
                       context_id=run.context_id, note=note)


def _set_pruned(*, model, scope, ids, pruned, actor, context_id, note):
    ids = list(dict.fromkeys(int(i) for i in ids))
    with transaction.atomic():
        if model is Message:
            lock_contexts([context_id])
        rows = list(model.objects.select_for_update().filter(pk__in=ids, **scope).values_list("pk", "pruned_at"))
        if len(rows) != len(ids):
            missing = sorted(set(ids) - {pk for pk, _ in rows})
            raise NotFound(f"{model._meta.model_name} {missing[0]} not found")
        changing = sorted(pk for pk, at in rows if (at is None) == pruned)
        if not changing:
            return [], None
        if pruned:
            model.objects.filter(pk__in=changing).update(pruned_at=timezone.now(), pruned_by=actor.label)
        else:
            model.objects.filter(pk__in=changing).update(pruned_at=None, pruned_by="")
        event = audit_record(
            actor=actor, action="prune" if pruned else "restore", target_type=model._meta.model_name,
            target_ids=changing, context_id=context_id, note=note,
        )
    return changing, event


# --- runs, steps, tool calls --------------------------------------------------------------------

RUN_FIELDS = ("task", "system_prompt", "agent_name", "framework", "metadata")


def run_create(
    *, context: Context, client_id: str | None = None, task: str = "", system_prompt: str = "",
    agent_name: str = "", framework: str = "", metadata: dict | None = None, started_at=None,
) -> tuple[Run, bool]:
    data = {
        "task": task or "", "system_prompt": system_prompt or "", "agent_name": agent_name or "",
        "framework": framework or "", "metadata": metadata or {},
    }
    with transaction.atomic():
        if client_id:
            stored = Run.objects.filter(context=context, client_id=client_id).first()
            if stored is not None:
                diff = differences({k: getattr(stored, k) for k in RUN_FIELDS}, data)
                if diff:
                    raise Conflict(f"run {client_id!r} already exists with different content", diff)
                return stored, False
        try:
            with transaction.atomic():
                # No started_at unless the agent gives one: the server's clock at this call is not
                # when the agent started (an import arrives long after); run_finish fills it in.
                run = Run.objects.create(context=context, client_id=client_id or None, started_at=started_at, **data)
        except IntegrityError:
            # A concurrent writer created it first: answer as a repeat would.
            return run_create(context=context, client_id=client_id, started_at=started_at, **data)
        Context.objects.filter(pk=context.pk).update(run_count=F("run_count") + 1, last_activity_at=timezone.now())
    return run, True


def run_update(
    *, run: Run, task: str | None = None, system_prompt: str | None = None, agent_name: str | None = None,
    started_at=None,
) -> Run:
    """Fill in a run's description once it is known (a trace tells the task only at its end)."""
    given = {"task": task, "system_prompt": system_prompt, "agent_name": agent_name, "started_at": started_at}
    fields = {k: v for k, v in given.items() if v is not None and v != getattr(run, k)}
    if fields:
        Run.objects.filter(pk=run.pk).update(**fields, updated_at=timezone.now())
        for name, value in fields.items():
            setattr(run, name, value)
    return run


STEP_FIELDS = (
    "kind", "step_number", "task", "plan", "model_input_messages", "model_output_message", "model_output",
    "code_action", "observations", "action_output", "error_type", "error_message", "start_time",
    "end_time", "duration", "input_tokens", "output_tokens", "total_tokens", "model", "cost", "is_final_answer",
    "payload",
)
TOOL_CALL_FIELDS = ("call_id", "name", "arguments", "output", "success", "duration")


def _step_data(item: dict[str, Any]) -> dict[str, Any]:
    data = {k: item.get(k) for k in STEP_FIELDS}
    data["is_final_answer"] = bool(item.get("is_final_answer"))
    data["model"] = data["model"] or ""
    if data["duration"] is None and data["start_time"] is not None and data["end_time"] is not None:
        data["duration"] = data["end_time"] - data["start_time"]
    if data["total_tokens"] is None and data["input_tokens"] is not None and data["output_tokens"] is not None:
        data["total_tokens"] = data["input_tokens"] + data["output_tokens"]
    return data


def _tool_call_data(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "call_id": item.get("call_id") or "", "name": item["name"], "arguments": item.get("arguments"),
        "output": item.get("output"), "success": item.get("success"), "duration": item.get("duration"),
    }


@dataclass
class StepsResult:
    steps: list[Step]
    created: list[bool] = field(default_factory=list)

    @property
    def any_created(self) -> bool:
        return any(self.created)


def steps_append(*, run: Run, items: list[dict[str, Any]]) -> StepsResult:
    """Append steps (each with its tool calls) to a run, all or nothing, positions in order."""
    if len(items) > MAX_BATCH:
        raise Invalid(f"at most {MAX_BATCH} steps per request, got {len(items)}")
    client_ids = [i.get("client_id") for i in items if i.get("client_id")]
    if len(set(client_ids)) != len(client_ids):
        raise Invalid("client ids repeat within the batch")
    with transaction.atomic():
        locked = Run.objects.select_for_update().only("id", "last_position", "context_id").get(pk=run.pk)
        existing = {s.client_id: s for s in Step.objects.filter(run=run, client_id__in=client_ids)} if client_ids else {}
        results: list[Step] = []
        created: list[bool] = []
        new_steps: list[tuple[Step, list[dict]]] = []
        for item in items:
            data = _step_data(item)
            calls = [_tool_call_data(c) for c in item.get("tool_calls") or []]
            cid = item.get("client_id")
            if cid and cid in existing:
                stored = existing[cid]
                diff = differences({k: getattr(stored, k) for k in STEP_FIELDS}, data)
                stored_calls = [
                    {k: getattr(tc, k) for k in TOOL_CALL_FIELDS} for tc in stored.tool_calls.order_by("position")
                ]
                if stored_calls != calls:
                    diff["tool_calls"] = {"stored": stored_calls, "sent": calls}
                if diff:
                    raise Conflict(f"step {cid!r} already exists with different content", diff)
                results.append(stored)
                created.append(False)
                continue
            step = Step(run_id=run.pk, client_id=cid or None, **data)
            new_steps.append((step, calls))
            results.append(step)
            created.append(True)
        if new_steps:
            for offset, (step, _) in enumerate(new_steps, start=1):
                step.position = locked.last_position + offset
            Step.objects.bulk_create([s for s, _ in new_steps])
            ToolCall.objects.bulk_create(
                [ToolCall(step=s, position=i, **c) for s, calls in new_steps for i, c in enumerate(calls, start=1)]
            )
            errors = sum(1 for s, _ in new_steps if s.error_type)
            Run.objects.filter(pk=run.pk).update(
                last_position=F("last_position") + len(new_steps),
                step_count=F("step_count") + len(new_steps),
                error_count=F("error_count") + errors,
            )
            Context.objects.filter(pk=locked.context_id).update(last_activity_at=timezone.now())
    return StepsResult(steps=results, created=created)


def run_finish(
    *, run: Run, status: str, final_answer: Any = None, input_tokens: int | None = None,
    output_tokens: int | None = None, total_tokens: int | None = None, finished_at=None,
) -> Run:
    """Mark a run finished; token totals default to the sum over its steps.

    Its start and end are the agent's when known: the times it gave, else the span of its steps'
    own timings, and only then the server's (creation, now). Mixing the server's clock with the
    steps' made an imported 5 s run last 6 ms (both stamped on arrival) or a 6 min one 347 ms.
    """
    if status not in RunStatus.values or status == RunStatus.RUNNING:
        raise Invalid(f"status must be one of {[s for s in RunStatus.values if s != RunStatus.RUNNING]}")
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        sums = run.steps.aggregate(
            i=Sum("input_tokens"), o=Sum("output_tokens"), t=Sum("total_tokens"), **STEP_SPAN
        )
        if input_tokens is None and output_tokens is None and total_tokens is None:
            input_tokens, output_tokens, total_tokens = sums["i"], sums["o"], sums["t"]
        elif total_tokens is None and input_tokens is not None and output_tokens is not None:
            total_tokens = input_tokens + output_tokens
        run.status = status
        run.final_answer = final_answer
        run.input_tokens, run.output_tokens, run.total_tokens = input_tokens, output_tokens, total_tokens
        run.started_at, run.finished_at = run_span(
            started_at=run.started_at, finished_at=finished_at, first_start=sums["first_start"],
            last_end=sums["last_end"], created_at=run.created_at,
        )
        run.duration = max(0.0, (run.finished_at - run.started_at).total_seconds())
        run.save()
    return run


# The steps' own timing span (Unix seconds on the agent's clock); a step with a start and a
# duration but no end still counts to its start + duration.
STEP_SPAN = {
    "first_start": Min("start_time"),
    "last_end": Max(Coalesce("end_time", F("start_time") + F("duration"), "start_time")),
}


def run_span(*, started_at, finished_at, first_start, last_end, created_at):
    """(start, end) of a run: the agent's stated times, else its steps' span, else the server's."""
    if started_at is None:
        started_at = _from_epoch(first_start) or created_at or timezone.now()
    if finished_at is None:
        finished_at = _from_epoch(last_end) or timezone.now()
    return started_at, max(finished_at, started_at)


def _from_epoch(value: float | None):
    return datetime.fromtimestamp(value, tz=UTC) if value is not None else None


def steps_order_by_start(*, run: Run) -> bool:
    """Renumber a run's steps by start time (steps without one keep their place after those
    with one), for writers whose steps arrive out of order (OpenTelemetry spans). True when
    positions changed. Positions stay 1..n; step ids, and the links to them, do not change."""
    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run.pk).first()
        rows = list(Step.objects.filter(run=run).values_list("pk", "position", "start_time"))
        wanted = sorted(rows, key=lambda r: (r[2] is None, r[2] or 0.0, r[1]))
        if [r[0] for r in wanted] == [r[0] for r in sorted(rows, key=lambda r: r[1])]:
            return False
        # (run, position) is unique and checked row by row: move every step out of the way first.
        shift = max(r[1] for r in rows)
        Step.objects.filter(run=run).update(position=F("position") + shift)
        for position, (pk, _, _) in enumerate(wanted, start=1):
            Step.objects.filter(pk=pk).update(position=position)
    return True


# --- OpenTelemetry spans (staging for memory_app.traces) ----------------------------------------

SPAN_FIELDS = ("parent_span_id", "name", "role", "start_ns", "end_ns", "data")


def trace_spans_record(*, context: Context, spans: list[dict[str, Any]]) -> tuple[list[TraceSpan], list[str]]:
    """Keep received spans; a span id already kept is not written again.

    Returns the new rows and the ids of re-sent spans whose content differs from the kept one
    (the kept one wins: a span does not change once it has ended).
    """
    ids = {(s["trace_id"], s["span_id"]) for s in spans}
    if len(ids) != len(spans):
        raise Invalid("a span id repeats within the request")
    with transaction.atomic():
        stored = {}
        for trace_id in {s["trace_id"] for s in spans}:
            wanted = [s["span_id"] for s in spans if s["trace_id"] == trace_id]
            for row in TraceSpan.objects.filter(context=context, trace_id=trace_id, span_id__in=wanted):
                stored[(row.trace_id, row.span_id)] = row
        new, differing = [], []
        for s in spans:
            row = stored.get((s["trace_id"], s["span_id"]))
            if row is None:
                new.append(TraceSpan(context=context, trace_id=s["trace_id"], span_id=s["span_id"],
                                     **{k: s[k] for k in SPAN_FIELDS}))
            elif any(getattr(row, k) != s[k] for k in SPAN_FIELDS):
                differing.append(s["span_id"])
        TraceSpan.objects.bulk_create(new)
    return new, differing
