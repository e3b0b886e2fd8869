"""Database helpers shared by the writes: row locks on contexts in one order, the text form of
values in a COPY stream, the cyclic GC paused around large writes, and what every surface
answers when the database itself fails."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import struct
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import orjson
import psycopg
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
)
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import DateTimeField, JSONField
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils import timezone
from psycopg.adapt import Dumper

from memory_app.json_values import may_hold_long_integer
from memory_app.models import Context
from memory_app.numbered_placeholders import BindingCursor

# The database is down, stalled, restarting or out of pooled connections (Django wraps psycopg's
# errors and the pool's timeout in these): the request was not served, and the same request
# may succeed a moment later. Every surface answers 503 with Retry-After, never 500.
DATABASE_FAULTS = (OperationalError, InterfaceError)
UNAVAILABLE = "the database is unavailable right now; retry shortly"
RETRY_AFTER_SECONDS = 2


def is_database_fault(exc: BaseException | None) -> bool:
    return isinstance(exc, DATABASE_FAULTS)


# PostgreSQL's refusal of a prepared statement whose tables changed shape under it (a migration
# applied while the server runs): every later execution on that connection is refused alike,
# and psycopg keeps the statement's name.
STALE_PLAN = "cached plan must not change result type"


def is_stale_plan(exc: BaseException | None) -> bool:
    """Whether `exc` (Django's wrapper or psycopg's own) is a prepared statement refused for a
    stale plan."""
    for error in (exc, getattr(exc, "__cause__", None)):
        if isinstance(error, psycopg.errors.FeatureNotSupported) and STALE_PLAN in str(error):
            return True
    return False


@contextlib.contextmanager
def stale_plans_renewed() -> Iterator[None]:
    """Statements prepared on this thread's default connection are sent inside the block: one
    refused for a stale plan (`is_stale_plan`) closes the connection, and the statements
    prepared on it with it (the pool drops a closed connection), and is raised as a database
    fault: every surface answers it 503 with Retry-After, and a retry on a connection that has
    not prepared it yet prepares it anew (each pooled connection that prepared it before the
    change answers so once). Any other database error drops the connection's prepared
    statements (`prepared_statements_dropped`): one whose first run failed is left on the
    server otherwise."""
    try:
        yield
    except Exception as exc:
        if not is_stale_plan(exc):
            if isinstance(exc, DatabaseError | psycopg.Error):
                prepared_statements_dropped()
            raise
        raw = connection.connection
        if raw is not None and not raw.closed:
            raw.close()
        connection.close()
        raise OperationalError(f"{STALE_PLAN}: the connection is renewed") from exc


def prepared_statements_dropped() -> None:
    """Drop the statements prepared on this thread's default connection, on the server and in
    psycopg's cache (psycopg reads DEALLOCATE ALL and clears its own), when the connection is
    idle. After a prepared statement's first execution fails, psycopg forgets it but the server
    keeps it: a statement failing again and again on one connection would leave one more behind
    each time. Nothing is done on a connection in a transaction or broken (the pool drops
    that)."""
    raw = connection.connection
    if raw is None or raw.closed:
        return
    if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        raw.execute("DEALLOCATE ALL")
    except psycopg.Error:
        pass  # broken: the pool's check drops it, and the statement's own error is what answers


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
    heap. Paused, they are freed by reference counting
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


def lock_contexts(ids) -> None:
    """Take the row locks of these contexts (in id order) before any of their messages' rows.

    Writers that change a message's text, pruned state or existence fire the message search
    triggers (migration 0022), which lock the message's context row (the full-text indexer
    holds it while it writes a context's vectors). Locking the context first keeps one order,
    context then message, with appenders and AgentScope's state import, which lock it first
    too: two writers never each hold what the other waits for.

    One statement per context, all in the caller's transaction: on Citus a row lock names one
    distribution value (a lock of several contexts in one statement is refused), and the
    transaction keeps what the caller writes all-or-nothing across them."""
    with connection.cursor() as cursor:
        for context_id in sorted({int(i) for i in ids}):
            cursor.execute(
                f"SELECT id FROM {Context._meta.db_table} WHERE id = %s "  # noqa: S608
                "FOR NO KEY UPDATE",
                [context_id],
            )


def json_text(value: Any) -> str:
    """A JSON column's value as COPY text: orjson (a tenth of psycopg's per-row `json.dumps`),
    the standard library for what orjson cannot write exactly (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value)


