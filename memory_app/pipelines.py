"""Statements sent together on the default connection (psycopg's pipeline mode): several
reads in one round trip, a transaction's BEGIN, statements and COMMIT in one, and a read
deferred into the round trip of the first statements that follow it (a request's key read with
the selection it guards).

The reads' statements are bound by the server (`db.binding_cursor`); answers are read only
where the code needs one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections

from memory_app.db import binding_cursor, stale_plans_renewed


def first_rows(statements: list[tuple[str, list]]) -> list[tuple | None]:
    """The first row (None for none) of each statement, read on the default connection bound by
    the server and prepared (`binding_cursor`: each statement's text is parsed and analysed once
    per connection; a request's key read, the same text on every request, costs about half as
    much of the server's time so); several go in one round trip (a pipeline)."""
    with stale_plans_renewed():
        if len(statements) == 1:
            with binding_cursor(prepared=True) as cursor:
                cursor.execute(*statements[0])
                return [cursor.fetchone()]
        connection.ensure_connection()  # a thread's first statements open its connection
        with connection.wrap_database_errors, connection.connection.pipeline():
            readers = _send(statements)
        return _first_of(readers)


def _send(statements: list[tuple[str, list]]) -> list:
    """`statements` sent (inside a pipeline, their answers not read yet) and prepared, as
    `first_rows` sends them: their cursors, whose first rows `_first_of` reads once the
    pipeline has ended."""
    readers = [binding_cursor(prepared=True) for _ in statements]
    for reader, statement in zip(readers, statements, strict=True):
        reader.execute(*statement)
    return readers


def _first_of(readers: list) -> list[tuple | None]:
    rows = []
    for reader in readers:
        with reader:
            rows.append(reader.fetchone())
    return rows


# The statements of the innermost `deferred_read` block not sent yet, with what checks their
# rows.
_DEFERRED: ContextVar[list | None] = ContextVar("deferred_read", default=None)


@contextlib.contextmanager
def deferred_read(statements: list[tuple[str, list]], accept) -> Iterator[None]:
    """`statements` (SQL and parameters each; their texts the same from call to call: they are
    prepared, see `first_rows`) are read before anything the block reads is handed on: in the
    round trip of the block's first `pipelined_transaction` or `read_rows`, whose
    answers come back only once `accept` has seen their rows, or alone just before the block's
    first other statement. `accept(rows)` (each statement's first row, None for none) raises to
    refuse what follows. A request's key and context are read so with the selection they
    guard."""
    pending: list = [statements, accept]

    def read_it_first(execute, sql, params, many, context):
        _read_deferred(pending)
        return execute(sql, params, many, context)

    token = _DEFERRED.set(pending)
    try:
        with connection.execute_wrapper(read_it_first):
            yield
    finally:
        _DEFERRED.reset(token)


def _read_deferred(pending: list) -> None:
    # Taken first: this read's own statements pass through the wrapper too.
    taken = _take(pending)
    if taken is None:
        return
    taken[1](first_rows(taken[0]))


def _take(pending: list | None) -> tuple[list[tuple[str, list]], Any] | None:
    """A `deferred_read`'s statements and check, once: None when there are none or they were
    sent."""
    if pending is None or pending[0] is None:
        return None
    taken = (pending[0], pending[1])
    pending[0] = None
    return taken


# Sent just before a prepared read in its round trip (`read_rows`' `generic`): until the
# implicit transaction of that round trip ends, prepared statements run on their generic plan.
_GENERIC_PLANS = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"


def read_rows(
    sql: str,
    params,
    *,
    using: str = DEFAULT_DB_ALIAS,
    prepared: bool = False,
    generic: bool = False,
    ahead: bool = False,
):
    """The rows of one read on the connection `using`. A pending `deferred_read` goes first:
    on the default connection in the same round trip (a pipeline; the read bound by the server,
    `binding_cursor`, and `prepared` as there), on another just before; either way the rows
    are handed back only once its check has passed. `ahead`: in that round trip the read goes
    out before the deferred statements, as the first of its transaction (the server runs the
    statements of a pipeline up to its sync in one implicit transaction block, and Citus keeps
    a call after the first on the coordinator); its rows still wait for the check.

    `generic` (with `prepared`, outside any transaction; not with `ahead`): the read runs on
    the one plan its statement is given for any values (PostgreSQL's generic plan) instead of a
    plan made for each call's values, which the server would otherwise keep choosing: for a
    long statement whose planning costs more than seeing the values wins back. The setting is
    sent just before the read, after any deferred statements, and ends with the round trip's
    implicit transaction."""
    if using != DEFAULT_DB_ALIAS:
        _read_deferred(_DEFERRED.get())
        with connections[using].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    if generic and ahead:
        raise ValueError("a read sent ahead of its round trip's other statements is not generic")
    deferred = _take(_DEFERRED.get())
    with stale_plans_renewed(), binding_cursor(prepared=prepared) as cursor:
        raw = connection.connection
        generic = generic and prepared and _outside_transactions(raw)
        if deferred is None and not generic:
            cursor.execute(sql, params)
            return cursor.fetchall()
        with connection.wrap_database_errors, raw.pipeline():
            if ahead:
                cursor.execute(sql, params)
            readers = _send(deferred[0]) if deferred is not None else []
            if generic:
                # After the deferred reads: for this read alone. Prepared: its text never
                # changes.
                raw.execute(_GENERIC_PLANS, prepare=True)
            if not ahead:
                cursor.execute(sql, params)
        if deferred is not None:
            deferred[1](_first_of(readers))
        return cursor.fetchall()


def _outside_transactions(raw) -> bool:
    """Whether the connection is in no transaction (no atomic block, no BEGIN sent, no
    pipeline open around this one), so that a setting made for a round trip ends with it."""
    return (
        connection.get_autocommit()
        and raw.info.pipeline_status == psycopg.pq.PipelineStatus.OFF
        and raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )


@contextlib.contextmanager
def pipelined_transaction(cursor) -> Iterator[None]:
    """Statements sent in one round trip, in one transaction: `BEGIN`, what the block executes
    (results are read once it ends) and `COMMIT`, together. Inside an atomic block the block's
    statements join that transaction (one round trip still). A failure rolls back. A pending
    `deferred_read` goes first in the same round trip, and the block ends only once its
    check has passed. A savepoint rolled back among the block's statements leaves the
    connection's prepared statements working (`_forgotten_statements_deallocated`)."""
    raw = connection.connection
    own = not connection.in_atomic_block
    deferred = _take(_DEFERRED.get())
    with stale_plans_renewed():  # the deferred statements are prepared
        try:
            with connection.wrap_database_errors, raw.pipeline():
                if deferred is not None:
                    readers = _send(deferred[0])
                if own:
                    cursor.execute("BEGIN")
                yield
                if own:
                    cursor.execute("COMMIT")
        except BaseException:
            if own and raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                with connection.wrap_database_errors:
                    raw.rollback()
            raise
        finally:
            _forgotten_statements_deallocated(raw)
        if deferred is not None:
            deferred[1](_first_of(readers))


@contextlib.contextmanager
def pipelined() -> Iterator[None]:
    """The block's statements go out as they come and their answers are read only where the
    code needs one (psycopg's pipeline mode): a statement whose result is not read (BEGIN, a
    savepoint, an INSERT without RETURNING) shares the next one's round trip. Errors surface
    where the answers are read (`synced` marks a place that must see its own). No COPY inside."""
    connection.ensure_connection()
    raw = connection.connection
    with connection.wrap_database_errors:
        try:
            with raw.pipeline():
                yield
        finally:
            _forgotten_statements_deallocated(raw)


def _forgotten_statements_deallocated(raw) -> None:
    """psycopg forgets the connection's prepared statements when it reads a ROLLBACK's answer
    (a savepoint's, an atomic block inside the pipeline refused) and deallocates them on the
    server after the connection's next statement: one that the next statement prepared would go
    with them and fail the next time it ran ("prepared statement does not exist"). The
    deallocation pending (psycopg's own state: it has no public call for it) runs now, after a
    statement that prepares nothing; in a failed transaction it waits for its rollback, which
    deallocates at once. A connection that fails here says so at its next statement: the
    block's own error, if any, is the one raised."""
    pending = getattr(getattr(raw, "_prepared", None), "_to_flush", None)
    if pending and raw.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:
        with contextlib.suppress(psycopg.Error):
            raw.execute("SELECT 1")


@contextlib.contextmanager
def synced() -> Iterator[None]:
    """Inside `pipelined`: the block's statements answered (or failed) when it ends, so a
    `try` around it sees its errors. Outside a pipeline it does nothing."""
    raw = connection.connection
    if raw is None or raw.info.pipeline_status == psycopg.pq.PipelineStatus.OFF:
        yield
        return
    with connection.wrap_database_errors, raw.pipeline():
        yield
