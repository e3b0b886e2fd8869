"""On a real Citus cluster (scripts/test_citus.sh: a coordinator and two workers built from the
Citus source, migrated and distributed by `manage.py distribute`): the layout is as planned, a
context's queries go to one shard, the search's `SET LOCAL hnsw.*` reaches the worker that
walks, an index's size is read from the shards, and the latest migration goes back and forth
on the distributed store. Skipped where no Citus build is named (AGENTMEMORY_CITUS_TREE), as in
CI without one."""

from __future__ import annotations

import os
from contextlib import contextmanager
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.test.utils import CaptureQueriesContext

from memory_app import auth, pipelines, scale_out, shard_reads
from memory_app.embeddings import client_vectors
from memory_app.management.commands.distribute import distribute_table
from memory_app.memories import Scope
from memory_app.models import Message
from memory_app.queries.memories import memories_retrieve
from memory_app.search import keyword as message_search
from memory_app.services.contexts import context_get_or_create
from memory_app.services.memories import memories_record
from tests.api_helpers import append, make_key, new_context
from tests.builders import make_context, register_models

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


def test_a_requests_key_and_context_are_read_without_a_multi_step_plan():
    """On a cluster the key (a local table) and its context (sharded) are two statements, the
    key's planned on the coordinator and the context's routed to its shard: a statement joining
    them is planned in steps (intermediate results, a connection of the coordinator to
    itself). A confined key still sees only the contexts inside its confinement."""
    inside = make_context(keys={"tenant": "acme", "chat": "1"})
    outside = make_context(keys={"tenant": "other", "chat": "1"})
    issued = auth.apikey_create(name="t", scopes=["read"], context_keys={"tenant": "acme"})
    statements = auth.key_context_statements(issued.secret, inside.id)
    assert len(statements) == 2
    key_plan, context_plan = (_explain(sql, params) for sql, params in statements)
    assert "Task Count" not in key_plan and "Subplan" not in key_plan, key_plan
    assert "Task Count: 1" in context_plan and "Subplan" not in context_plan, context_plan
    assert auth.apikey_verify_with_context(issued.secret, inside.id)[1].id == inside.id
    key, context = auth.apikey_verify_with_context(issued.secret, outside.id)
    assert key.pk == issued.key.pk and context is None


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


def test_a_loaded_table_is_distributed_with_its_hnsw_graphs_built_on_the_shards():
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as conn:
        conn.execute("DROP TABLE IF EXISTS probe_vectors")
        conn.execute("DROP TABLE IF EXISTS probe_derived")
        conn.execute("CREATE TABLE probe_vectors (context_id bigint, id bigint, v vector(3))")
        # A row trigger deriving rows into a table distributed after it, as the run-search
        # triggers do: the copy into the shards must not fire it.
        conn.execute("CREATE TABLE probe_derived (context_id bigint, id bigint)")
        conn.execute(
            "CREATE FUNCTION probe_derive() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " INSERT INTO probe_derived VALUES (NEW.context_id, NEW.id); RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER probe_derive AFTER INSERT ON probe_vectors"
            " FOR EACH ROW EXECUTE FUNCTION probe_derive()"
        )
        conn.execute(
            "INSERT INTO probe_vectors SELECT i % 7, i, ARRAY[i % 13, i % 17, 1]::vector"
            " FROM generate_series(1, 3000) i"
        )
        conn.execute(
            "CREATE INDEX probe_vectors_hnsw ON probe_vectors USING hnsw (v vector_l2_ops)"
            " WITH (m = 8)"
        )
        try:
            with conn.transaction(), conn.cursor() as cursor:
                distribute_table(cursor, "probe_vectors", "context_id", shards=4)
                distribute_table(cursor, "probe_derived", "context_id", colocate="probe_vectors")
            assert conn.execute("SELECT count(*) FROM probe_derived").fetchone()[0] == 3000
            # Every row reached a shard, and each shard's graph was built over them.
            assert conn.execute("SELECT count(*) FROM probe_vectors").fetchone()[0] == 3000
            per_shard = conn.execute(
                "SELECT result FROM run_command_on_shards('probe_vectors', $$SELECT"
                " indexdef FROM pg_indexes WHERE tablename = '%s'$$)"
            ).fetchall()
            assert len(per_shard) == 4
            assert all("USING hnsw (v vector_l2_ops) WITH (m='8')" in r[0] for r in per_shard)
            with conn.transaction():
                conn.execute("SET LOCAL citus.propagate_set_commands = 'local'")
                conn.execute("SET LOCAL enable_seqscan = off")
                plan = "\n".join(
                    row[0]
                    for row in conn.execute(
                        "EXPLAIN SELECT id FROM probe_vectors WHERE context_id = 3"
                        " ORDER BY v <-> '[1,2,1]' LIMIT 5"
                    ).fetchall()
                )
            assert "probe_vectors_hnsw" in plan, plan
        finally:
            conn.execute("DROP TABLE IF EXISTS probe_vectors, probe_derived")
            conn.execute("DROP FUNCTION IF EXISTS probe_derive()")


