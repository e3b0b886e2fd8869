"""Every table born ready for Citus: rows of one context carry `context_id` in their primary key
and in every unique constraint and index, and the foreign keys between such tables carry it too,
so that a row only points at a row of its own context (docs/scale-out.md).

Read from the catalog, not from the models: Django follows `id` alone, the database's keys are
composite (migration 0020). A new table with a `context_id` column fails here until its keys
are, or until it is listed below with the reason it is not yet."""

from __future__ import annotations

import json
import textwrap

import pytest
from django.db import connection

from .test_foundation import run_on_a_new_database

# Still keyed by `id` alone, each for the reason given; the step that fixes one removes it here
# (the test fails on an entry that no longer needs to be here).
TABLES_NOT_YET_DISTRIBUTED = {
    # A key-subset memory belongs to no context (context_id NULL): memories become a reference
    # or local table once they are split from the context-scoped rows.
    "memory_app_memoryrecord",
}
# Kept off the shards by design, whatever their columns: exempt from the keys above, but like
# every table that is not distributed they hold no foreign key into one (Citus refuses it).
NOT_DISTRIBUTED = {
    # Events of the operator's actions, inside or outside any context (keys, users).
    "memory_app_auditevent": "local: the operator's trail, on the coordinator",
}
# None left: nothing points at a message or a step by `id` alone (migration 0032).
UNIQUE_WITHOUT_CONTEXT: set[str] = set()
FOREIGN_KEYS_WITHOUT_CONTEXT: set[tuple[str, str]] = set()

CATALOG_SQL = {
    "tables": """
        SELECT c.oid::regclass::text, a.attnotnull FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'context_id'
            AND NOT a.attisdropped
        WHERE c.relkind IN ('r', 'p') AND c.relnamespace = 'public'::regnamespace
    """,
    # Unique indexes, those behind primary keys and unique constraints included.
    "unique": """
        SELECT i.indrelid::regclass::text, i.indexrelid::regclass::text, i.indisprimary,
            array(SELECT a.attname FROM unnest(i.indkey) k
                  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
        WHERE i.indisunique AND c.relnamespace = 'public'::regnamespace
    """,
    "foreign": """
        SELECT f.conname, f.conrelid::regclass::text, f.confrelid::regclass::text,
            array(SELECT a.attname FROM unnest(f.conkey) WITH ORDINALITY AS k (num, ord)
                  JOIN pg_attribute a ON a.attrelid = f.conrelid AND a.attnum = k.num
                  ORDER BY k.ord),
            array(SELECT a.attname FROM unnest(f.confkey) WITH ORDINALITY AS k (num, ord)
                  JOIN pg_attribute a ON a.attrelid = f.confrelid AND a.attnum = k.num
                  ORDER BY k.ord)
        FROM pg_constraint f
        WHERE f.contype = 'f' AND f.connamespace = 'public'::regnamespace
    """,
}