# COPY's text format: one line per row, columns separated by tabs, NULL as \N; a backslash,
# newline, carriage return or tab inside a value is written as a backslash escape.
COPY_NULL = "\\N"


def copy_text(value: str) -> str:
    # Four `in` scans (each a memchr) find whether anything needs escaping: ten times faster
    # than a regular expression's character class on a message-sized text, hundreds of times
    # on a step's model input of many kilobytes. Four replaces, not `str.translate`:
    # translate looks every character up in its table in Python's slow path.
    if "\\" not in value and "\t" not in value and "\n" not in value and "\r" not in value:
        return value
    return (
        value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    )


def copy_array(values: list) -> str:
    """A text[] value as COPY text: an array literal with every element quoted (None is a NULL
    element, anything else its `str`, as Django's ArrayField of CharField writes it)."""
    if not values:
        return "{}"
    quoted = ",".join(
        "NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values
    )
    return copy_text("{" + quoted + "}")


def copy_cell(value: Any) -> str:
    """One value as `copy_line` writes it."""
    return COPY_NULL if value is None else _copy_value(value)


def copy_line(values: tuple) -> str:
    """One row in COPY text format (written here rather than by psycopg's per-value dumpers,
    ≈ 4 against 11 µs a row): None, `int`, a list (text[]), anything else as its `str` (as
    Django's CharField and TextField write it: a TextChoices member is its value); JSON and
    timestamps come as their text already."""
    out = []
    for v in values:
        if v is None:
            out.append(COPY_NULL)
        elif type(v) is str:
            out.append(copy_text(v))
        elif type(v) is int:
            out.append(str(v))
        elif type(v) is list:
            out.append(copy_array(v))
        else:
            out.append(copy_text(str(v)))
    return "\t".join(out) + "\n"


@contextlib.contextmanager
def copy_errors_as_django() -> Iterator[None]:
    """A COPY runs on psycopg's own cursor, whose errors Django does not translate: they are
    translated here as Django's cursor would. A client id stored by a concurrent writer between
    our check and our COPY is Django's IntegrityError (messages_append retries on it; elsewhere
    the API's 409); a connection the database cuts off mid-COPY is its OperationalError, a
    database fault (503 with Retry-After), not a 500."""
    with connection.wrap_database_errors:
        yield


def select_columns(model, alias: str) -> str:
    """`alias.column, ...` of the model's concrete fields, in `from_row`'s order."""
    return ", ".join(f"{alias}.{f.column}" for f in model._meta.concrete_fields)


def from_row(model, values, using: str = "default"):
    """A model instance from the values `select_columns` read, converted as the ORM converts
    them (JSON decoded, and so on), without compiling a query.

    Built as `Model.from_db` builds a row, but with its fields written straight into the
    instance's `__dict__` (what `Model.__init__` leaves there for a row: nothing related is
    cached yet) instead of a descriptor call per field, unless something listens to the
    model's pre_init or post_init signals."""
    attnames, converters = _row_shape(model)
    if len(values) != len(attnames):
        raise ValueError(f"{len(values)} values for the {len(attnames)} fields of {model}")
    converted = list(values)
    for i, convert in converters:
        if converted[i] is not None:
            converted[i] = convert(converted[i], None, connection)
    # When nothing listens to either signal (as here), their empty lists spare a lookup by
    # sender for every row.
    if (pre_init.receivers or post_init.receivers) and (
        pre_init.has_listeners(model) or post_init.has_listeners(model)
    ):
        return model.from_db(using, attnames, converted)
    obj = model.__new__(model)
    state = obj._state = ModelState()
    state.adding = False
    state.db = using
    obj.__dict__.update(zip(attnames, converted, strict=True))
    return obj


