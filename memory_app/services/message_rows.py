"""A small append's rows (`services.messages`): built from `NewMessage`s and written by one
multi-row INSERT, or, outside a caller's transaction, together with the context's counters,
the full-text rows and the embedding queue's rows in one statement (`append_statement`).

Both statements are written here, not compiled by the ORM (`bulk_create` compiled its INSERT
on every append, a quarter of a single append's time in Python): the columns the COPY of a
large batch writes, JSON as the ORM wrote it (`json.dumps`, so a NaN still fails the row
rather than turning into null; a `json` column keeps the text as written), ids read back."""

from __future__ import annotations

import json
from typing import Any

from django.db import DatabaseError, connection
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from memory_app import db
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


# A new row's values as both statements send them, each typed (in `append_statement`'s VALUES
# list its columns take the types of the casts; the table's own columns then check lengths on
# assignment, as a plain INSERT does: tags as text[], where an explicit cast to the column's
# varchar(200)[] would cut a longer tag, which the assignment refuses).
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
            row.pk = pk
            row._state.adding = False
            row._state.db = connection.alias
    return rows


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
# The embedding queue's rows (`embeddings.queue.enqueue_messages`): a message with text, for
# the configured model, waiting for its vector.
_QUEUE_SQL = """, e AS (
    INSERT INTO memory_app_embedding (message_id, context_id, model, dimensions, vector, indexed)
    SELECT m.id, %s, %s, NULL, NULL, true FROM m WHERE m.text <> '' ON CONFLICT DO NOTHING
)"""


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
    search_seq.

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
        row.pk, row.seq = pk, seq
        row._state.adding = False
        row._state.db = connection.alias
    return rows, found[0][2], found[0][3]


# `append_taking_seqs`' statement: a null seq, which the table's trigger fills (migration 0043).
_TAKING_ROW = f"(%s, NULL, {_TYPED_VALUES}, %s::timestamptz, %s::timestamptz)"


def append_taking_seqs(
    context: Context, specs: list[NewMessage], counts: list[int], tokenizer: str
) -> list[Message]:
    """Append `specs` (their token counts `counts`) to `context` by one INSERT of rows without
    seqs, its own transaction: the table's trigger (migration 0043) updates the context's
    counters row by row, in the order of `specs` (its row lock keeps seqs gap-free), sets each
    seq, and writes the full-text rows when the context's are caught up. On Citus that is one
    statement routed to the context's shard, where `append_statement` is planned in steps and
    the pipelined path is a hop per statement. The rows (ids and seqs set).

    All of it fails together, as `append_statement` does (then the caller appends through the
    path that keeps a message whose vector cannot be written); a context gone meanwhile is
    NotFound. It writes no embedding queue rows: the caller's path does when a model is set."""
    now, rows = _rows(context, specs, counts, 1, tokenizer)
    args: list[Any] = []
    for r in rows:
        args += [context.pk, *_row_values(r), now, now]
    sql = f"{_INSERT_SQL} {', '.join([_TAKING_ROW] * len(rows))} RETURNING id, seq"
    try:
        with db.binding_cursor() as cursor:
            cursor.execute(sql, args)
            found = cursor.fetchall()
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "P0002":
            raise NotFound(f"context {context.pk} not found") from exc
        raise
    for row, (pk, seq) in zip(rows, found, strict=True):
        row.pk, row.seq = pk, seq
        row._state.adding = False
        row._state.db = connection.alias
    return rows
