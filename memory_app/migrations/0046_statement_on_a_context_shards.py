"""`memory_app_on_shard(context_id, statement, tables)`: a read of one context's rows, run where
its rows are.

On a distributed store `manage.py distribute` makes it a distributed function by `context_id`,
co-located with the contexts: Citus sends a call naming a context to the worker that holds the
context's shards as it is (function call delegation), and there the statement runs over those
shards, planned by PostgreSQL alone. A statement of several joins and CTEs sent as itself is
planned twice, in full by Citus on the coordinator and again on the worker, which costs more
than running it (`memory_app.shard_reads`).

`statement` is a `format()` string: `%1$s`, `%2$s`, … stand for `tables` in their order, and
every `%` of its own is written `%%`. They become the context's shards when this node holds an
active placement of each (`pg_dist_placement` of the local group: an orphaned copy left behind
by a shard move is not one), else the tables' own names, so the call is right wherever it runs:
on one node, or on the coordinator when Citus did not delegate it (inside a transaction block),
the statement is the one written over the tables. The caller's privileges apply (SECURITY
INVOKER): it runs nothing the caller could not; and it is STABLE, so the statement runs
read-only (PL/pgSQL refuses a write there).
"""

from django.db import migrations

FUNCTION_SQL = r"""
CREATE OR REPLACE FUNCTION memory_app_on_shard(context_id bigint, statement text,
                                               tables regclass[])
RETURNS SETOF record LANGUAGE plpgsql STABLE AS $$
DECLARE
    names text[] := tables::text[];
    shards text[];
BEGIN
    IF to_regclass('pg_catalog.pg_dist_placement') IS NOT NULL THEN
        -- Each shard id first (OFFSET 0 keeps the lookup from running once per placement),
        -- then whether this node holds it.
        SELECT array_agg(pg_catalog.shard_name(t.rel, t.shard) ORDER BY t.o) INTO shards
        FROM (SELECT u.rel, u.o,
                     pg_catalog.get_shard_id_for_distribution_column(u.rel, context_id) AS shard
              FROM unnest(tables) WITH ORDINALITY u (rel, o) OFFSET 0) t
        WHERE EXISTS (SELECT FROM pg_catalog.pg_dist_placement p
                      WHERE p.shardid = t.shard AND p.shardstate = 1
                        AND p.groupid = (SELECT groupid FROM pg_catalog.pg_dist_local_group));
        IF cardinality(shards) = cardinality(tables) THEN
            names := shards;
        END IF;
    END IF;
    RETURN QUERY EXECUTE format(statement, VARIADIC names);
END $$
"""


def delegate_on_a_distributed_store(apps, schema_editor):
    """On a store already distributed, the function becomes a distributed one here, as
    `manage.py distribute` makes it on a store distributed after this migration."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL")
        if not cursor.fetchone()[0]:
            return
        cursor.execute(
            "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition"
            " WHERE logicalrelid = 'memory_app_context'::regclass)"
        )
        if cursor.fetchone()[0]:
            cursor.execute(
                "SELECT create_distributed_function('memory_app_on_shard(bigint, text, regclass[])',"
                " 'context_id', colocate_with => 'memory_app_context')"
            )


class Migration(migrations.Migration):
    # As 0043: a function's DDL in a transaction of its own, so that it runs on Citus either
    # way and can run again after a failure.
    atomic = False

    dependencies = [("memory_app", "0045_message_queues_its_vector")]

    operations = [
        migrations.RunSQL(
            FUNCTION_SQL, "DROP FUNCTION IF EXISTS memory_app_on_shard(bigint, text, regclass[])"
        ),
        migrations.RunPython(delegate_on_a_distributed_store, migrations.RunPython.noop),
    ]
