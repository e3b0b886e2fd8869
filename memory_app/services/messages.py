"""Writes of messages: append (one, or a batch through COPY), edit and retag.

Every function is keyword-only, runs in one transaction, and either does all its work or none
of it. Idempotency: a message carrying a client id that is already stored returns the stored
row and writes nothing when the content is the same, and raises `Conflict` naming the fields
that differ when it is not."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, router, transaction
from django.db.models import BooleanField, F, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from memory_app import backlog, db, pipelines, scale_out, tokens
from memory_app.audit import Actor, audit_record
from memory_app.db import copy_errors_as_django, gc_paused, lock_contexts
from memory_app.embeddings import client_vectors, providers, queue
from memory_app.errors import Conflict, Invalid, NotFound, differences
from memory_app.models import (
    AuditEvent,
    Context,
    Message,
    Run,
    Step,
)
from memory_app.new_message import MESSAGE_FIELDS, NewMessage
from memory_app.search import fulltext
from memory_app.services import message_rows

MAX_BATCH = 1000


def _as_new_message(item: NewMessage | Mapping[str, Any]) -> NewMessage:
    # A mapping of NewMessage's fields is taken too (scripts, tests); an unknown key is a
    # TypeError, as for NewMessage(...) itself.
    return item if isinstance(item, NewMessage) else NewMessage(**item)


@dataclass
class AppendResult:
    messages: list[Message]
    created: list[bool] = field(default_factory=list)

    @property
    def any_created(self) -> bool:
        return any(self.created)


def messages_append(
    *,
    context: Context,
    items: Sequence[NewMessage | Mapping[str, Any]],
    tokenizer: str | None = None,
) -> AppendResult:
    """Append messages (`NewMessage`, or mappings of its fields) to a context, all or nothing.

    Seqs are allocated under the context's row lock, so they are gap-free and strictly
    increasing whatever the number of concurrent writers.
    """
    items = [_as_new_message(i) for i in items]
    if len(items) < COPY_THRESHOLD:
        return _messages_append(context=context, items=items, tokenizer=tokenizer)
    with gc_paused():
        return _messages_append(context=context, items=items, tokenizer=tokenizer)


def _messages_append(
    *, context: Context, items: list[NewMessage], tokenizer: str | None
) -> AppendResult:
    if not items:
        return AppendResult(messages=[])
    if len(items) > MAX_BATCH:
        raise Invalid(f"at most {MAX_BATCH} messages per request, got {len(items)}")
    client_ids = [i.client_id for i in items if i.client_id]
    if len(set(client_ids)) != len(client_ids):
        raise Invalid("client ids repeat within the batch")

    # Client vectors are checked before anything is written (a wrong dimension names the item).
    vectors = client_vectors.client_vectors(
        [(i.vector, i.vector_model, None) for i in items], label="messages"
    )
    tokenizer = tokenizer or tokens.default_tokenizer_name()
    tokens.get_encoding(tokenizer)  # an unknown tokenizer fails before any work
    _check_links(context=context, items=items)

    args = {
        "context": context,
        "items": items,
        "vectors": vectors,
        "client_ids": client_ids,
        "tokenizer": tokenizer,
    }
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


def _append_once(*, context, items, vectors, client_ids, tokenizer) -> AppendResult:
    # A small batch without vectors, in a caller's transaction (or on Citus from more than
    # ONE_STATEMENT_MAX messages), sends BEGIN with the counters' UPDATE and the full-text row
    # with COMMIT (pipelines.pipelined); COPY cannot run in a pipeline.
    pipelined = len(items) < COPY_THRESHOLD and all(v is None for v in vectors)
    if pipelined and not connection.in_atomic_block:
        done = _append_in_one_statement(context, items, client_ids, tokenizer)
        if done is not None:
            return done
    with pipelines.pipelined() if pipelined else contextlib.nullcontext(), transaction.atomic():
        existing = _stored_by_client_id(context, client_ids)
        results, created_flags, new = _match_repeats(items, existing)
        if new:
            specs = [items[n] for n in new]
            copy = len(new) >= COPY_THRESHOLD
            # Repeats are not counted. A small batch is counted before the lock (the UPDATE in
            # `_allocate_seqs` takes it); a large one inside its COPY stream (`_copy_messages`).
            counts = (
                None
                if copy
                else tokens.count_tokens(
                    [tokens.token_text(m.text, m.content) for m in specs],
                    tokenizer=tokenizer,
                )
            )
            last, searched = _allocate_seqs(
                context, len(new), own_vectors=not copy, token_count=sum(counts or ())
            )
            first = last - len(new) + 1
            if copy:
                new_rows = _copy_messages(
                    context_id=context.pk, specs=specs, first_seq=first, tokenizer=tokenizer
                )
                _add_tokens(context, sum(r.token_count for r in new_rows))
            else:
                new_rows = message_rows.insert_messages(context, specs, counts, first, tokenizer)
            for n, row in zip(new, new_rows, strict=True):
                results[n] = row
            if searched == last:
                fulltext.index_messages(context.pk, first, last)
            else:
                transaction.on_commit(_wake_indexer)
            _after_messages_created(new_rows, [vectors[n] for n in new])
    return AppendResult(messages=results, created=created_flags)


def _append_in_one_statement(context, items, client_ids, tokenizer) -> AppendResult | None:
    """A small append outside a caller's transaction: the repeats' check (when the items carry
    client ids), then everything else in one statement of its own, two round trips at most
    where the pipelined path takes four. Up to ONE_STATEMENT_MAX new messages, an INSERT whose
    rows take their seqs from the table's trigger (`message_rows.append_taking_seqs`); more, on
    one node, the CTE that updates the counters once (`message_rows.append_statement`), and on
    Citus, where that CTE is planned in steps, nothing (None: the pipelined path). None too
    when the statement failed on a row's fault, which may be a full-text vector's: the caller
    then appends through the pipelined path, which keeps the message and stores the vector's
    error (a fault of the message itself fails there too, as it would have)."""
    results, created_flags, new = _match_repeats(items, _stored_by_client_id(context, client_ids))
    if not new:
        return AppendResult(messages=results, created=created_flags)
    taking = len(new) <= ONE_STATEMENT_MAX
    if not taking and _sharded():
        return None
    specs = [items[n] for n in new]
    counts = tokens.count_tokens(
        [tokens.token_text(m.text, m.content) for m in specs], tokenizer=tokenizer
    )
    queue_model = providers.active_model_name()
    try:
        if taking:
            # The trigger wrote the full-text rows if the context's were caught up, and says
            # when it left one to the indexer.
            rows, behind = message_rows.append_taking_seqs(
                context, specs, counts, tokenizer, queue_model
            )
        else:
            rows, last, searched = message_rows.append_statement(
                context, specs, counts, tokenizer, queue_model
            )
            behind = searched != last
    except DatabaseError as exc:
        # A client id stored meanwhile: `_messages_append` looks again.
        if "message_client_id_unique" not in str(exc) and fulltext.row_fault(exc):
            return None
        raise
    for n, row in zip(new, rows, strict=True):
        results[n] = row
    if behind:
        _wake_indexer()
    return AppendResult(messages=results, created=created_flags)


def _sharded() -> bool:
    """On Citus every statement names one shard: `message_rows.append_statement`, whose parts
    read each other's rows, is planned in steps there."""
    return scale_out.table_is_distributed(Message._meta.db_table)