@contextmanager
def server_notices(setting: str, value: str):
    """The server's messages on the default connection while the block runs, with `setting`
    set to `value` for the session (reset after)."""
    connection.ensure_connection()
    seen: list[str] = []

    def on_notice(diagnostic) -> None:
        seen.append(diagnostic.message_primary or "")

    connection.connection.add_notice_handler(on_notice)
    with connection.cursor() as cursor:
        cursor.execute(f"SET {setting} = '{value}'")
    try:
        yield seen
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"RESET {setting}")
        connection.connection.remove_notice_handler(on_notice)


@contextmanager
def multi_shard_statements():
    """The statements run inside that Citus planned as more than one task (a fan-out to every
    shard): `citus.multi_task_query_log_level` warns of each, and the warning arrives while its
    statement runs, so the statement it belongs to is the one executing."""
    fanned: list[str] = []

    def wrapper(execute, sql, params, many, context):
        before = len(seen)
        try:
            return execute(sql, params, many, context)
        finally:
            if any("multi-task query" in message for message in seen[before:]):
                fanned.append(sql)

    with (
        server_notices("citus.multi_task_query_log_level", "warning") as seen,
        connection.execute_wrapper(wrapper),
    ):
        yield fanned


def test_the_agents_hot_paths_run_on_one_shard(settings):
    """Get-or-create, append (one and a batch), the window, select, keyword and semantic search,
    a run's creation, its steps (sent, then retried) with their tool calls, reading it and a step
    back, its finish: each statement they send names its context and is routed to one shard (a
    router query), none fans out."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    api = make_key(scopes=["read", "write"])
    register_models(**{"route-3": 3})
    with multi_shard_statements() as fanned:
        Message.objects.count()
    assert len(fanned) == 1  # what reads every shard is seen
    with multi_shard_statements() as fanned:
        cid = new_context(api, {"user": "ada", "chat": "routed"})
        assert new_context(api, {"user": "ada", "chat": "routed"}) == cid
        first = append(api, cid, text="red apples in the basket", client_id="m1")
        batch = api.post(
            f"/api/v1/contexts/{cid}/messages/batch",
            {
                "messages": [
                    {"role": "assistant", "text": "green pears"},
                    {"role": "user", "text": "blue sky"},
                ]
            },
        )
        assert batch.status_code in (200, 201), batch.content
        assert api.get(f"/api/v1/contexts/{cid}/messages", {"limit": 10}).status_code == 200
        assert api.get(f"/api/v1/contexts/{cid}/messages/{first['id']}").status_code == 200
        window = api.post(f"/api/v1/contexts/{cid}/select", {"selector": "window", "k": 2})
        assert window.json()["count"] == 2, window.content
        keyword = api.post(
            f"/api/v1/contexts/{cid}/select",
            {"selector": "search", "query": "apples", "k": 2, "mode": "keyword"},
        )
        assert _selected(keyword) == [first["id"]], keyword.content
    assert fanned == []
    messages = Message.objects.filter(context_id=cid).order_by("seq")
    for message, vector in zip(messages, VECTORS, strict=True):
        client_vectors.vector_put(model="route-3", vector=vector, message=message)
    with multi_shard_statements() as fanned:
        semantic = api.post(
            f"/api/v1/contexts/{cid}/select",
            {
                "selector": "search",
                "k": 1,
                "mode": "semantic",
                "model": "route-3",
                "query_vector": [1, 0, 0],
                "order": "rank",
            },
        )
        assert _selected(semantic) == [first["id"]], semantic.content
        run = api.post(f"/api/v1/contexts/{cid}/runs", {"client_id": "r1", "task": "fruit?"})
        assert run.status_code in (200, 201), run.content
        url = f"/api/v1/contexts/{cid}/runs/{run.json()['id']}"
        for _ in range(2):  # the second time is a retry: matched against what is stored
            steps = api.post(f"{url}/steps", {"steps": STEPS})
            assert steps.status_code in (200, 201), steps.content
        detail = api.get(url).json()
        assert [s["kind"] for s in detail["steps"]["items"]] == ["task", "action"], detail
        assert api.get(f"{url}/steps").status_code == 200
        step_id = detail["steps"]["items"][1]["id"]
        step = api.get(f"/api/v1/contexts/{cid}/steps/{step_id}").json()
        assert [c["name"] for c in step["tool_calls"]] == ["pick"], step
        finished = api.post(f"{url}/finish", {"status": "success", "final_answer": "pears"})
        assert finished.status_code == 200, finished.content
    assert fanned == []


@pytest.mark.django_db(transaction=True)
def test_a_keyword_ranking_runs_on_the_contexts_worker_over_its_shards(settings, monkeypatch):
    """Keyword search's statements go to the context's worker as calls of
    `memory_app_on_shard` (function call delegation): a small context's one statement, a large
    one's counts and ranking, each call pushed down, the one sharing its round trip with the
    request's key read too; there the statement reads the shards themselves. Inside a
    transaction block (where Citus would keep a call on the coordinator) the statements go as
    they are: the same hits either way."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    api = make_key(scopes=["read", "write"])
    cid = new_context(api, {"user": "ada", "chat": "delegated"})
    first = append(api, cid, text="red apples in the basket")
    append(api, cid, text="green pears and red apples, apples")
    append(api, cid, text="a basket of pears")
    body = {"selector": "search", "query": '"red apples" basket', "k": 2, "mode": "keyword"}
    answers = []
    for large, calls in ((False, 1), (True, 2)):
        if large:  # ranked the bounded way: the counts of the latest seqs, then the ranking
            monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)
            monkeypatch.setattr(message_search, "KEYWORD_RECENT_SEQS", 2)
        with (
            server_notices("client_min_messages", "debug1") as seen,
            CaptureQueriesContext(connection) as sent,
        ):
            response = api.post(f"/api/v1/contexts/{cid}/select", body)
        assert response.status_code == 200, response.content
        assert _selected(response)[0] == first["id"]
        sent_calls = [q for q in sent.captured_queries if "memory_app_on_shard" in q["sql"]]
        assert len(sent_calls) == calls, sent.captured_queries
        assert seen.count("pushing down the function call") == calls, seen
        answers.append(response.json()["items"])
        with transaction.atomic(), CaptureQueriesContext(connection) as sent:
            kept = api.post(f"/api/v1/contexts/{cid}/select", body)
        assert kept.json()["items"] == answers[-1]
        assert not [q for q in sent.captured_queries if "memory_app_on_shard" in q["sql"]]
    assert answers[0] == answers[1]
    # What the statement reads on the worker is the context's shard, by its own name.
    read = "SELECT m.tableoid::regclass::text FROM memory_app_message m WHERE m.context_id = %(c)s"
    checked = []
    key_read = [("SELECT 1", [])]  # deferred into the call's round trip, as a request's key
    with (
        server_notices("client_min_messages", "debug1") as seen,
        pipelines.deferred_read(key_read, checked.append),
    ):
        relations = shard_reads.read_rows(
            read,
            {"c": cid},
            context_id=cid,
            tables=["memory_app_message"],
            types=lambda: ["text"],
        )
    assert checked == [[(1,)]]
    assert seen.count("pushing down the function call") == 1, seen
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT shard_name('memory_app_message'::regclass,"
            " get_shard_id_for_distribution_column('memory_app_message', %s))",
            [cid],
        )
        assert relations == [cursor.fetchone()] * 3


