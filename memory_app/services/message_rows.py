"""A small append's rows (`services.messages`): built from `NewMessage`s and written by one
multi-row INSERT, or, outside a caller's transaction, by one INSERT whose rows take their seqs
from the table's trigger, which updates the context's counters and writes the full-text rows
(the embedding queue's rows come from a CTE after it on one node, from a second trigger on
Citus: `append_taking_seqs`).

Both statements are written here, not compiled by the ORM (`bulk_create` compiled its INSERT
on every append, a quarter of a single append's time in Python): the columns the COPY of a
large batch writes, JSON as the ORM wrote it (`json.dumps`, so a NaN still fails the row
rather than turning into null; a `json` column keeps the text as written), ids read back."""

from __future__ import annotations

import datetime
import json
from typing import Any

from django.db import DatabaseError, connection
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils import timezone
from psycopg import sql as psycopg_sql

from memory_app import db, pipelines, scale_out
from memory_app.errors import NotFound
from memory_app.models import FTS_CONFIG, Context, Message
from memory_app.new_message import MESSAGE_FIELDS, NewMessage

MESSAGE_COLUMNS = [(f.attname, f) for f in Message._meta.concrete_fields]
_MESSAGE_ATTNAMES = frozenset(a for a, _ in MESSAGE_COLUMNS)
# The row's columns that come from the message as written (the write path adds the others).
WRITTEN = (*MESSAGE_FIELDS, "client_id", "key_order")

# What a new message row holds, in the order the COPY of a large batch writes it.
COPY_COLUMNS = (
    "id",
    "context_id",
    "seq",
    "client_id",
    "role",
    "name",
    "text",
    "content",
    "tags",
    "metadata",
    "run_id",
    "step_id",
    "token_count",
    "tokenizer",
    "source_timestamp",
    "created_at",
    "updated_at",
    "pruned_by",
    "key_order",
)


def new_message(message: NewMessage, **values: Any) -> Message:
    """The row of `message` with the write path's `values` (seq, counts...), built positionally
    as `Model.from_db` builds rows: Django's keyword path (a default and a descriptor per field)
    is a visible share of a large batch."""
    check_message_fields(values)
    for name in WRITTEN:
        values[name] = getattr(message, name)
    return Message(*[values[a] if a in values else f.get_default() for a, f in MESSAGE_COLUMNS])


def check_message_fields(values: dict[str, Any]) -> None:
    if unknown := values.keys() - _MESSAGE_ATTNAMES:
        raise TypeError(f"Message has no field {sorted(unknown)[0]!r}")


def message_factory():
    """What `new_message` builds, for a batch: when nothing listens to the model's pre_init /
    post_init signals, the instance's `__dict__` is filled directly (what `Model.__init__`'s
    per-field setattr leaves there for a new instance: no related object is cached yet), without
    a Python call per field."""
    if pre_init.has_listeners(Message) or post_init.has_listeners(Message):
        return new_message
    new, state, defaults = Message.__new__, ModelState, MESSAGE_COLUMNS

    def build(message: NewMessage, **values: Any) -> Message:
        check_message_fields(values)
        row = new(Message)
        row._state = state()
        fields = row.__dict__
        fields.update(values)
        for name in WRITTEN:
            fields[name] = getattr(message, name)
        for attname, f in defaults:
            if attname not in fields:
                fields[attname] = f.get_default()
        return row

    return build


# What `copy_builder` writes literally, in `message_factory`'s order: the write path's values,
# then the message's (`WRITTEN`), then the defaults (`_DEFAULTED`). Another layout of the model
# takes the generic builder.
_VALUES = ("id", "context_id", "seq", "tokenizer", "token_count", "created_at", "updated_at")
_LITERAL_WRITTEN = (
    "role",
    "name",
    "text",
    "content",
    "tags",
    "metadata",
    "run_id",
    "step_id",
    "source_timestamp",
    "client_id",
    "key_order",
)
_DEFAULTED = tuple(a for a, _ in MESSAGE_COLUMNS if a not in {*_VALUES, *WRITTEN})


