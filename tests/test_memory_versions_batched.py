"""Recording versions of many memories at once reads their last versions together: one read of
the versions table however many records, each record numbered after its own last version (1 when
it has none), the new versions made and returned in the records' order. An import numbers the
versions of every memory it creates the same way, in a few reads whatever the number of memories.
"""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory_app.audit import Actor
from memory_app.backup.export import contexts_matching, export_lines
from memory_app.backup.format import CHUNK
from memory_app.backup.restore import import_lines
from memory_app.memories import Scope
from memory_app.models import Context, MemoryRecord, MemoryVersion
from memory_app.services.contexts import context_get_or_create
from memory_app.services.memories import memories_record
from memory_app.services.memory_history import versions_record

pytestmark = pytest.mark.django_db

ACTOR = Actor.system("user:ada")


def _memories(n: int, chat: str = "batched") -> list[MemoryRecord]:
    """`n` memories of one context, each with its version 1 (`record`)."""
    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": chat})
    recorded = memories_record(
        scope=Scope(context=ctx),
        items=[{"content": f"{chat} fact {i}"} for i in range(n)],
        actor=ACTOR,
    )
    return [r.record for r in recorded]


def _version_reads(queries) -> list[str]:
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT")
        and re.search(r'\bFROM "memory_app_memoryversion"', q["sql"])
    ]


def _versions(pk: int) -> list[tuple[int, str]]:
    return list(
        MemoryVersion.objects.filter(memory_id=pk)
        .order_by("version")
        .values_list("version", "action")
    )


def _recorded_statements(records: list[MemoryRecord]) -> CaptureQueriesContext:
    with CaptureQueriesContext(connection) as queries:
        made = versions_record(records, actor=ACTOR, action="edit")
    assert [v.memory_id for v in made] == [r.pk for r in records]
    return queries


def test_the_last_versions_of_many_records_are_read_in_one_statement():
    """Three records or thirty: the same statements, one of them a read of the versions."""
    few = _recorded_statements(_memories(3, "few"))
    many = _recorded_statements(_memories(30, "many"))
    assert len(_version_reads(few)) == 1, _version_reads(few)
    assert len(_version_reads(many)) == 1, _version_reads(many)
    assert len(many.captured_queries) == len(few.captured_queries)


def test_each_record_is_numbered_after_its_own_last_version():
    """A record without versions gets 1, one with one version 2, one with four 5; the versions
    come back (and are stored) in the order the records were given, repeated records apart."""
    none, one, several, other = _memories(4)
    MemoryVersion.objects.filter(memory_id=none.pk).delete()
    for _ in range(3):
        versions_record([several], actor=ACTOR, action="edit")
    assert [v for v, _ in _versions(several.pk)] == [1, 2, 3, 4]

    # Given out of the order of their ids, with a record of another scope among them.
    [stranger] = _memories(1, "elsewhere")
    given = [several, stranger, none, one]
    made = versions_record(given, actor=ACTOR, action="merge", note="why")
    assert [(v.memory_id, v.version) for v in made] == [
        (several.pk, 5),
        (stranger.pk, 2),
        (none.pk, 1),
        (one.pk, 2),
    ]
    assert all(v.action == "merge" and v.note == "why" for v in made)
    assert _versions(none.pk) == [(1, "merge")]
    assert _versions(one.pk) == [(1, "record"), (2, "merge")]
    assert _versions(several.pk) == [(1, "record"), *[(i, "edit") for i in (2, 3, 4)], (5, "merge")]
    assert _versions(other.pk) == [(1, "record")]
    # And again: each record's number follows the one just made.
    again = versions_record([one, none], actor=ACTOR, action="archive")
    assert [(v.memory_id, v.version) for v in again] == [(one.pk, 3), (none.pk, 2)]


def test_no_records_reads_nothing():
    with CaptureQueriesContext(connection) as queries:
        assert versions_record([], actor=ACTOR, action="edit") == []
    assert queries.captured_queries == []


def test_an_import_numbers_its_memories_versions_in_a_few_reads():
    """Forty memories with two versions each, exported with their versions and imported into an
    empty store: the versions table is read once for the file's versions and once for the
    import's own, and each memory's `import` version is its third."""
    n = 40
    assert n < CHUNK  # one chunk of each kind of line
    records = _memories(n, "exported")
    versions_record(records, actor=ACTOR, action="edit")
    ctx = Context.objects.get(pk=records[0].context_id)
    lines = list(
        export_lines(contexts=contexts_matching(context_ids=[ctx.pk]), memory_versions=True)
    )
    MemoryRecord.objects.all().delete()
    Context.objects.all().delete()
    with CaptureQueriesContext(connection) as queries:
        result = import_lines(lines)
    assert (result.created["memories"], result.created["memory_versions"]) == (n, 2 * n)
    assert len(_version_reads(queries)) == 2, _version_reads(queries)
    imported = MemoryRecord.objects.filter(context__keys_digest=ctx.keys_digest)
    assert imported.count() == n
    for record in imported:
        assert _versions(record.pk) == [(1, "record"), (2, "edit"), (3, "import")]