VECTORS = ([1, 0, 0], [0, 1, 0], [0, 0, 1])
STEPS = [
    {"client_id": "s1", "kind": "task", "task": "fruit?"},
    {
        "client_id": "s2",
        "kind": "action",
        "step_number": 1,
        "model_output": "pick a fruit",
        "tool_calls": [{"call_id": "c1", "name": "pick", "arguments": {"what": "pears"}}],
    },
]


def _selected(response) -> list[int]:
    return [item["message"]["id"] for item in response.json()["items"]]


def test_memories_stay_on_the_coordinator_and_recall_crosses_shards(system_actor):
    """Memories are local tables on the coordinator (a key-subset memory belongs to no context,
    so to no shard): a recall reads them there alone, as one node does, whatever shards the
    recalling contexts live on. A key-subset memory is recalled by contexts on two shards, each
    context's own memory by that context alone."""
    with connection.cursor() as cursor:
        for table in MEMORY_TABLES:
            cursor.execute(
                "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = %s::regclass", [table]
            )
            assert cursor.fetchone()[0] == 0, f"{table} is not local"
        by_shard = {}
        for n in range(8):
            context = context_get_or_create(keys={"user": "ada", "chat": f"shard-{n}"})[0]
            cursor.execute(
                "SELECT get_shard_id_for_distribution_column('memory_app_context', %s)",
                [context.pk],
            )
            by_shard.setdefault(cursor.fetchone()[0], context)
    assert len(by_shard) >= 2
    a, b = list(by_shard.values())[:2]

    def remember(scope, text):
        [made] = memories_record(scope=scope, items=[{"content": text}], actor=system_actor)
        return made.record.pk

    shared = remember(Scope(keys={"user": "ada"}), "Ada drinks green tea every morning")
    own_a = remember(Scope(context=a), "Chat A: tea with the Lisbon team")
    own_b = remember(Scope(context=b), "Chat B: tea at the Porto office")
    remember(Scope(keys={"user": "bob"}), "Bob drinks tea too")
    with multi_shard_statements() as fanned:
        by_keyword = memories_retrieve(context=a, keywords=["tea"], limit=10)
        by_query = memories_retrieve(context=b, query="tea", limit=10)
    assert fanned == []
    assert {r.record.pk for r in by_keyword} == {shared, own_a}
    assert {r.record.pk for r in by_query} == {shared, own_b}


