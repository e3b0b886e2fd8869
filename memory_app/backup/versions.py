"""Memory versions in a backup: a memory's history, exported after the memory records of the
context (or key subset) that holds them, each version naming its memory as embeddings do, by
(scope digest, content hash) as the file's memory line gives them.

A version's natural key is (memory, version number). Versions attach only to a memory this
import creates: a memory stored here already keeps its own history, never another server's
grafted onto it. Who made each change (`actor`, its user and API key) is the importer, as a
memory's `recorded_by` is: export does not write it, and the users, keys and audit events it
named are not in a backup. Only the operator's and an admin key's export holds versions (see
the package docstring). After its versions, a memory the import created gets one
more, `import`, as every change path records its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import models
from django.db.models import F

from memory_app.backup.format import MEMORY_VERSION_FIELDS, dump_fields, load_fields
from memory_app.errors import BackupFormatError
from memory_app.models import MemoryVersion


def memory_version_records(
    scoped: models.QuerySet, exported: set[int], chunk_size: int
) -> Iterator[dict[str, Any]]:
    """The versions of the `scoped` memories whose records are in `exported` (a key-subset
    memory under several contexts is written once, with the first)."""
    rows = (
        MemoryVersion.objects.filter(memory__in=scoped)
        .annotate(
            memory_scope_digest=F("memory__scope_digest"),
            memory_content_hash=F("memory__content_hash"),
        )
        .order_by("memory_id", "version")
    )
    for row in rows.iterator(chunk_size=chunk_size):
        if row.memory_id in exported:
            yield {
                "type": "memory_version",
                "scope_digest": row.memory_scope_digest,
                "content_hash": row.memory_content_hash,
                **dump_fields(row, MEMORY_VERSION_FIELDS),
            }


def import_memory_versions(importer: Any, records: list[dict[str, Any]]) -> None:
    """One chunk of memory version lines (`importer`: restore's `_Importer`). Only a memory a
    line of this file resolved to (inside the importer's confinement): a digest and hash of any
    other record, another tenant's or none, is the same error."""
    rows, skipped = [], 0
    user = importer.actor.user
    for rec in records:
        found = importer.memories.get((rec["scope_digest"], rec["content_hash"]))
        if found is None:
            raise BackupFormatError("a memory version refers to a memory that is not in the backup")
        if found[0] not in importer.created_memories:
            skipped += 1
            continue
        version = MemoryVersion(memory_id=found[0], **load_fields(rec, MEMORY_VERSION_FIELDS))
        version.actor = importer.actor.label
        version.user = user if user is not None and user.is_authenticated else None
        version.api_key = importer.actor.api_key
        rows.append(version)
    stored = set(
        MemoryVersion.objects.filter(memory_id__in={v.memory_id for v in rows}).values_list(
            "memory_id", "version"
        )
    )
    new = []
    for version in rows:
        if (version.memory_id, version.version) in stored:
            continue
        stored.add((version.memory_id, version.version))
        new.append(version)
    MemoryVersion.objects.bulk_create(new)
    importer.result.count("memory_versions", len(new), skipped + len(rows) - len(new))