_row_shapes: dict[type, tuple[list[str], list[tuple[int, Any]]]] = {}


def _row_shape(model) -> tuple[list[str], list[tuple[int, Any]]]:
    """The model's concrete fields' attribute names, in `select_columns`' order, and the
    `from_db_value` converters of those that have one, with their place. A JSON field without a
    decoder of its own is read by orjson (`_json_value`)."""
    shape = _row_shapes.get(model)
    if shape is None:
        fields = model._meta.concrete_fields
        converters = [(i, _converter(f)) for i, f in enumerate(fields)]
        shape = _row_shapes[model] = (
            [f.attname for f in fields],
            [(i, convert) for i, convert in converters if convert is not None],
        )
    return shape


def _converter(field):
    convert = getattr(field, "from_db_value", None)
    if isinstance(field, JSONField) and field.decoder is None:
        return lambda value, expression, conn: _json_value(value, convert, conn)
    return convert


def _json_value(value: str, convert, conn) -> Any:
    """A JSON column's text as the field decodes it: by orjson, a fraction of the standard
    library's time for the small documents a message carries (its content, metadata and key
    order), the same values; by the field's own `json.loads` for what orjson reads otherwise
    or refuses (an integer beyond 64 bits, which it would round to a float:
    `json_values.may_hold_long_integer`; a number beyond a double's range), so nothing reads
    differently."""
    if not may_hold_long_integer(value.encode()):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
    return convert(value, None, conn)


class Float8Array:
    """A `float8[]` parameter in PostgreSQL's binary array form, packed at once by numpy:
    psycopg's list dumper packs a number at a time (≈ 0.1 ms for a 384-number query vector).
    Sent by `binding_cursor`'s cursors (`Float8ArrayDumper`)."""

    __slots__ = ("data", "values")
    _ELEMENT = np.dtype([("size", ">i4"), ("value", ">f8")])

    def __init__(self, values: Sequence[float]):
        self.values = values
        n = len(values)
        elements = np.empty(n, dtype=self._ELEMENT)
        elements["size"] = 8
        elements["value"] = values
        # One dimension, no NULLs, float8 elements, n of them from index 1.
        self.data = struct.pack("!iiIii", 1, 0, FLOAT8_OID, n, 1) + elements.tobytes()


FLOAT8_OID = psycopg.postgres.types["float8"].oid


class Float8ArrayDumper(Dumper):
    format = psycopg.pq.Format.BINARY
    oid = psycopg.postgres.types["float8"].array_oid

    def dump(self, obj: Float8Array) -> bytes:
        return obj.data


class Float8ArrayTextDumper(Dumper):
    """The same parameter for a cursor that writes its parameters into the statement (Django's
    own, as a test re-running a captured statement uses)."""

    oid = psycopg.postgres.types["float8"].array_oid

    def dump(self, obj: Float8Array) -> bytes:
        return ("{" + ",".join(repr(float(x)) for x in obj.values) + "}").encode()


# psycopg's prepare_threshold for a connection that prepares a statement only when asked:
# Django turns psycopg's preparing off (None), which refuses even an explicit request; a
# threshold never reached keeps it off for every other statement.
PREPARE_WHEN_ASKED = 2**31 - 1


