"""A read of one context's rows sent whole to the worker that holds them, on a distributed store.

Citus plans a statement of several joins and CTEs twice: in full on the coordinator (the
planner over the tables' empty shells, then its router, which writes the statement again over
the shards), and again on the worker that runs it. For keyword search in a large context that
planning costs more than the run. Sent as a call of `memory_app_on_shard` (migration 0046)
naming the context, the statement goes to the context's worker as it is (Citus's function call
delegation: `manage.py distribute` makes the function a distributed one, co-located with the
contexts) and is planned there once, over the shards, by PostgreSQL alone. On one node the
statement is sent as it is.

The statement travels as text, its values written into it as literals by psycopg's quoting
(the call itself is bound by the server), and its tables as `format()`'s `%n$s`, which the
function fills with the shards' names where it finds them; the columns it answers are declared
at the call (a function returning records needs them), their types read from the catalog.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from django.db import connection
from psycopg import sql as psql

from memory_app import pipelines, scale_out

# A statement's value placeholders as psycopg reads them: `%(name)s`, and `%%` for a `%` of
# its own (a bare `%s` has no name to take its value from here).
_PLACEHOLDERS = re.compile(r"%\((\w+)\)s|%%|%")

_CALL = "memory_app_on_shard(%(context_id)s, %(statement)s, %(tables)s::regclass[])"

# Per process: the SQL type of each column of a table, without its length or precision (a
# migration may change those under a running server; a declared type without them takes any).
_column_types: dict[str, dict[str, str]] = {}


def read_rows(
    sql: str,
    params: dict,
    *,
    context_id: int,
    tables: Sequence[str],
    types: Callable[[], Sequence[str]],
    prepared: bool = False,
    generic: bool = False,
) -> list[tuple]:
    """The rows of `sql` (named placeholders, `params` their values), a read of the context
    `context_id`'s rows in `tables` (distributed by context, co-located). On a distributed
    store, outside a transaction block, it runs on the worker holding the context
    (`memory_app_on_shard`), answering columns of `types()` (SQL type names, in order; asked
    only then); elsewhere it is sent as it is: Citus keeps a call inside a transaction block
    on the coordinator, where the function's detour would only cost more. Either way
    `pipelines.read_rows` sends it (a pending deferred read shares its round trip: behind the
    call, ahead of a statement sent as it is); `prepared` prepares what is sent (the call's
    text depends only on the types); `generic` runs a prepared statement sent as it is on its
    generic plan (`pipelines.read_rows`; a call's statement is planned on the worker)."""
    if not _on_shards():
        return pipelines.read_rows(sql, params, prepared=prepared, generic=generic)
    columns = ", ".join(f"c{i} {kind}" for i, kind in enumerate(types()))
    # The columns' types come from the catalog and the code, never from a request.
    call = f"SELECT * FROM {_CALL} AS r ({columns})"  # noqa: S608
    with connection.wrap_database_errors:  # a value psycopg cannot write (a NUL) is a DataError
        statement = format_string(sql, params, tables)
    values = {"context_id": context_id, "statement": statement, "tables": list(tables)}
    # Ahead of a deferred read in their round trip: Citus delegates a call only as the first
    # statement of its transaction.
    return pipelines.read_rows(call, values, prepared=prepared, ahead=True)


def _on_shards() -> bool:
    """Whether a read goes as a call of the function: on a distributed store, outside a
    transaction block."""
    return not connection.in_atomic_block and scale_out.table_is_distributed(scale_out.CONTEXTS)


def format_string(sql: str, params: dict, tables: Sequence[str]) -> str:
    """`sql` as `memory_app_on_shard` takes it: each `%(name)s` replaced by the literal of
    `params[name]`, each whole word naming one of `tables` by `%n$s` (its place in `tables`),
    and every other `%` doubled, as `format()` reads them. Only the statement's own text (never
    a value) is searched for table names."""
    if not tables:
        raise ValueError("a statement sent to a shard reads at least one table")
    connection.ensure_connection()
    raw = connection.connection
    names = re.compile(r"\b(" + "|".join(re.escape(t) for t in tables) + r")\b")
    place = {table: i for i, table in enumerate(tables, start=1)}

    def own_text(text: str) -> str:
        return names.sub(lambda m: f"%{place[m.group(1)]}$s", text)

    parts, end = [], 0
    for found in _PLACEHOLDERS.finditer(sql):
        parts.append(own_text(sql[end : found.start()]))
        if found.group(1) is not None:
            parts.append(_literal(params[found.group(1)], raw).replace("%", "%%"))
        elif found.group(0) == "%%":
            parts.append("%%")
        else:
            raise ValueError("a statement sent to a shard names its placeholders: %(name)s")
        end = found.end()
    parts.append(own_text(sql[end:]))
    return "".join(parts)


def _literal(value: object, raw) -> str:
    # A float as the server-bound statement would have it: a float8, not a numeric constant.
    if isinstance(value, float):
        return f"'{value!r}'::float8"
    return psql.Literal(value).as_string(raw)


def column_types(table: str, columns: Sequence[str]) -> list[str]:
    """The SQL types of `table`'s `columns`, in their order, as `format_type` writes them
    without a modifier (`character varying`, not `character varying(200)`): a function's
    declared columns must match what it answers, and a declared length would have to match
    the column's exactly."""
    known = _column_types.get(table)
    if known is None:
        # On the connection itself, past Django's execute wrappers: a catalog read tells
        # nothing of any context, and a request's deferred key read (`pipelines.deferred_read`)
        # still goes in the round trip of the read it guards.
        connection.ensure_connection()
        with connection.wrap_database_errors:
            rows = connection.connection.execute(
                "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a"
                " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
                [table],
            ).fetchall()
        known = _column_types[table] = dict(rows)
    return [known[column] for column in columns]