# One closure per batch, read best in one piece: the row's dict and its line come from the same
# locals in one call per row (split into helpers, each would cost a call and its arguments per
# row, the very cost it removes).
def copy_builder(*, context_id: int, tokenizer: str, now: datetime.datetime):
    """A large batch's rows, each with its line of the COPY (`COPY_COLUMNS`' order): `build(
    message, pk, seq, token_count)` gives the row `message_factory` builds and the line
    `db.copy_line` writes of its values (`_generic_copy_builder`, taken when signals listen to
    the model or its fields are laid out otherwise).

    The row's `__dict__` is one dict display and the line one f-string; what every row of the
    batch shares (the context, the tokenizer, the timestamps, the defaults) is written once,
    and the common values (strings without a character to escape, no content, no tags, empty
    metadata) take no call: `copy_line`'s loop over nineteen values and the generic builder
    cost a third of a 1,000-message batch's Python time."""
    defaults = {a: f.get_default() for a, f in MESSAGE_COLUMNS if a in _DEFAULTED}
    if (
        message_factory() is new_message
        or WRITTEN != _LITERAL_WRITTEN
        or _DEFAULTED != ("pruned_at", "pruned_by")
        or any(f.has_default() and callable(f.default) for a, f in MESSAGE_COLUMNS if a in defaults)
    ):
        return _generic_copy_builder(context_id=context_id, tokenizer=tokenizer, now=now)
    new, state = Message.__new__, ModelState
    null, cell, array = db.COPY_NULL, db.copy_cell, db.copy_array
    json_text = db.json_text
    stamp = cell(now.isoformat())
    context_cell, tokenizer_cell = cell(context_id), cell(tokenizer)
    pruned_cell = cell(defaults["pruned_by"])

    def build(message: NewMessage, pk: int, seq: int, count: int) -> tuple[Message, str]:
        role, name, text, content = message.role, message.name, message.text, message.content
        tags, metadata, run_id, step_id = (
            message.tags,
            message.metadata,
            message.run_id,
            message.step_id,
        )
        source, client_id, key_order = (
            message.source_timestamp,
            message.client_id,
            message.key_order,
        )
        row = new(Message)
        row.__dict__ = {
            "_state": state(),
            "id": pk,
            "context_id": context_id,
            "seq": seq,
            "tokenizer": tokenizer,
            "token_count": count,
            "created_at": now,
            "updated_at": now,
            "role": role,
            "name": name,
            "text": text,
            "content": content,
            "tags": tags,
            "metadata": metadata,
            "run_id": run_id,
            "step_id": step_id,
            "source_timestamp": source,
            "client_id": client_id,
            "key_order": key_order,
            **defaults,
        }
        # The message's strings as they are when none holds a character COPY escapes: four
        # `in` scans of them together (each a memchr) instead of `copy_text`'s for each.
        if (
            type(role) is str
            and type(name) is str
            and type(text) is str
            and type(source) is str
            and (client_id is None or type(client_id) is str)
        ):
            written = f"{client_id or ''}{role}{name}{text}{source}"
            plain = not ("\\" in written or "\t" in written or "\n" in written or "\r" in written)
        else:
            plain = False
        if not plain:
            role, name, text, source = cell(role), cell(name), cell(text), cell(source)
            if client_id is not None:
                client_id = cell(client_id)
        return row, (
            f"{pk}\t{context_cell}\t{seq}\t"
            f"{null if client_id is None else client_id}\t{role}\t{name}\t{text}\t"
            f"{null if content is None else cell(json_text(content))}\t"
            f"{'{}' if type(tags) is list and not tags else array(list(tags))}\t"
            f"{'{}' if type(metadata) is dict and not metadata else cell(json_text(metadata))}\t"
            f"{null if run_id is None else cell(run_id)}\t"
            f"{null if step_id is None else cell(step_id)}\t"
            f"{count}\t{tokenizer_cell}\t"
            f"{source}\t"
            f"{stamp}\t{stamp}\t{pruned_cell}\t"
            f"{null if key_order is None else cell(json_text(key_order))}\n"
        )

    return build


def _generic_copy_builder(*, context_id: int, tokenizer: str, now: datetime.datetime):
    """`copy_builder`'s rows and lines through `message_factory` and `db.copy_line`."""
    stamp = now.isoformat()
    factory = message_factory()

    def build(message: NewMessage, pk: int, seq: int, count: int) -> tuple[Message, str]:
        r = factory(
            message,
            id=pk,
            context_id=context_id,
            seq=seq,
            tokenizer=tokenizer,
            token_count=count,
            created_at=now,
            updated_at=now,
        )
        return r, db.copy_line(copy_values(r, stamp))

    return build


