"""Restore reads what a chunk of lines names together: a run a file names but does not hold is
asked for once."""

import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory_app.backup.export import contexts_matching, export_lines
from memory_app.backup.restore import import_lines
from memory_app.models import (
    Context,
    MemoryRecord,
    Message,
    Run,
)
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, steps_append
from tests.builders import signed_backup

pytestmark = pytest.mark.django_db

KEYS = {"user": "ada", "chat": "queries"}


def _wipe():
    MemoryRecord.objects.all().delete()
    Context.objects.all().delete()


def _reads_of(queries, table: str) -> list[str]:
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and re.search(rf'\bFROM "{table}"', q["sql"])
    ]


def _without_runs(lines: list[str]) -> list[str]:
    """The file's lines, its run and step lines left out and its trailer made again."""
    kept = [line for line in lines[:-1] if json.loads(line)["type"] not in ("run", "step")]
    return signed_backup(kept).splitlines(keepends=True)


def test_messages_naming_a_run_the_file_does_not_hold_ask_for_it_once():
    """A file whose many messages name a run it does not hold (its run lines left out): the
    run is looked for once, not once per message, and the messages come in without a run."""
    ctx, _ = context_get_or_create(keys=KEYS)
    run, _ = run_create(context=ctx, client_id="gone", task="t")
    messages_append(
        context=ctx,
        items=[{"role": "user", "text": f"m {i}", "run_id": run.pk} for i in range(60)],
    )
    lines = _without_runs(list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk]))))
    _wipe()
    with CaptureQueriesContext(connection) as queries:
        result = import_lines(lines)
    assert result.created["messages"] == 60
    by_ref = [s for s in _reads_of(queries, "memory_app_run") if "client_id" in s]
    assert len(by_ref) == 1, by_ref
    assert not Message.objects.filter(run__isnull=False).exists()


def test_a_run_a_later_line_of_the_file_creates_is_found_by_the_lines_after_it():
    """A message line naming a run before the file's run line creates it finds none; the
    message, step and score lines after the run line find the run created."""
    ctx, _ = context_get_or_create(keys=KEYS)
    run, _ = run_create(context=ctx, client_id="late", task="t")
    steps_append(run=run, items=[{"kind": "action"}])
    messages_append(
        context=ctx,
        items=[{"role": "user", "text": f"m {i}", "run_id": run.pk} for i in range(4)],
    )
    lines = list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk])))
    records = [json.loads(line) for line in lines[:-1]]
    first, *later = [r for r in records if r["type"] == "message"]
    others = [r for r in records if r["type"] not in ("message", "header", "context")]
    header = [r for r in records if r["type"] in ("header", "context")]
    # The first message before the run and step lines, the others after them.
    reordered = [*header, first, *others, *later]
    text = [json.dumps(r, separators=(",", ":")) + "\n" for r in reordered]
    _wipe()
    result = import_lines(signed_backup(text).splitlines(keepends=True))
    assert result.created["runs"] == 1 and result.created["steps"] == 1
    ctx = Context.objects.get(keys_digest=ctx.keys_digest)
    created = Run.objects.get(context=ctx, client_id="late")
    runs = dict(Message.objects.filter(context=ctx).values_list("seq", "run_id"))
    assert runs == {first["seq"]: None, **{m["seq"]: created.pk for m in later}}
    assert (created.step_count, created.last_position) == (1, 1)
