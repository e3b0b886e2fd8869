"""Migrations are frozen: each carries the SQL and data it needs as it was written (never a call
into the application, whose later changes would change what a fresh database gets), and
migrating from zero gives exactly the database the models and the roles declare."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

from memory_app import roles
from tests.test_foundation import run_on_a_new_database

MIGRATIONS = Path(__file__).resolve().parent.parent / "memory_app" / "migrations"


def test_no_migration_imports_the_application():
    """A migration reaches models through `apps.get_model` only; importing memory_app (or a
    sibling migration) would tie it to today's code."""
    offenders = []
    for path in sorted(MIGRATIONS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            offenders += [
                f"{path.name}:{node.lineno} {name}"
                for name in names
                if name.startswith(".") or name.split(".")[0] == "memory_app"
            ]
    assert offenders == []


# Runs in a database of its own, set up by migrating from zero: what memory_app's models declare
# against what PostgreSQL holds (Django's own apps are Django's to keep), and the role groups.
SCHEMA_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentmemory_site.settings"
    import django
    django.setup()
    from django.apps import apps
    from django.core.management import call_command
    from django.db import connection, models

    call_command("migrate", interactive=False, verbosity=0)
    try:
        call_command("makemigrations", check=True, dry_run=True, verbosity=1)
        changes = None
    except SystemExit as exit:
        changes = exit.code

    def normal(db_type):
        return (db_type or "").replace("varchar(", "character varying(").replace(", ", ",")

    problems = []
    with connection.cursor() as cursor:
        tables = set(connection.introspection.table_names(cursor))
        for model in apps.get_app_config("memory_app").get_models(include_auto_created=True):
            meta = model._meta
            if not meta.managed or meta.proxy:
                continue
            table = meta.db_table
            if table not in tables:
                problems.append(f"{table}: missing")
                continue
            cursor.execute(
                "SELECT attname, format_type(atttypid, atttypmod), attnotnull, attgenerated"
                " FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                " AND NOT attisdropped",
                [table],
            )
            columns = {name: rest for name, *rest in cursor.fetchall()}
            fields = [f for f in meta.local_concrete_fields]
            declared = {f.column for f in fields}
            if set(columns) != declared:
                problems.append(f"{table}: columns {sorted(columns)} != {sorted(declared)}")
            for f in fields:
                if f.column not in columns:
                    continue
                kind, not_null, generated = columns[f.column]
                if isinstance(f, models.GeneratedField):
                    want = normal(f.output_field.db_type(connection))
                    if generated != ("s" if f.db_persist else "v"):
                        problems.append(f"{table}.{f.column}: generated is {generated!r}")
                else:
                    want = normal(f.db_type(connection))
                    if generated:
                        problems.append(f"{table}.{f.column}: generated, not declared so")
                if kind != want:
                    problems.append(f"{table}.{f.column}: {kind} != {want}")
                if not_null == f.null and not isinstance(f, models.GeneratedField):
                    problems.append(f"{table}.{f.column}: NOT NULL is {not_null}, null={f.null}")
            constraints = connection.introspection.get_constraints(cursor, table)
            names = set(constraints)
            for index in meta.indexes:
                if index.name not in names:
                    problems.append(f"{table}: index {index.name} missing")
            for constraint in meta.constraints:
                if constraint.name not in names:
                    problems.append(f"{table}: constraint {constraint.name} missing")
            for f in fields:
                covered = [c for c in constraints.values() if (c["columns"] or [])[:1] == [f.column]]
                if f.primary_key and not any(c["primary_key"] for c in covered):
                    problems.append(f"{table}.{f.column}: no primary key")
                if f.unique and not f.primary_key and not any(
                    c["unique"] and c["columns"] == [f.column] for c in covered
                ):
                    problems.append(f"{table}.{f.column}: not unique")
                if f.remote_field and f.db_constraint and not any(c["foreign_key"] for c in covered):
                    problems.append(f"{table}.{f.column}: no foreign key")
                # A row's copied context (Step.context, ...) is followed by nothing: neither
                # constrained nor cascaded, it needs no index of its own.
                followed = f.remote_field and f.remote_field.on_delete is not models.DO_NOTHING
                if (f.db_index or followed) and not f.unique and not covered:
                    problems.append(f"{table}.{f.column}: not indexed")
            for fields_together in meta.unique_together:
                cols = [meta.get_field(name).column for name in fields_together]
                if not any(c["unique"] and c["columns"] == cols for c in constraints.values()):
                    problems.append(f"{table}: unique {cols} missing")

    Group = apps.get_model("auth", "Group")
    groups = {
        group.name: sorted(
            f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all()
        )
        for group in Group.objects.prefetch_related("permissions__content_type")
    }
    print("RESULT " + json.dumps({"changes": changes, "problems": problems, "groups": groups}))
    """  # noqa: E501 - the child process runs this text as written
)


def test_migrating_from_zero_gives_the_models_schema_and_the_declared_roles():
    with run_on_a_new_database("am_frozen", ["-c", SCHEMA_SCRIPT], timeout=300) as (out, _url):
        assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["changes"] is None, out.stdout  # makemigrations --check found no change
    assert result["problems"] == [], "\n".join(result["problems"])
    assert result["groups"] == {
        role: sorted(roles.role_permissions(role)) for role in roles.ROLE_CAPABILITIES
    }


# Migrates back and forth in a database of its own, like the schema check above.
ORDERED_JSON_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentmemory_site.settings"
    import django
    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    BEFORE = ("memory_app", "0023_shard_safe_search_triggers")
    call_command("migrate", "memory_app", BEFORE[1], verbosity=0)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    model = lambda name: old.get_model("memory_app", name)
    value = {"query": "cats", "k": 3, "nested": [{"zz": 1, "a": None}, "x"]}
    ctx = model("Context").objects.create(keys={"n": 1}, keys_digest="1" * 64, metadata=value)
    run = model("Run").objects.create(context=ctx, task="t", metadata=value, final_answer="42")
    step = model("Step").objects.create(
        run=run, context=ctx, position=1, kind="action", model_input_messages=[value],
        model_output_message=value, model_output=value, action_output=value, payload=value)
    model("ToolCall").objects.create(step=step, context=ctx, position=1, name="s", arguments=value)
    model("Message").objects.create(
        context=ctx, seq=1, role="user", text="hi", content=[value], metadata=value)
    model("MemoryRecord").objects.create(
        context=ctx, scope_keys={}, scope_digest="s" * 64, content="f", content_hash="h" * 64,
        metadata=value)
    COLUMNS = {
        "memory_app_context": ["metadata"],
        "memory_app_message": ["content", "metadata"],
        "memory_app_run": ["final_answer", "metadata"],
        "memory_app_step": ["model_input_messages", "model_output_message", "model_output",
                            "action_output", "payload"],
        "memory_app_toolcall": ["arguments"],
        "memory_app_memoryrecord": ["metadata"],
    }

    def snapshot():
        out = {}
        with connection.cursor() as cursor:
            for table, columns in COLUMNS.items():
                for column in columns:
                    cursor.execute(
                        f"SELECT pg_typeof({column})::text, {column}::jsonb::text FROM {table}")
                    out[f"{table}.{column}"] = cursor.fetchall()
        return out

    result = {"before": snapshot()}
    call_command("migrate", "memory_app", verbosity=0)
    result["after"] = snapshot()
    from memory_app.models import Message
    Message.objects.update(metadata=value)
    with connection.cursor() as cursor:
        cursor.execute("SELECT metadata::text FROM memory_app_message")
        result["written"] = cursor.fetchone()[0]
    call_command("migrate", "memory_app", BEFORE[1], verbosity=0)
    result["back"] = snapshot()
    result["value"] = json.dumps(value)
    print("RESULT " + json.dumps(result))
    """  # noqa: E501 - the child process runs this text as written
)


