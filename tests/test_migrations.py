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
