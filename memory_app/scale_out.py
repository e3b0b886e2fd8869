"""What each table becomes on a Citus cluster, read from the catalog (docs/scale-out.md).

The layout is derived, not listed: a table whose rows carry a NOT NULL `context_id` is
distributed by it and co-located with the contexts (distributed by their `id`); one whose
`context_id` may be NULL (rows of no context: audit events, key-subset memories) is not; a table a
distributed one points at with a foreign key and that is not distributed itself is a reference
table (copied to every worker); the rest stay local on the coordinator. A table added later
lands in its place by the same rules, and what would keep it from being distributed is named
(`layout_problems`) before anything changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONTEXTS = "memory_app_context"
# Tables distributed by a column of their own rather than by context: the contexts themselves,
# and the lookup of a context by the digest of its keys (one shard per digest, so "same keys,
# same context" needs no cross-shard uniqueness).
DISTRIBUTED_BY_OWN_COLUMN = {CONTEXTS: "id", "memory_app_contextkey": "digest"}

DISTRIBUTED = "distributed"
REFERENCE = "reference"
LOCAL = "local"

_TABLES_SQL = """
    SELECT c.relname,
        (SELECT a.attnotnull FROM pg_attribute a
         WHERE a.attrelid = c.oid AND a.attname = 'context_id' AND NOT a.attisdropped)
    FROM pg_class c
    WHERE c.relkind IN ('r', 'p') AND c.relnamespace = 'public'::regnamespace
        AND NOT c.relispartition
    ORDER BY c.relname
"""
_FOREIGN_SQL = """
    SELECT f.conname, f.conrelid::regclass::text, f.confrelid::regclass::text,
        array(SELECT a.attname FROM unnest(f.conkey) WITH ORDINALITY AS k (num, ord)
              JOIN pg_attribute a ON a.attrelid = f.conrelid AND a.attnum = k.num
              ORDER BY k.ord),
        array(SELECT a.attname FROM unnest(f.confkey) WITH ORDINALITY AS k (num, ord)
              JOIN pg_attribute a ON a.attrelid = f.confrelid AND a.attnum = k.num
              ORDER BY k.ord)
    FROM pg_constraint f
    WHERE f.contype = 'f' AND f.connamespace = 'public'::regnamespace
"""
_UNIQUE_SQL = """
    SELECT i.indrelid::regclass::text, i.indexrelid::regclass::text,
        array(SELECT a.attname FROM unnest(i.indkey) k
              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
    WHERE i.indisunique AND c.relnamespace = 'public'::regnamespace
"""


@dataclass
class Table:
    name: str
    kind: str
    column: str = ""  # the distribution column of a distributed table
    # Distributed tables this one's foreign keys point at: they are distributed first.
    after: list[str] = field(default_factory=list)


@dataclass
class Layout:
    tables: list[Table]
    problems: list[str]

    def of_kind(self, kind: str) -> list[Table]:
        return [t for t in self.tables if t.kind == kind]


def read_layout(cursor) -> Layout:
    """The layout of every table of the public schema, in the order to create it (reference
    tables, then the contexts, then the rest with each after the tables it points at)."""
    cursor.execute(_TABLES_SQL)
    context_column = dict(cursor.fetchall())  # table -> NOT NULL (None: no context_id)
    distributed = {
        t: DISTRIBUTED_BY_OWN_COLUMN.get(t, "context_id")
        for t, not_null in context_column.items()
        if t in DISTRIBUTED_BY_OWN_COLUMN or not_null
    }
    cursor.execute(_FOREIGN_SQL)
    foreign = cursor.fetchall()
    cursor.execute(_UNIQUE_SQL)
    unique = cursor.fetchall()

    problems = []
    reference: set[str] = set()
    pending = [target for _, table, target, _, _ in foreign if table in distributed]
    while pending:  # what a reference table points at must be a reference table too
        target = pending.pop()
        if target in distributed or target in reference:
            continue
        reference.add(target)
        pending += [tgt for _, table, tgt, _, _ in foreign if table == target]
    for name, table, target, columns, target_columns in foreign:
        if table in distributed and target in distributed:
            # Co-located rows only: the distribution columns are paired by the key.
            pairs = set(zip(columns, target_columns, strict=True))
            if (distributed[table], distributed[target]) not in pairs:
                problems.append(
                    f"{table}: foreign key {name} {columns} -> {target} lacks {distributed[table]}"
                )
        elif target in distributed:
            problems.append(
                f"{table}: foreign key {name} -> {target} points from a "
                f"{'reference' if table in reference else 'local'} table into a distributed one"
            )
    for table, index, columns in unique:
        column = distributed.get(table)
        if column and column not in columns:
            problems.append(f"{table}: unique index {index} {columns} lacks {column}")

    after = {t: [] for t in distributed}
    for _, table, target, _, _ in foreign:
        if table in distributed and target in distributed and target != table:
            after[table].append(target)
    tables = [Table(t, REFERENCE) for t in sorted(reference)]
    tables += [
        Table(t, DISTRIBUTED, distributed[t], sorted(set(after[t])))
        for t in _in_dependency_order(after)
    ]
    tables += [
        Table(t, LOCAL) for t in context_column if t not in distributed and t not in reference
    ]
    return Layout(tables, sorted(problems))


def _in_dependency_order(after: dict[str, list[str]]) -> list[str]:
    done: list[str] = []
    seen: set[str] = set()

    def visit(table: str, path: frozenset[str]) -> None:
        if table in seen or table in path:
            return
        for target in sorted(after[table]):
            visit(target, path | {table})
        seen.add(table)
        done.append(table)

    for table in sorted(after, key=lambda t: (t != CONTEXTS, t)):
        visit(table, frozenset())
    return done


# Per process: whether a table is distributed does not change while a server runs (the
# `distribute` command runs before the site serves the cluster).
_distributed: dict[str, bool] = {}


def is_distributed(cursor, table: str) -> bool:
    """Whether `table` is a Citus distributed table (False on a PostgreSQL without Citus)."""
    if table not in _distributed:
        cursor.execute("SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL")
        found = cursor.fetchone()[0]
        if found:
            cursor.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition"
                " WHERE logicalrelid = to_regclass(%s) AND partmethod = 'h')",
                [table],
            )
            found = cursor.fetchone()[0]
        _distributed[table] = bool(found)
    return _distributed[table]


def table_is_distributed(table: str) -> bool:
    """`is_distributed` on the default connection, which opens a cursor only the first time
    (a request's hot path asks on every call)."""
    found = _distributed.get(table)
    if found is None:
        from django.db import connection

        with connection.cursor() as cursor:
            found = is_distributed(cursor, table)
    return found


def index_rows_on_shards(cursor, table: str, index: str) -> int:
    """The planner's row estimate of `index` summed over the shards of distributed `table`: on
    the coordinator the index belongs to an empty shell. Each shard's copy is named after the
    index (Citus appends the shard id, shortening a long name), so it is found by prefix; the
    names are the indexer's own."""
    # run_command_on_shards puts each shard's name where the command says %s (format() turns
    # %%s into %s, and %L quotes the prefix).
    command = (
        "SELECT greatest(max(c.reltuples), 0) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = '%%s'::regclass AND starts_with(c.relname, %L)"
    )
    cursor.execute(
        "SELECT coalesce(sum(nullif(result, '')::float8), 0)::bigint"
        " FROM run_command_on_shards(%s, format(%s, %s)) WHERE success",
        [table, command, index[:40]],
    )
    return int(cursor.fetchone()[0])
