"""Turn a migrated database on a Citus coordinator into the distributed layout, then check it:
`manage.py distribute [--shard-count N] [--plan] [--check]` (docs/scale-out.md).

The layout comes from the catalog (`memory_app.scale_out`): contexts distributed by `id`, every
table of context rows by `context_id` co-located with them, what those point at copied to every
worker, the rest local on the coordinator. Nothing changes while the schema holds anything
Citus would refuse: each such thing is named and the command stops. Run it again at any time:
tables already distributed are checked, not touched.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

from memory_app.scale_out import CONTEXTS, DISTRIBUTED, REFERENCE, Layout, read_layout

# Citus's own default: 32 shards of each table, co-located (shard n of every table together).
DEFAULT_SHARDS = 32

# Set on the database for every session of the site:
DATABASE_SETTINGS = {
    # The row triggers left on context tables touch their own row's context only
    # (tests/test_citus_sql.py holds that), which is what Citus calls safe; it asks for this
    # before it keeps any trigger on a distributed table.
    "citus.enable_unsafe_triggers": "on",
    # A search's `SET LOCAL hnsw.*` (memory_app.search.semantic) reaches the worker that runs
    # the walk; without it the iterative scan and ef_search stay at the workers' defaults. An
    # append's `SET LOCAL agentmemory.queue_model` (services.message_rows) reaches the worker
    # whose trigger queues the new messages for their vectors; without it none are queued.
    "citus.propagate_set_commands": "local",
    # What joins rows by id alone (a step with its run in the by-id routes, the dashboard's
    # cross-context pages, Django's cascades) runs as a repartition join; the agent paths name
    # their context and are routed to one shard.
    "citus.enable_repartition_joins": "on",
}

_PLACED_SQL = """
    SELECT logicalrelid::regclass::text, partmethod,
        CASE WHEN partmethod = 'h' THEN column_to_column_name(logicalrelid, partkey) END,
        colocationid
    FROM pg_dist_partition
"""


# Functions that run where a context's shards are (Citus sends a call to the worker holding its
# distribution argument's shard): their signature as `regprocedure` writes it, and that
# argument's name.
DELEGATED_FUNCTIONS = {
    # A read of one context's rows planned on its worker only (migration 0046,
    # memory_app.shard_reads).
    "memory_app_on_shard(bigint,text,regclass[])": "context_id",
}

_DELEGATED_SQL = """
    SELECT o.objid::regprocedure::text, o.distribution_argument_index, o.colocationid
    FROM pg_catalog.pg_dist_object o
    WHERE o.classid = 'pg_proc'::regclass
      AND o.objid = ANY(ARRAY(SELECT to_regprocedure(f) FROM unnest(%s::text[]) f))
