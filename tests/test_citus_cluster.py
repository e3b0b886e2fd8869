"""On a real Citus cluster (scripts/test_citus.sh: a coordinator and two workers built from the
Citus source, migrated and distributed by `manage.py distribute`): the layout is as planned, a
context's queries go to one shard, the search's `SET LOCAL hnsw.*` reaches the worker that
walks, and an index's size is read from the shards. Skipped where no Citus build is named
(AGENTMEMORY_CITUS_TREE), as in CI without one."""

from __future__ import annotations

import os

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction

from memory_app import scale_out
from tests.builders import make_context

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("AGENTMEMORY_CITUS_TREE"),
        reason="no Citus build (scripts/build_citus.sh, then make test-citus)",
    ),
    pytest.mark.django_db,
]


def _explain(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_layout_is_the_planned_one(capsys):
    call_command("distribute", "--check")
    assert "ok: citus" in capsys.readouterr().out
    with connection.cursor() as cursor:
        assert scale_out.is_distributed(cursor, "memory_app_message")
        assert not scale_out.is_distributed(cursor, "memory_app_apikey")


def test_a_contexts_window_goes_to_one_shard():
    context = make_context(messages=1)
    plan = _explain(
        "SELECT seq, text FROM memory_app_message WHERE context_id = %s ORDER BY seq DESC LIMIT 10",
        [context.id],
    )
    assert "Task Count: 1" in plan, plan
    plan = _explain("SELECT count(*) FROM memory_app_message", [])
    assert "Task Count: 1\n" not in plan + "\n", plan  # the whole table fans out


def test_set_local_hnsw_reaches_the_worker():
    context = make_context(messages=1)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL hnsw.ef_search = 123")
        # Routed whole to the worker of the context's shard: current_setting runs there.
        cursor.execute(
            "SELECT current_setting('hnsw.ef_search') FROM memory_app_message"
            " WHERE context_id = %s LIMIT 1",
            [context.id],
        )
        assert cursor.fetchone()[0] == "123"


def test_an_index_size_is_summed_over_the_shards():
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as conn:
        conn.execute("DROP TABLE IF EXISTS probe_rows")
        conn.execute("CREATE TABLE probe_rows (context_id bigint, id bigint, v int)")
        conn.execute("CREATE INDEX probe_rows_some_model_idx ON probe_rows (v) WHERE v > 10")
        conn.execute(
            "SELECT create_distributed_table('probe_rows', 'context_id', shard_count => 4)"
        )
        conn.execute(
            "INSERT INTO probe_rows SELECT i % 50, i, i % 100 FROM generate_series(1, 20000) i"
        )
        conn.execute("ANALYZE probe_rows")
        try:
            with connection.cursor() as cursor:
                rows = scale_out.index_rows_on_shards(
                    cursor, "probe_rows", "probe_rows_some_model_idx"
                )
        finally:
            conn.execute("DROP TABLE probe_rows")
    # 89 of each 100 rows are in the partial index; the estimate is the planner's.
    assert abs(rows - 17_800) < 1_000