def _stored_by_client_id(context: Context, client_ids: list[str]) -> dict[str, Message]:
    """The context's stored messages carrying one of these client ids, by client id, read on the
    primary: the write that follows trusts the answer, and a read replica a moment behind would
    not know a repeat the primary already holds (the one-statement append reads it before its
    transaction, where the router would otherwise send it to the replica)."""
    if not client_ids:
        return {}
    # `= ANY(array)`: one parameter instead of an IN list of up to 1,000 that Django compiles and
    # psycopg merges into the text.
    return {
        m.client_id: m
        for m in Message.objects.using(router.db_for_write(Message)).filter(
            RawSQL("client_id = ANY(%s)", [client_ids], output_field=BooleanField()),  # noqa: S611 - constant SQL
            context=context,
        )
    }


def _match_repeats(
    items: list[NewMessage], existing: dict[str, Message]
) -> tuple[list[Message | None], list[bool], list[int]]:
    """Each item's stored message when it repeats one (`Conflict` when its content differs),
    None where it is new; whether each is created; and the positions in `items` of the new."""
    results: list[Message | None] = []
    created_flags: list[bool] = []
    new: list[int] = []
    for n, item in enumerate(items):
        cid = item.client_id
        if cid and cid in existing:
            stored = existing[cid]
            diff = differences(
                {k: getattr(stored, k) for k in MESSAGE_FIELDS},
                {k: getattr(item, k) for k in MESSAGE_FIELDS},
            )
            if diff:
                raise Conflict(f"message {cid!r} already exists with different content", diff)
            results.append(stored)
            created_flags.append(False)
            continue
        new.append(n)
        results.append(None)
        created_flags.append(True)
    return results, created_flags, new