def test_migration_0028_keeps_every_stored_value_and_goes_back():
    """The agent-written columns become `json` holding the same values, new writes keep their
    order, and migrating back gives `jsonb` with the same values again."""
    with run_on_a_new_database("am_ordered", ["-c", ORDERED_JSON_SCRIPT], timeout=300) as (out, _):
        assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    before, after, back = result["before"], result["after"], result["back"]
    assert len(before) == 12 and all(len(rows) == 1 for rows in before.values())
    assert {rows[0][0] for rows in before.values()} == {"jsonb"}
    assert {rows[0][0] for rows in after.values()} == {"json"}
    assert back == before
    assert {k: rows[0][1] for k, rows in after.items()} == {
        k: rows[0][1] for k, rows in before.items()
    }
    assert result["written"] == result["value"]


STORE_NAMESPACES_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentmemory_site.settings"
    import django
    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    BEFORE = ("memory_app", "0033_span_queue")
    call_command("migrate", "memory_app", BEFORE[1], verbosity=0)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    Record = old.get_model("memory_app", "MemoryRecord")
    def item(digest, namespace, key, **extra):
        Record.objects.create(
            scope_keys={"user": digest}, scope_digest=digest * 64, content="{}",
            content_hash=(digest + key).ljust(64, "0"), namespace=namespace, item_key=key, **extra)
    item("a", ["prefs"], "k1")
    item("a", ["docs", "x"], "k2")
    item("a", ["prefs"], "k3", archived_at=timezone.now())
    item("a", ["gone"], "k4", archived_at=timezone.now())
    item("b", ["prefs"], "k1")
    Record.objects.create(scope_keys={}, scope_digest="c" * 64, content="plain",
                          content_hash="p" * 64)
    call_command("migrate", "memory_app", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT left(scope_digest, 1), scope_keys::text, namespace "
            "FROM memory_app_storenamespace ORDER BY id")
        print("RESULT " + json.dumps(cursor.fetchall()))
    """
)


def test_migration_0034_lists_the_namespaces_items_were_ever_written_to_in_first_use_order():
    with run_on_a_new_database("am_storens", ["-c", STORE_NAMESPACES_SCRIPT], timeout=300) as (
        out,
        _,
    ):
        assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    assert json.loads(line.removeprefix("RESULT ")) == [
        ["a", '{"user": "a"}', ["prefs"]],
        ["a", '{"user": "a"}', ["docs", "x"]],
        ["a", '{"user": "a"}', ["gone"]],
        ["b", '{"user": "b"}', ["prefs"]],
    ]