def citus_shape_violations(cursor) -> list[str]:
    """What keeps the schema from being distributed by context, one line each; also every
    allow-list entry that no longer excuses anything (so the lists only shrink)."""
    cursor.execute(CATALOG_SQL["tables"])
    tables = {t: n for t, n in cursor.fetchall() if t not in NOT_DISTRIBUTED}
    distributed = (tables.keys() - TABLES_NOT_YET_DISTRIBUTED) | {"memory_app_context"}
    into_shards = []
    found: dict[str, list[str]] = {t: [] for t in tables}  # per table with a context_id
    for table, not_null in tables.items():
        if not not_null:
            found[table].append(f"{table}: context_id may be NULL")
    cursor.execute(CATALOG_SQL["unique"])
    keyed, excused = set(), set()
    for table, index, primary, columns in cursor.fetchall():
        if table not in tables:
            continue
        keyed |= {table} if primary else set()
        if "context_id" in columns:
            continue
        if index in UNIQUE_WITHOUT_CONTEXT:
            excused.add(index)
            continue
        kind = "primary key" if primary else "unique index"
        found[table].append(f"{table}: {kind} {index} {columns} lacks context_id")
    for table in tables.keys() - keyed:
        found[table].append(f"{table}: no primary key")
    cursor.execute(CATALOG_SQL["foreign"])
    for name, table, target, columns, target_columns in cursor.fetchall():
        if target in distributed and table not in distributed:
            into_shards.append(
                f"{table}: foreign key {name} {columns} -> {target}, a table"
                " kept off the shards pointing into a distributed one"
            )
        if table not in tables or target not in tables:
            continue  # not between context-scoped tables (a context's own id is the key)
        if dict(zip(columns, target_columns, strict=True)).get("context_id") == "context_id":
            continue
        if len(columns) == 1 and (table, columns[0]) in FOREIGN_KEYS_WITHOUT_CONTEXT:
            excused.add((table, columns[0]))
            continue
        found[table].append(f"{table}: foreign key {name} {columns} -> {target} lacks context_id")
    problems = [p for table, lines in found.items() for p in lines]
    for table in TABLES_NOT_YET_DISTRIBUTED:
        if not found.get(table):
            problems.append(f"{table}: allow-listed, yet nothing to excuse")
        problems = [p for p in problems if not p.startswith(f"{table}: ") or "allow-listed" in p]
    for entry in (UNIQUE_WITHOUT_CONTEXT | FOREIGN_KEYS_WITHOUT_CONTEXT) - excused:
        problems.append(f"{entry}: allow-listed, yet nothing to excuse")
    return sorted(problems + into_shards)


@pytest.mark.django_db
def test_every_context_scoped_table_is_keyed_by_its_context():
    with connection.cursor() as cursor:
        assert citus_shape_violations(cursor) == []


@pytest.mark.django_db
def test_a_table_born_without_its_context_in_its_keys_is_named():
    """The guard itself: a new table keyed by `id` alone, unique on a column without the
    context, pointing at steps by a key whose context is not its own, fails it on each count."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE TABLE memory_app_newrows (
                id bigint PRIMARY KEY,
                context_id bigint,
                step_id bigint,
                step_context bigint,
                name text UNIQUE,
                FOREIGN KEY (step_id, step_context) REFERENCES memory_app_step (id, context_id)
            )
            """
        )
        problems = citus_shape_violations(cursor)
    assert problems == sorted(
        [
            "memory_app_newrows: context_id may be NULL",
            "memory_app_newrows: primary key memory_app_newrows_pkey ['id'] lacks context_id",
            "memory_app_newrows: unique index memory_app_newrows_name_key"
            " ['name'] lacks context_id",
            "memory_app_newrows: foreign key memory_app_newrows_step_id_step_context_fkey"
            " ['step_id', 'step_context'] -> memory_app_step lacks context_id",
        ]
    )


@pytest.mark.django_db
def test_a_table_kept_off_the_shards_pointing_into_them_is_named():
    """A table with no context (a reference or local one on Citus) holding a foreign key into
    messages fails the guard: Citus refuses such a key."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE TABLE memory_app_newnotes (
                id bigint PRIMARY KEY,
                message_id bigint,
                FOREIGN KEY (message_id, id) REFERENCES memory_app_message (id, context_id)
            )
            """
        )
        problems = citus_shape_violations(cursor)
    assert problems == [
        "memory_app_newnotes: foreign key memory_app_newnotes_message_id_id_fkey"
        " ['message_id', 'id'] -> memory_app_message, a table kept off the shards pointing"
        " into a distributed one"
    ]