def _allocate_seqs(
    context: Context, n: int, *, own_vectors: bool, token_count: int
) -> tuple[int, int]:
    """Take the context's row lock, allocate `n` seqs and count them in; the new last_seq and
    search_seq.

    One statement: concurrent appenders queue here, so seqs are gap-free and strictly
    increasing. A small batch to a context whose full-text vectors are caught up writes its own
    (`own_vectors`) and moves search_seq along; a large one leaves them to the indexer
    (memory_app.search.fulltext). NotFound when the context does not exist (an append may name
    it by id alone, nothing read)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Context._meta.db_table} SET last_seq = last_seq + %s, "  # noqa: S608 - constant
            "search_seq = CASE WHEN %s AND search_seq = last_seq THEN last_seq + %s "
            "ELSE search_seq END, "
            "message_count = message_count + %s, token_count = token_count + %s, "
            "last_activity_at = %s WHERE id = %s RETURNING last_seq, search_seq",
            [n, own_vectors, n, n, token_count, timezone.now(), context.pk],
        )
        counters = cursor.fetchone()
    if counters is None:
        raise NotFound(f"context {context.pk} not found")
    return counters


def _add_tokens(context: Context, token_count: int) -> None:
    """Count in the tokens of a COPY batch, known only once its stream is written."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Context._meta.db_table} SET token_count = token_count + %s "  # noqa: S608
            "WHERE id = %s",
            [token_count, context.pk],
        )


def _wake_indexer() -> None:
    backlog.wake_indexer()


# From this many rows on, COPY beats a multi-row INSERT: psycopg merges every parameter of an
# INSERT into its text (19 per message) and Django compiles it, which grows with the batch.
COPY_THRESHOLD = 50
# Up to this many new messages an append outside a transaction is one INSERT whose rows take
# their seqs from the table's trigger (`message_rows.append_taking_seqs`): the trigger updates
# the context's row once a message, a new row version each (no update of it is HOT), which
# costs more than the CTE's one UPDATE from about five messages on (alternated in-process: 1 and
# 2 messages 0.5-0.9 ms faster, 4 and 6 even, 49 messages 5 ms slower).
ONE_STATEMENT_MAX = 4
# Rows counted and written per step of the COPY stream (≈ 35 KB of typical messages: about one
# of psycopg's 32 KB sends).
COPY_CHUNK = 100