def copy_values(r: Message, stamp: str) -> tuple:
    """A new row's values in `COPY_COLUMNS`' order, as `db.copy_line` takes them (`stamp`: its
    timestamps' text)."""
    return (
        r.pk,
        r.context_id,
        r.seq,
        r.client_id,
        r.role,
        r.name,
        r.text,
        None if r.content is None else db.json_text(r.content),
        list(r.tags),
        db.json_text(r.metadata),
        r.run_id,
        r.step_id,
        r.token_count,
        r.tokenizer,
        r.source_timestamp,
        stamp,
        stamp,
        r.pruned_by,
        None if r.key_order is None else db.json_text(r.key_order),
    )


def char(value: Any) -> str | None:
    """A value for a text column as Django's CharField and TextField write it (a domain caller
    may pass a number, a dict or a TextChoices member; psycopg would send those typed or not at
    all, and a mixed list not at all)."""
    return value if value is None or type(value) is str else str(value)


def _rows(context: Context, specs: list[NewMessage], counts, first_seq: int, tokenizer: str):
    now = timezone.now()
    return now, [
        new_message(
            m,
            context_id=context.pk,
            seq=first_seq + offset,
            token_count=count,
            tokenizer=tokenizer,
            created_at=now,
            updated_at=now,
        )
        for offset, (m, count) in enumerate(zip(specs, counts, strict=True))
    ]


# A new row's values as both statements send them, each typed (the table's own columns check
# lengths on assignment, as a plain INSERT does: tags as text[], where an explicit cast to the
# column's varchar(200)[] would cut a longer tag, which the assignment refuses).
_ROW_COLUMNS = (
    ("client_id", "text"),
    ("role", "text"),
    ("name", "text"),
    ("text", "text"),
    ("content", "json"),
    ("tags", "text[]"),
    ("metadata", "json"),
    ("run_id", "bigint"),
    ("step_id", "bigint"),
    ("token_count", "integer"),
    ("tokenizer", "text"),
    ("source_timestamp", "text"),
    ("pruned_by", "text"),
    ("key_order", "jsonb"),
)
_ROW_NAMES = ", ".join(name for name, _ in _ROW_COLUMNS)
_TYPED_VALUES = ", ".join(f"%s::{kind}" for _, kind in _ROW_COLUMNS)
# `insert_messages`' statement: every column but the id (the table's sequence draws it).
_INSERT_SQL = (
    f"INSERT INTO {Message._meta.db_table} (context_id, seq, {_ROW_NAMES}, created_at,"
    " updated_at) VALUES"
)
_INSERT_ROW = f"(%s, %s, {_TYPED_VALUES}, %s::timestamptz, %s::timestamptz)"


def _stored(row: Message, pk: int, seq: int) -> None:
    """`row` as saved: its id and seq as the statement wrote them."""
    row.pk, row.seq = pk, seq
    row._state.adding = False
    row._state.db = connection.alias


def _row_values(r: Message) -> list[Any]:
    """A row's values in `_ROW_COLUMNS`' order."""
    return [
        char(r.client_id),
        char(r.role),
        char(r.name),
        char(r.text),
        None if r.content is None else json.dumps(r.content),
        [char(t) for t in r.tags],
        json.dumps(r.metadata),
        r.run_id,
        r.step_id,
        r.token_count,
        char(r.tokenizer),
        char(r.source_timestamp),
        char(r.pruned_by),
        None if r.key_order is None else json.dumps(r.key_order),
    ]


def insert_messages(
    context: Context,
    specs: list[NewMessage],
    counts: list[int],
    first_seq: int,
    tokenizer: str,
) -> list[Message]:
    """A small batch's new messages, seqs from `first_seq` on, in one multi-row INSERT (in the
    caller's transaction, which allocated the seqs)."""
    now, rows = _rows(context, specs, counts, first_seq, tokenizer)
    args: list[Any] = []  # in `_INSERT_ROW`'s order
    for r in rows:
        args += [r.context_id, r.seq, *_row_values(r), now, now]
    with connection.cursor() as cursor:
        cursor.execute(f"{_INSERT_SQL} {', '.join([_INSERT_ROW] * len(rows))} RETURNING id", args)
        for row, (pk,) in zip(rows, cursor.fetchall(), strict=True):
            _stored(row, pk, row.seq)
    return rows


