"""Reads of a memory's history: its versions with what changed from the one before (a word diff
of the content, the other fields that differ), the last change of each memory on a page (for
its undo button), and the memories a step produced. Every read of the versions names the
memory's id."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from memory_app.models import MemoryRecord, MemoryVersion

# The fields a version carries besides its content, in the order the page lists changes.
FIELDS = ("kind", "status", "archived", "keywords", "thinking", "metadata")
_TOKEN = re.compile(r"\s+|[^\s]+")
# The changes "undo" on a memory reverses: an edit, an archive or its unarchive, and a restore
# of a version or an undo (undoing that one returns the memory to what it was before).
UNDOABLE = ("edit", "archive", "unarchive", "restore_version", "undo")


@dataclass
class VersionView:
    version: MemoryVersion
    # (op, text) segments of the content against the previous version: "=", "-" or "+".
    content_diff: list[tuple[str, str]] = field(default_factory=list)
    # (field, before, after) of the other fields that changed.
    changed: list[tuple[str, str, str]] = field(default_factory=list)
    first: bool = False


def _shown(version: MemoryVersion, name: str) -> str:
    if name == "archived":
        return "archived" if version.archived_at is not None else "not archived"
    value = getattr(version, name)
    if name == "keywords":
        return ", ".join(value)
    if name == "metadata":
        # As stored: the key order the agent wrote.
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """`after` against `before` in runs of words (and the spaces between them)."""
    a, b = _TOKEN.findall(before), _TOKEN.findall(after)
    out: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(("=", "".join(a[i1:i2])))
            continue
        if i2 > i1:
            out.append(("-", "".join(a[i1:i2])))
        if j2 > j1:
            out.append(("+", "".join(b[j1:j2])))
    return out


def memory_versions(memory_id: int) -> list[VersionView]:
    """Every version of memory `memory_id`, newest first, each diffed against the one before."""
    versions = list(
        MemoryVersion.objects.filter(memory_id=memory_id)
        .select_related("audit_event")
        .order_by("version")
    )
    views: list[VersionView] = []
    previous: MemoryVersion | None = None
    for v in versions:
        view = VersionView(version=v, first=previous is None)
        if previous is None:
            view.content_diff = [("=", v.content)]
        else:
            view.content_diff = word_diff(previous.content, v.content)
            for name in FIELDS:
                before, after = _shown(previous, name), _shown(v, name)
                if before != after:
                    view.changed.append((name, before, after))
        views.append(view)
        previous = v
    views.reverse()
    return views


def last_versions(memory_ids: Iterable[int]) -> dict[int, MemoryVersion]:
    """The latest version of each of these memories."""
    ids = sorted(set(memory_ids))
    if not ids:
        return {}
    rows = (
        MemoryVersion.objects.filter(memory_id__in=ids)
        .order_by("memory_id", "-version")
        .distinct("memory_id")
    )
    return {v.memory_id: v for v in rows}


def with_last_versions(records: list[MemoryRecord]) -> list[MemoryRecord]:
    """`records`, each with `last_version` (None for a memory without history) and `undoable`
    (the action its undo button reverses, or None)."""
    last = last_versions(r.pk for r in records)
    for r in records:
        r.last_version = last.get(r.pk)
        action = r.last_version.action if r.last_version is not None else None
        r.undoable = action if action in UNDOABLE and r.last_version.version > 1 else None
    return records


def step_memories(step_id: int) -> list[MemoryRecord]:
    """The memories a step produced (named it as their source), oldest first."""
    return list(MemoryRecord.objects.filter(source_step_id=step_id).order_by("created_at", "pk"))


def memory_provenance(record_id: int) -> MemoryRecord:
    """The record with what its source links need (message, step, run, key, user)."""
    return MemoryRecord.objects.select_related(
        "context", "source_message", "source_step", "source_run", "source_api_key", "source_user"
    ).get(pk=record_id)