MEMORY_TABLES = (
    "memory_app_memoryrecord",
    "memory_app_memoryembedding",
    "memory_app_memoryembeddingretry",
    "memory_app_memoryversion",
)


def _shards_taking_seqs() -> int:
    """How many shards of the messages carry the trigger that takes a new message's seq (on a
    shard it is named after the shard; its function is the one the migration made)."""
    command = (
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass"
        " AND tgfoid = 'memory_app_message_take_seq'::regproc"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(result::int), 0)"
            " FROM run_command_on_shards('memory_app_message', %s)",
            [command],
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_later_migration_applies_to_the_distributed_store():
    """An operator upgrading a store already distributed runs `manage.py migrate` as before:
    the latest migration taken back and applied again on the cluster, each of its DDL
    statements passed on to every shard, and an append, which takes its seq from a trigger
    made by a migration (0043), still works and finds that trigger on every shard."""
    loader = MigrationLoader(connection)
    [latest] = [node for node in loader.graph.leaf_nodes() if node[0] == "memory_app"]
    [before] = [n for n in loader.graph.node_map[latest].parents if n.key[0] == "memory_app"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM citus_shards WHERE table_name = %s::regclass",
            ["memory_app_message"],
        )
        shards = cursor.fetchone()[0]
    assert _shards_taking_seqs() == shards
    try:
        call_command("migrate", *before.key, verbosity=0)
        assert latest not in MigrationRecorder(connection).applied_migrations()
    finally:
        # Forward again whatever happened: the suites after this one share the database.
        call_command("migrate", "memory_app", verbosity=0)
    assert latest in MigrationRecorder(connection).applied_migrations()
    assert _shards_taking_seqs() == shards
    call_command("distribute", "--check", stdout=StringIO())  # delegated functions too
    client = make_key()
    context_id = new_context(client, {"user": "ada", "chat": "migrated"})
    first, second = append(client, context_id, text="one"), append(client, context_id, text="two")
    assert (first["seq"], second["seq"]) == (1, 2)


def test_every_gin_index_keeps_a_small_pending_list_on_every_shard():
    """Every GIN index keeps its 1 MB pending list (migrations 0047 and 0048) on every shard of
    every distributed table, where the searches read it."""
    gin = (
        "SELECT count(*) FILTER (WHERE coalesce(c.reloptions, '{}')"
        " @> ARRAY['gin_pending_list_limit=1024']) || '/' || count(*)"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_am a ON a.oid = c.relam WHERE i.indrelid = '%s'::regclass AND a.amname = 'gin'"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name::text FROM citus_tables WHERE citus_table_type = 'distributed'"
        )
        tables = [row[0] for row in cursor.fetchall()]
        counts = {}
        for table in tables:
            cursor.execute("SELECT result FROM run_command_on_shards(%s, %s)", [table, gin])
            counts[table] = [tuple(map(int, row[0].split("/"))) for row in cursor.fetchall()]
    assert len(counts["memory_app_messagesearch"]) > 1
    for table in ("memory_app_message", "memory_app_messagesearch", "memory_app_context"):
        assert all(total > 0 for _, total in counts[table]), counts
    assert {t: c for t, c in counts.items() if any(small != total for small, total in c)} == {}
