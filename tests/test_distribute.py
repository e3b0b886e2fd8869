"""`manage.py distribute` on one node: the layout it would make, read from the catalog, and
that it changes nothing where Citus is absent or the schema holds what Citus refuses. The
command's run on a real coordinator is tests/citus/ (skipped without a Citus build)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from memory_app.scale_out import CONTEXTS, DISTRIBUTED, LOCAL, REFERENCE, read_layout

pytestmark = pytest.mark.django_db


def _layout():
    with connection.cursor() as cursor:
        return read_layout(cursor)


def _context_tables() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
            WHERE a.attname = 'context_id' AND a.attnotnull AND c.relkind = 'r'
                AND c.relnamespace = 'public'::regnamespace
            """
        )
        return {row[0] for row in cursor.fetchall()}


def test_every_table_of_context_rows_is_distributed_after_the_contexts():
    layout = _layout()
    distributed = [t for t in layout.tables if t.kind == DISTRIBUTED]
    names = [t.name for t in distributed]
    assert names[0] == CONTEXTS
    assert distributed[0].column == "id"
    assert _context_tables() <= set(names)
    for position, table in enumerate(distributed):
        # Each comes after every distributed table its foreign keys point at.
        assert set(table.after) <= set(names[:position]), table
    assert {t.name for t in layout.tables if t.kind == LOCAL} >= {"django_migrations"}


def test_a_new_table_finds_its_place_by_the_same_rules():
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            CREATE TABLE memory_app_labelled (
                id bigint, context_id bigint NOT NULL REFERENCES {CONTEXTS} (id),
                label_id bigint REFERENCES memory_app_embeddingmodel (id),
                PRIMARY KEY (id, context_id)
            );
            CREATE TABLE memory_app_sidecar (
                id bigint PRIMARY KEY, message_id bigint, context_id bigint,
                FOREIGN KEY (message_id, context_id) REFERENCES memory_app_message (id, context_id)
            );
            """
        )
    layout = _layout()
    kinds = {t.name: (t.kind, t.column) for t in layout.tables}
    assert kinds["memory_app_labelled"] == (DISTRIBUTED, "context_id")
    # What a distributed table points at is copied to every worker.
    assert kinds["memory_app_embeddingmodel"] == (REFERENCE, "")
    assert kinds["memory_app_sidecar"] == (LOCAL, "")
    assert any(
        p.startswith("memory_app_sidecar: foreign key")
        and p.endswith("points from a local table into a distributed one")
        for p in layout.problems
    )


def test_the_plan_is_printed_and_nothing_changes_without_citus(capsys):
    call_command("distribute", "--plan")
    out = capsys.readouterr().out
    assert f"{CONTEXTS}: distributed by id" in out
    assert "memory_app_message: distributed by context_id" in out
    for problem in _layout().problems:
        assert f"blocked: {problem}" in out
    with pytest.raises(CommandError) as refused:
        call_command("distribute")
    # Either what Citus would refuse is named, or (schema ready) the missing extension is.
    assert "cannot be distributed yet" in str(refused.value) or "no citus extension" in str(
        refused.value
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_extension WHERE extname = 'citus'")
        assert cursor.fetchone()[0] == 0