# `append_taking_seqs`' rows: a null seq, which the table's trigger fills (migration 0043).
# The SQLSTATE of the trigger's notice for a row whose full-text vector it left to the indexer
# (migration 0044).
LEFT_TO_INDEXER = "AM001"
_TAKING_ROW = f"(%s, NULL, {_TYPED_VALUES}, %s::timestamptz, %s::timestamptz)"
# The embedding queue's rows (`embeddings.queue.enqueue_messages`), a CTE after `m` (the new
# messages' id and text): a message with text, for the configured model, waiting for its vector.
_QUEUE_SQL = """, e AS (
    INSERT INTO memory_app_embedding (message_id, context_id, model, dimensions, vector, indexed)
    SELECT m.id, %s, %s, NULL, NULL, true FROM m WHERE m.text <> '' ON CONFLICT DO NOTHING
)"""

_QUEUED = "WITH m AS ({insert}, text)" + _QUEUE_SQL + " SELECT m.id, m.seq FROM m"  # noqa: S608 - constants


def _queue_model_sql(model: str, conn) -> str:
    """The SET LOCAL naming the model the rows of `append_taking_seqs` queue themselves for: a
    statement (Citus passes SET LOCAL on to the worker with the INSERT, not set_config()), so
    the model's name is written in it as a literal."""
    return (
        psycopg_sql.SQL("SET LOCAL agentmemory.queue_model = {}")
        .format(psycopg_sql.Literal(model))
        .as_string(conn)
    )


def append_taking_seqs(
    context: Context,
    specs: list[NewMessage],
    counts: list[int],
    tokenizer: str,
    queue_model: str | None,
) -> tuple[list[Message], bool]:
    """Append `specs` (their token counts `counts`) to `context` in one round trip, its own
    transaction: an INSERT of rows without seqs (on Citus with a model, between BEGIN, the
    SET LOCAL naming it and COMMIT, sent together), whose trigger (migration 0043)
    updates the context's counters row by row in the order of `specs` (its row lock keeps seqs
    gap-free under concurrent writers), sets each seq and writes the full-text rows when the
    context's are caught up; with the embedding queue's rows for `queue_model` (on Citus written
    by a second trigger, migration 0045, the model named by SET LOCAL in the same round trip). The
    rows (ids and seqs set), and whether the trigger left a full-text vector to the indexer (its
    notice, migration 0044): only `context`'s id is read, so its counters need not have been.

    A data-modifying CTE doing the counters, the messages and their full-text rows, each
    reading the one before (`append_statement`), is planned anew every time on one node and in
    steps on Citus, where this INSERT goes to the context's shard whole, its triggers' rows
    written there too (a CTE writing the queue's rows from the INSERT's would be a step of its
    own: the rows back to the coordinator and out again). The trigger writes a version of the
    context's row per message, so more than a few messages go by the CTE (`services.messages`).

    All of it fails together: a full-text vector that cannot be written fails the message too,
    so the caller then appends through the path that keeps the message and stores the vector's
    error (`services.messages`); a context gone meanwhile is NotFound."""
    now, rows = _rows(context, specs, counts, 1, tokenizer)
    args: list[Any] = []
    for r in rows:
        args += [context.pk, *_row_values(r), now, now]
    sql = f"{_INSERT_SQL} {', '.join([_TAKING_ROW] * len(rows))} RETURNING id, seq"
    # On one node the queue's rows come from a CTE after the INSERT, in the statement itself
    # (a transaction of its own costs more); on Citus the rows queue themselves (below).
    distributed = scale_out.table_is_distributed(Message._meta.db_table)
    queued_by_trigger = queue_model is not None and distributed
    if queue_model is not None and not queued_by_trigger:
        sql = _QUEUED.format(insert=sql)
        args += [context.pk, queue_model]
    left: list[bool] = []

    def heard(notice) -> None:
        if notice.sqlstate == LEFT_TO_INDEXER:
            left.append(True)

    try:
        # On one node the statement is prepared on the connection: its text depends only on
        # how many rows it writes, and parsing it was a fifth of its time on the server.
        with db.stale_plans_renewed(), db.binding_cursor(prepared=not distributed) as cursor:
            # The notices arrive while the statement's results are read, on this connection.
            cursor.connection.add_notice_handler(heard)
            try:
                if not queued_by_trigger:
                    cursor.execute(sql, args)
                else:
                    # The rows queue themselves (migration 0045) on the worker, in the
                    # transaction that names the model, sent with it in one round trip.
                    with db.binding_cursor() as setter, pipelines.pipelined_transaction(setter):
                        setter.execute(_queue_model_sql(queue_model, setter.connection))
                        cursor.execute(sql, args)
                found = cursor.fetchall()
            finally:
                cursor.connection.remove_notice_handler(heard)
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "P0002":
            raise NotFound(f"context {context.pk} not found") from exc
        raise
    # The trigger takes the seqs in the order of the VALUES list: by seq, the rows of `specs`.
    for row, (pk, seq) in zip(rows, sorted(found, key=lambda f: f[1]), strict=True):
        _stored(row, pk, seq)
    return rows, bool(left)