def binding_cursor(*, prepared: bool = False):
    """A cursor of the default connection that sends its parameters apart from the statement
    (psycopg's server-side binding, each in the format psycopg picks for its type: binary for a
    `Float8Array`), where Django's own cursor merges them into the text: a 384-number query
    vector goes as 3 KB of doubles instead of a literal written with a `repr` per number and
    parsed back by the server. Wrapped as Django wraps its cursors
    (database errors as Django's, statements logged under DEBUG and in tests).

    `prepared`: its statements are prepared on the connection the first time it sends them
    and executed by name after that (Django leaves psycopg's own preparing off), so a
    statement whose text never changes is parsed and analysed once per connection, and the
    server may keep one plan for it instead of planning it anew each time."""
    connection.ensure_connection()
    raw = connection.connection
    if not getattr(raw, "_agentmemory_float8_arrays", False):
        # On the connection, once: a cursor's own registration copies its adapters every time.
        raw.adapters.register_dumper(Float8Array, Float8ArrayTextDumper)
        raw.adapters.register_dumper(Float8Array, Float8ArrayDumper)
        raw._agentmemory_float8_arrays = True
    if prepared and raw.prepare_threshold is None:
        raw.prepare_threshold = PREPARE_WHEN_ASKED
    cursor = _PreparingCursor(raw) if prepared else BindingCursor(raw)
    if connection.queries_logged:
        if prepared:
            return _PreparedDebugCursor(cursor, connection)
        return connection.make_debug_cursor(cursor)
    return connection.make_cursor(cursor)


class _PreparedDebugCursor(CursorDebugWrapper):
    """Logs a prepared statement by its own text: executed by name, it has no other (Django
    would log None)."""

    def execute(self, sql, params=None):
        with self.debug_sql(sql, params):
            return CursorWrapper.execute(self, sql, params)