"""

_HNSW_INDEXES_SQL = """
    SELECT c.relname, pg_get_indexdef(c.oid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
    WHERE i.indrelid = %s::regclass AND a.amname = 'hnsw'
    ORDER BY c.relname
"""


def distribute_table(
    cursor, table: str, column: str, *, shards: int | None = None, colocate: str | None = None
) -> None:
    """Distribute `table` by `column`, co-located with `colocate` or (with `shards`) in a group
    of its own. A table that already holds rows has its HNSW graphs dropped first and built
    again on the shards after: Citus would otherwise insert every copied vector into each
    shard's graph one at a time, some hundred times slower than building the graph in bulk.
    The rows are copied with user triggers off (`session_replication_role`, passed on to the
    workers' connections): what they derive (full-text rows, run-search rows) is already
    stored beside them and is distributed in its own turn, and a trigger firing on a shard
    would write into a table that may not be distributed yet. The caller's transaction keeps
    the drop, the copy and the rebuild together."""
    quoted = connection.ops.quote_name(table)
    cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {quoted})")  # noqa: S608 - catalog name
    loaded = cursor.fetchone()[0]
    graphs = []
    if loaded:
        cursor.execute(_HNSW_INDEXES_SQL, [table])
        graphs = cursor.fetchall()
        cursor.execute("SET LOCAL citus.propagate_set_commands = 'local'")
        cursor.execute("SET LOCAL session_replication_role = replica")
    for name, _definition in graphs:
        cursor.execute(f"DROP INDEX {connection.ops.quote_name(name)}")
    if colocate is None:
        cursor.execute(
            "SELECT create_distributed_table(%s, %s, shard_count => %s, colocate_with => 'none')",
            [table, column, shards],
        )
    else:
        cursor.execute(
            "SELECT create_distributed_table(%s, %s, colocate_with => %s)",
            [table, column, colocate],
        )
    if loaded:
        cursor.execute("SET LOCAL session_replication_role = origin")
    for _name, definition in graphs:
        cursor.execute(definition)


class Command(BaseCommand):
    help = "Distribute the tables on a Citus coordinator by context (and check the result)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--shard-count", type=int, default=DEFAULT_SHARDS, help="shards per distributed table"
        )
        parser.add_argument(
            "--plan", action="store_true", help="print what each table becomes; change nothing"
        )
        parser.add_argument(
            "--check", action="store_true", help="check the layout in place; change nothing"
        )

    def handle(self, *args, **opts):
        with connection.cursor() as cursor:
            layout = read_layout(cursor)
        if opts["plan"]:
            self._print_plan(layout)
            return
        if layout.problems:
            raise CommandError(
                "the schema cannot be distributed yet:\n  " + "\n  ".join(layout.problems)
            )
        with connection.cursor() as cursor:
            cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
            row = cursor.fetchone()
        if row is None:
            raise CommandError(
                "this database is not on a Citus coordinator (no citus extension): run "
                "CREATE EXTENSION citus and add the workers first (docs/scale-out.md)"
            )
        if not opts["check"]:
            self._distribute(layout, opts["shard_count"])
        wrong = self._misplaced(layout)
        if wrong:
            raise CommandError("the layout is not as planned:\n  " + "\n  ".join(wrong))
        by_context = [t for t in layout.of_kind(DISTRIBUTED) if t.column == "context_id"]
        self.stdout.write(
            f"ok: citus {row[0]}, {len(layout.of_kind(DISTRIBUTED))} distributed tables "
            f"({len(by_context)} co-located with {CONTEXTS}), "
            f"{len(layout.of_kind(REFERENCE))} reference"
        )

    def _print_plan(self, layout: Layout) -> None:
        for table in layout.tables:
            by = f" by {table.column}" if table.column else ""
            self.stdout.write(f"{table.name}: {table.kind}{by}")
        for problem in layout.problems:
            self.stdout.write(f"blocked: {problem}")

    def _distribute(self, layout: Layout, shards: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(_PLACED_SQL)
            placed = {row[0] for row in cursor.fetchall()}
            cursor.execute("SELECT current_database()")
            database = connection.ops.quote_name(cursor.fetchone()[0])
            for name, value in DATABASE_SETTINGS.items():
                cursor.execute(f"ALTER DATABASE {database} SET {name} = '{value}'")
                cursor.execute(f"SET {name} = '{value}'")
            for table in layout.tables:
                if table.name in placed or table.kind not in (DISTRIBUTED, REFERENCE):
                    continue
                self.stdout.write(f"{table.name}: {table.kind} ...")
                # One table per transaction: a failure leaves the earlier ones done and this
                # one as it was, and the command picks up from there when run again.
                with transaction.atomic():
                    if table.kind == REFERENCE:
                        cursor.execute("SELECT create_reference_table(%s)", [table.name])
                    elif table.name == CONTEXTS or table.column != "context_id":
                        distribute_table(cursor, table.name, table.column, shards=shards)
                    else:
                        distribute_table(cursor, table.name, table.column, colocate=CONTEXTS)

            # Rows already there were copied into the shards; the coordinator's own copy is
            # dead weight, and goes once no table still local points at it.
            for table in layout.tables:
                if table.name not in placed and table.kind == DISTRIBUTED:
                    cursor.execute(
                        "SELECT truncate_local_data_after_distributing_table(%s)", [table.name]
                    )

            # Last: a failure here leaves the tables done, and running the command again
            # distributes the functions.
            for function, argument in DELEGATED_FUNCTIONS.items():
                cursor.execute(
                    "SELECT create_distributed_function(%s, %s, colocate_with => %s)",
                    [function, argument, CONTEXTS],
                )

    def _misplaced(self, layout: Layout) -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute(_PLACED_SQL)
            placed = {row[0]: row[1:] for row in cursor.fetchall()}
            cursor.execute(
                "SELECT unnest(setconfig) FROM pg_db_role_setting s JOIN pg_database d"
                " ON d.oid = s.setdatabase WHERE d.datname = current_database()"
                " AND s.setrole = 0"
            )
            configured = {row[0] for row in cursor.fetchall()}
            cursor.execute(_DELEGATED_SQL, [list(DELEGATED_FUNCTIONS)])
            delegated = {row[0]: row[1:] for row in cursor.fetchall()}
        contexts_group = placed.get(CONTEXTS, (None, None, None))[2]
        wrong = [
            f"the database does not set {name} = {value}"
            for name, value in DATABASE_SETTINGS.items()
            if f"{name}={value}" not in configured
        ]
        for function in DELEGATED_FUNCTIONS:
            argument, group = delegated.get(function, (None, None))
            if argument is None or group != contexts_group:
                wrong.append(f"{function}: not distributed with {CONTEXTS}")
        for table in layout.tables:
            method, column, group = placed.get(table.name, (None, None, None))
            if table.kind == REFERENCE and method != "n":
                wrong.append(f"{table.name}: not a reference table")
            elif table.kind == DISTRIBUTED:
                if method != "h" or column != table.column:
                    wrong.append(f"{table.name}: not distributed by {table.column}")
                elif table.column == "context_id" and group != contexts_group:
                    wrong.append(f"{table.name}: not co-located with {CONTEXTS}")
        return wrong