# The rows of `append_statement`'s VALUES list: their columns take the types of the casts.
_VALUES_ROW = f"(%s::integer, {_TYPED_VALUES})"
_APPEND_SQL = f"""
WITH c AS (
    UPDATE {Context._meta.db_table} SET last_seq = last_seq + %s,
        search_seq = CASE WHEN search_seq = last_seq THEN last_seq + %s ELSE search_seq END,
        message_count = message_count + %s, token_count = token_count + %s,
        last_activity_at = %s
    WHERE id = %s RETURNING last_seq, search_seq
), m AS (
    INSERT INTO {Message._meta.db_table} (context_id, seq, {_ROW_NAMES}, created_at, updated_at)
    SELECT %s, c.last_seq - %s + v.k, {", ".join(f"v.{n}" for n, _ in _ROW_COLUMNS)}, %s, %s
    FROM c, (VALUES {{rows}}) AS v (k, {_ROW_NAMES}) ORDER BY v.k
    RETURNING id, seq, text
), f AS (
    INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
    SELECT %s, m.seq, memory_app_search_vector(%s::regconfig, m.text) FROM m, c
    WHERE c.search_seq = c.last_seq
    ON CONFLICT (context_id, seq) DO UPDATE SET search_vector = EXCLUDED.search_vector, error = NULL
){{queue}}
SELECT m.id, m.seq, c.last_seq, c.search_seq FROM m, c ORDER BY m.seq
"""  # noqa: S608 - the table names and columns are constants


# One statement that does a whole small append (the docstring says why); the rows' values and
# the statement's parts are laid out in one place so their order is seen to match.
def append_statement(
    context: Context,
    specs: list[NewMessage],
    counts: list[int],
    tokenizer: str,
    queue_model: str | None,
) -> tuple[list[Message], int, int]:
    """Append `specs` (their token counts `counts`) to `context` in one statement, one round
    trip, its own transaction: the context's counters and seqs (the UPDATE takes the row lock,
    so seqs stay gap-free under concurrent writers), the message rows, their full-text rows
    when the context's are caught up (as `fulltext.index_messages` writes them), and the
    embedding queue's rows for `queue_model`. The rows (ids set), the new last_seq and
    search_seq. For more messages than `append_taking_seqs` takes: the counters are updated
    once, where the trigger updates them once a message.

    All of it fails together: a full-text vector that cannot be written fails the message too,
    so the caller then appends through the path that keeps the message and stores the vector's
    error (`services.messages`). Not on Citus: there each statement names one shard."""
    n = len(specs)
    now, rows = _rows(context, specs, counts, 1, tokenizer)
    args: list[Any] = [n, n, n, sum(counts), now, context.pk, context.pk, n, now, now]
    for k, r in enumerate(rows, start=1):
        args += [k, *_row_values(r)]
    args += [context.pk, FTS_CONFIG]
    queue = ""
    if queue_model is not None:
        queue = _QUEUE_SQL
        args += [context.pk, queue_model]
    sql = _APPEND_SQL.format(rows=", ".join([_VALUES_ROW] * n), queue=queue)
    with db.binding_cursor() as cursor:
        cursor.execute(sql, args)
        found = cursor.fetchall()
    if not found:
        raise NotFound(f"context {context.pk} not found")
    for row, (pk, seq, _, _) in zip(rows, found, strict=True):
        _stored(row, pk, seq)
    return rows, found[0][2], found[0][3]