class _PreparingCursor(BindingCursor):
    """Prepares every statement it executes (`binding_cursor(prepared=True)`)."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        return super().execute(query, params, prepare=True, binary=binary)


def copy_models(objs: list) -> None:
    """Insert new model instances of one model with one COPY, as `bulk_create` would: ids drawn
    from the table's sequence first for the objects without one (`draw_ids` may have drawn a
    batch's ids at once), `auto_now_add` times set, every concrete field written.
    `bulk_create` sends each column as an array parameter whose text psycopg escapes element by
    element with a regular expression (a third of the OTLP mapper's time); COPY's text is
    written here (`copy_line`), JSON through `json_text`."""
    if not objs:
        return
    model = type(objs[0])
    table = model._meta.db_table
    fields = model._meta.concrete_fields
    now = None
    for field in fields:
        if getattr(field, "auto_now_add", False) or getattr(field, "auto_now", False):
            now = now or timezone.now()
            for obj in objs:
                setattr(obj, field.attname, now)
    kinds = [_copy_kind(f) for f in fields]
    if missing := [obj for obj in objs if obj.pk is None]:
        (ids,) = draw_ids([(model, len(missing))])
        for obj, pk in zip(missing, ids, strict=True):
            obj.pk = pk
    for obj in objs:
        obj._state.adding = False
    with connection.cursor() as cursor:
        columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
        # Each value written as `copy_line` writes it, the row's line built in one pass (no
        # tuple of values in between: thousands of rows a mapped batch of spans).
        spec = [(f.attname, _COPY_WRITERS[kind]) for f, kind in zip(fields, kinds, strict=True)]
        lines = []
        for obj in objs:
            row = obj.__dict__
            values = [
                COPY_NULL
                if (value := row[attname] if attname in row else getattr(obj, attname)) is None
                else write(value)
                for attname, write in spec
            ]
            lines.append("\t".join(values) + "\n")
        with (
            copy_errors_as_django(),
            cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,  # noqa: S608
        ):
            copy.write("".join(lines))


def draw_ids(counts: list[tuple[Any, int]]) -> list[list[int]]:
    """Ids for new rows of each (model, count), drawn from their tables' sequences in one
    statement.

    The sequence is looked up once per table (`OFFSET 0` keeps the lookup a subquery of one
    row): written inside `nextval(...)`, `pg_get_serial_sequence` and the cast of its name to
    a regclass run again for every id, five times the cost of the draw itself."""
    drawn = ", ".join(
        "ARRAY(SELECT nextval(s.seq) FROM (SELECT pg_get_serial_sequence(%s, 'id')::regclass"
        " AS seq OFFSET 0) AS s, generate_series(1, %s))"
        for _ in counts
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {drawn}",  # noqa: S608 - placeholders only
            [v for model, count in counts for v in (model._meta.db_table, count)],
        )
        return [list(ids) for ids in cursor.fetchone()]


def _copy_value(value: Any) -> str:
    """A value that is not None as `copy_line` writes it."""
    if type(value) is str:
        return copy_text(value)
    if type(value) is int:
        return str(value)
    if type(value) is list:
        return copy_array(value)
    return copy_text(str(value))


_COPY_WRITERS = {
    "json": lambda value: copy_text(json_text(value)),
    "time": lambda value: value.isoformat(),
    "plain": _copy_value,
}


def _copy_kind(field) -> str:
    if not field.has_default() and field.has_db_default():
        # The instance holds an expression the database would evaluate, not a value to copy.
        raise TypeError(f"{field} has a database default only: COPY cannot write it")
    if isinstance(field, JSONField):
        return "json"
    if isinstance(field, DateTimeField):
        return "time"
    return "plain"


def model_factory(model):
    """A builder of new `model` instances for bulk writes (`copy_models`): when nothing listens
    to the model's pre_init / post_init signals, each instance's `__dict__` is filled from the
    fields' defaults, computed once where they are immutable, and the values given, as
    `Model.__init__`'s per-field work leaves it for a new instance (no related object cached)
    without that work: thousands of steps and tool calls a mapped batch of spans. Values are
    named by attribute (`run_id`, not `run`)."""
    if pre_init.has_listeners(model) or post_init.has_listeners(model):
        return model
    fixed, fresh = {}, []
    for f in model._meta.concrete_fields:
        value = f.get_default()
        if value is None or isinstance(value, str | int | float | bool):
            fixed[f.attname] = value
        else:
            fresh.append((f.attname, f))
    names = set(fixed) | {attname for attname, _ in fresh}

    def build(**values: Any):
        if unknown := values.keys() - names:
            raise TypeError(f"{model.__name__} has no field {sorted(unknown)[0]!r}")
        row = model.__new__(model)
        row._state = ModelState()
        fields = row.__dict__
        fields.update(fixed)
        for attname, f in fresh:
            fields[attname] = f.get_default()
        fields.update(values)
        return row

    return build


_background = threading.local()


def background_priority(nice: int) -> None:
    """Lower the calling thread, and the server process its connection talks to, by `nice`
    (setpriority), so that what runs in the background (the OTLP mapping) takes the CPU the
    requests leave instead of sharing it with them: two shared cores split between an export's
    acknowledgement and a mapper in equal parts made the acknowledgement wait for the mapping.

    On Linux a thread's nice value is its own (NPTL), so a web worker's indexer thread is lowered
    and its request threads are not; elsewhere the call would lower the whole process and is not
    made. The server process is lowered only when it is this machine's PostgreSQL (its pid is a
    `postgres` process here) and the connection is this thread's alone (not a pooled one, which
    would carry the lowered priority to the requests it serves next); a server run by another
    user than this process's is left as it is (EPERM). Nothing is ever raised back (an
    unprivileged process cannot), so each thread and each server process is lowered once."""
    if nice <= 0 or sys.platform != "linux":
        return
    if not getattr(_background, "lowered", False):
        _background.lowered = True
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
    connection.ensure_connection()
    if connection.settings_dict.get("OPTIONS", {}).get("pool"):
        return
    pid = connection.connection.info.backend_pid
    if getattr(_background, "server", None) == pid:
        return
    _background.server = pid
    try:
        with open(f"/proc/{pid}/comm") as comm:
            if comm.read().strip() != "postgres":
                return
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, pid) + nice))
    except OSError:
        return