# Run in its own process on its own database: it migrates back and forth, which the test
# database shared by the other tests must never see.
FORWARD_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentmemory_site.settings"
    import django
    django.setup()
    from django.core.management import call_command
    from django.db import IntegrityError, connection, transaction
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone
    from tests.test_citus_shape import citus_shape_violations

    BEFORE = ("memory_app", "0019_bounded_search_vectors")
    call_command("migrate", "memory_app", BEFORE[1], verbosity=0)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    model = lambda name: old.get_model("memory_app", name)
    Context, Run, Step, ToolCall, Message, TraceSpan, MemoryRecord, Embedding, Retry = map(
        model, ["Context", "Run", "Step", "ToolCall", "Message", "TraceSpan", "MemoryRecord",
                "Embedding", "EmbeddingRetry"])
    rows = {}
    for n in (1, 2):
        ctx = Context.objects.create(keys={"n": n}, keys_digest=str(n) * 64)
        run = Run.objects.create(context=ctx, task=f"task {n}")
        steps = [Step.objects.create(run=run, position=p, kind="action") for p in (1, 2)]
        calls = [ToolCall.objects.create(step=s, position=1, name="search") for s in steps]
        msg = Message.objects.create(context=ctx, seq=1, role="user", text="hi", run=run,
                                     step=steps[0])
        TraceSpan.objects.create(context=ctx, run=run, trace_id="t" * 32, span_id=f"{n}" * 16,
                                 role="step", start_ns=1, end_ns=2, data={})
        vector = Embedding.objects.create(message=msg, context=ctx, model="m")
        Retry.objects.create(embedding=vector, attempts=1, next_attempt_at=timezone.now())
        rows[n] = {"context": ctx.pk, "steps": [s.pk for s in steps],
                   "calls": [c.pk for c in calls], "retry": vector.pk}
    shared = MemoryRecord.objects.create(scope_keys={"n": 1}, scope_digest="s" * 64,
                                         content="a shared fact", content_hash="h" * 64,
                                         source_message=msg, source_step=steps[0])
    shared_vector = Embedding.objects.create(memory_record=shared, model="m")
    Retry.objects.create(embedding=shared_vector, attempts=2, next_attempt_at=timezone.now())

    call_command("migrate", "memory_app", verbosity=0)

    def read(sql, params=()):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    out = {"rows": rows, "shared_retry": shared_vector.pk}
    out["steps"] = read("SELECT id, context_id FROM memory_app_step ORDER BY id")
    out["calls"] = read("SELECT id, context_id FROM memory_app_toolcall ORDER BY id")
    out["retries"] = read(
        "SELECT embedding_id, context_id FROM memory_app_embeddingretry ORDER BY embedding_id")
    out["memory_vectors"] = read(
        "SELECT e.id, e.memory_record_id, r.attempts FROM memory_app_memoryembedding e"
        " JOIN memory_app_memoryembeddingretry r ON r.embedding_id = e.id")
    out["shared"] = shared.pk
    out["keys"] = dict(read(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE contype IN ('p', 'u', 'f') AND conrelid::regclass::text IN"
        " ('memory_app_run', 'memory_app_step', 'memory_app_toolcall', 'memory_app_message',"
        "  'memory_app_tracespan')"))
    out["context_keys"] = read(
        "SELECT digest, target_id FROM memory_app_contextkey ORDER BY target_id")
    out["digest_unique"] = read(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'memory_app_context'::regclass"
        " AND contype = 'u'")
    out["step_client_id_unique"] = read(
        "SELECT pg_get_indexdef('step_client_id_unique'::regclass)")[0][0]
    with connection.cursor() as cursor:
        out["violations"] = citus_shape_violations(cursor)
    # A message of context 2 pointing at context 1's run: refused by the composite key.
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO memory_app_message (context_id, seq, role, name, text, tags,"
                    " metadata, run_id, token_count, tokenizer, source_timestamp, created_at,"
                    " updated_at, pruned_by) VALUES (%s, 2, 'user', '', 'x', '{}', '{}', %s, 0,"
                    " '', '', now(), now(), '')",
                    [rows[2]["context"],
                     Run.objects.get(context_id=rows[1]["context"]).pk])
        out["cross_context"] = "stored"
    except IntegrityError as exc:
        out["cross_context"] = type(exc).__name__
    call_command("migrate", "memory_app", BEFORE[1], verbosity=0)
    out["back"] = dict(read(
        "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE contype = 'p' AND conrelid::regclass::text IN"
        " ('memory_app_run', 'memory_app_step', 'memory_app_message')"))
    out["back_vectors"] = read(
        "SELECT e.memory_record_id, e.context_id, r.attempts FROM memory_app_embedding e"
        " JOIN memory_app_embeddingretry r ON r.embedding_id = e.id"
        " WHERE e.memory_record_id IS NOT NULL")
    out["back_columns"] = read(
        "SELECT attrelid::regclass::text FROM pg_attribute WHERE attname = 'context_id'"
        " AND NOT attisdropped AND attrelid::regclass::text IN"
        " ('memory_app_step', 'memory_app_toolcall', 'memory_app_embeddingretry')")
    print("RESULT " + json.dumps(out))
    """  # noqa: E501 - the child process runs this text as written
)


def test_migrating_a_populated_store_copies_the_contexts_into_the_new_keys():
    with run_on_a_new_database("am_citus", ["-c", FORWARD_SCRIPT], timeout=300) as (done, _):
        assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    rows = out["rows"]
    context_of = {
        pk: rows[n]["context"] for n in rows for pk in rows[n]["steps"] + rows[n]["calls"]
    }
    assert out["steps"] == [[pk, context_of[pk]] for n in rows for pk in rows[n]["steps"]]
    assert out["calls"] == [[pk, context_of[pk]] for n in rows for pk in rows[n]["calls"]]
    # The messages' vectors keep their retries with their contexts; the shared memory's vector
    # and its retry moved to the memory tables, under the same id.
    assert out["retries"] == [[rows[n]["retry"], rows[n]["context"]] for n in rows]
    assert out["memory_vectors"] == [[out["shared_retry"], out["shared"], 2]]
    keys = out["keys"]
    assert keys["memory_app_run_pkey"] == "PRIMARY KEY (id, context_id)"
    assert keys["memory_app_step_pkey"] == "PRIMARY KEY (id, context_id)"
    assert keys["memory_app_toolcall_pkey"] == "PRIMARY KEY (id, context_id)"
    assert keys["memory_app_message_pkey"] == "PRIMARY KEY (id, context_id)"
    assert keys["memory_app_tracespan_pkey"] == "PRIMARY KEY (id, context_id)"
    assert keys["step_run_position_unique"] == 'UNIQUE (run_id, "position", context_id)'
    assert keys["toolcall_step_position_unique"] == 'UNIQUE (step_id, "position", context_id)'
    assert "(run_id, client_id, context_id) WHERE" in out["step_client_id_unique"]
    deferred = "DEFERRABLE INITIALLY DEFERRED"
    for name, child, parent in [
        ("step_run_fk", "run_id", "memory_app_run"),
        ("toolcall_step_fk", "step_id", "memory_app_step"),
        ("message_run_fk", "run_id", "memory_app_run"),
        ("message_step_fk", "step_id", "memory_app_step"),
        ("tracespan_run_fk", "run_id", "memory_app_run"),
    ]:
        assert keys[name] == (
            f"FOREIGN KEY ({child}, context_id) REFERENCES {parent}(id, context_id) {deferred}"
        )
    assert out["violations"] == []
    assert out["cross_context"] == "IntegrityError"
    # Every context found by its digest through the digest table, none by a unique constraint.
    assert out["context_keys"] == [[str(n) * 64, rows[n]["context"]] for n in rows]
    assert out["digest_unique"] == []
    # Reversible: the keys of 0019 and no copied column.
    assert set(out["back"].values()) == {"PRIMARY KEY (id)"}
    assert out["back_vectors"] == [[out["shared"], None, 2]]
    assert out["back_columns"] == []