# One COPY stream that counts, builds and sends rows chunk by chunk (the docstring says why);
# its steps share the open stream and the loop's running state, and read best in one piece.
def _copy_messages(
    *,
    context_id: int,
    specs: list[NewMessage],
    first_seq: int,
    tokenizer: str,
) -> list[Message]:
    """Insert new messages (seqs from `first_seq` on) with one
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
    encode = tokens.get_encoding(tokenizer).encode_ordinary
    token_text = tokens.token_text
    build = message_rows.copy_builder(
        context_id=context_id, tokenizer=tokenizer, now=timezone.now()
    )
    rows: list[Message] = []
    with connection.cursor() as cursor:
        (ids,) = db.draw_ids([(Message, len(specs))])
        columns = ", ".join(message_rows.COPY_COLUMNS)
        with (
            copy_errors_as_django(),
            cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
        ):  # noqa: S608 - constants
            for lo in range(0, len(specs), COPY_CHUNK):
                chunk = specs[lo : lo + COPY_CHUNK]
                counts = [len(encode(token_text(m.text, m.content))) for m in chunk]
                lines = []
                for offset, (m, count) in enumerate(zip(chunk, counts, strict=True), start=lo):
                    row, line = build(m, ids[offset], first_seq + offset, count)
                    rows.append(row)
                    lines.append(line)
                copy.write("".join(lines))
    return rows


def _check_links(*, context: Context, items: list[NewMessage]) -> None:
    """Messages may link only to runs and steps of their own context (others: NotFound)."""
    # The querysets are built only for a link some item names: most appends name none.
    for link, model in (("run_id", Run), ("step_id", Step)):
        wanted = {getattr(i, link) for i in items if getattr(i, link)}
        if wanted:
            qs = model.objects.filter(context=context, pk__in=wanted)
            found = set(qs.values_list("pk", flat=True))
            if missing := wanted - found:
                # An append may name its context by id alone, unread: a missing context is
                # what is not found then, not the run it names.
                if not Context.objects.filter(pk=context.pk).exists():
                    raise NotFound(f"context {context.pk} not found")
                raise NotFound(
                    f"{link.removesuffix('_id')} {sorted(missing)[0]} not found in this context"
                )


def _after_messages_created(rows: list[Message], vectors: list | None = None) -> None:
    """Work that follows every new message: client vectors stored (COPY), and the others queued
    for the configured model's worker."""

    vectors = vectors or [None] * len(rows)
    if client_vectors.vectors_copy(
        [
            (row.pk, None, row.context_id, v)
            for row, v in zip(rows, vectors, strict=True)
            if v is not None
        ]
    ):
        transaction.on_commit(backlog.wake_indexer)
    active = providers.active_model_name()
    queue.enqueue_messages(
        [row for row, v in zip(rows, vectors, strict=True) if v is None or v.model != active]
    )


def message_edit(
    *,
    message: Message,
    actor: Actor,
    text: str | None = None,
    tags: list[str] | None = None,
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
        message = Message.objects.select_for_update().get(
            pk=message.pk, context_id=message.context_id
        )
        before = {"text": message.text, "tags": message.tags, "metadata": message.metadata}
        update_fields = ["updated_at"]
        if text is not None and text != message.text:
            [count] = tokens.count_tokens(
                [tokens.token_text(text, message.content)], tokenizer=message.tokenizer or None
            )
            Context.objects.filter(pk=message.context_id).update(
                token_count=F("token_count") + count - message.token_count
            )
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
                actor=actor,
                action="edit",
                target_type="message",
                target_ids=[message.pk],
                context_id=message.context_id,
                before=before,
                after=after,
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
            Message.objects.select_for_update()
            .filter(context=context, pk__in=list(tags_by_id))
            .order_by("pk")
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
        Message.objects.filter(context=context).bulk_update(changed, ["tags"])
        audit_record(
            actor=actor,
            action="edit",
            target_type="message",
            target_ids=[r.pk for r in changed],
            context_id=context.pk,
            before={"tags": before},
            after={"tags": {str(r.pk): r.tags for r in changed}},
            note=note,
        )
    return [r.pk for r in changed]


def message_versions(*, context_id: int, message_id: int) -> list[dict[str, Any]]:
    """Every version of a message's text/tags the audit remembers, oldest first, then the current
    (read in its context). What an edit kept, found again: nothing is lost until a purge."""
    events = (
        AuditEvent.objects.filter(
            action="edit", target_type="message", target_ids__contains=[message_id]
        )
        .filter(~Q(before__has_key="purged"))
        .order_by("id")
    )
    versions = [e.before for e in events if e.before]
    current = (
        Message.objects.filter(context_id=context_id, pk=message_id)
        .values("text", "tags", "metadata")
        .first()
    )
    if current is not None:
        versions.append(current)
    return versions


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
