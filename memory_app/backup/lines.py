"""The backup as lines of bytes: each line read as strict JSON, and the trailer that ends every
export, recomputed on import so a file cut short or changed since it was written is refused.

The trailer is the file's last line:

    {"type": "trailer", "counts": {"context": n, "run": n, ..., "embedding": n}, "sha256": hex}

`counts` has the number of lines of each record kind the file's version holds (a version 2
file's trailer counts the six kinds it had); `sha256` is the digest of every byte
before the trailer line (the header line included). Import counts and hashes the lines as it
reads them and compares at the end, inside the import's transaction: a mismatch, a trailer
missing (a file cut at a line boundary reads as well-formed lines) or a line after the trailer
rolls the whole import back. The file's word is never taken: both values are recomputed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from memory_app.backup.format import FORMAT, KINDS, VERSION, kinds_of
from memory_app.errors import BackupFormatError
from memory_app.json_values import check_json, depth_over, finite_float, reject_constant

TRAILER = "trailer"

# Deeper lines are refused: the import writes each value with encoders that recurse once per
# level, and about 1,000 levels (less the request's own stack) end in RecursionError. No backup
# of agent data nests anywhere near this.
MAX_DEPTH = 500

# A JSON escape that may spell what PostgreSQL cannot store: a surrogate (lone, or one half of a
# pair) or NUL. Only lines holding one are walked, so a large import pays a byte search per line.
_ESCAPE_TO_CHECK = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)")


class Summary:
    """What a trailer says about the lines before it: their digest and how many of each kind."""

    def __init__(self, kinds: tuple[str, ...] = KINDS) -> None:
        self.sha256 = hashlib.sha256()
        self.counts = dict.fromkeys(kinds, 0)

    def add(self, line: bytes, kind: Any = None) -> None:
        self.sha256.update(line)
        if kind in self.counts:
            self.counts[kind] += 1

    def trailer(self) -> dict[str, Any]:
        return {"type": TRAILER, "counts": dict(self.counts), "sha256": self.sha256.hexdigest()}


def parse_line(line: bytes, number: int) -> Any:
    """One backup line as Python values, or a BackupFormatError naming the line: not UTF-8, not
    RFC 8259 JSON (NaN, 1e400), nested deeper than MAX_DEPTH (10,000 levels exhaust Python's
    recursion limit in the parser already), or a string or key PostgreSQL cannot store (a lone
    surrogate, NUL)."""
    too_deep = BackupFormatError(f"line {number} is nested deeper than {MAX_DEPTH} levels")
    try:
        value = json.loads(
            line.decode("utf-8"), parse_constant=reject_constant, parse_float=finite_float
        )
    except RecursionError:
        raise too_deep from None
    except UnicodeDecodeError:
        raise BackupFormatError(f"line {number} is not UTF-8") from None
    except ValueError as exc:  # json.JSONDecodeError too
        raise BackupFormatError(f"line {number} is not JSON: {getattr(exc, 'msg', exc)}") from None
    # Only a line with that many brackets (in strings or not) can nest that deep: one count in C.
    if line.count(b"[") + line.count(b"{") > MAX_DEPTH and depth_over(value, MAX_DEPTH):
        raise too_deep
    if _ESCAPE_TO_CHECK.search(line):
        try:
            check_json(value)
        except ValueError as exc:
            raise BackupFormatError(f"line {number}: {exc}") from None
    return value


def read_backup(lines: Iterable[bytes], *, unchecked_version_1: bool = False) -> Iterator[Any]:
    """The records of a backup file, the trailer checked once the last one is read (so a caller
    writing as it reads must do so in a transaction the error rolls back). Blank lines carry no
    record but are part of the digest. A version 1 file (no trailer) is refused unless
    `unchecked_version_1` (the operator's explicit choice at the command line)."""
    summary = Summary()
    trailer: tuple[int, Any] | None = None
    number = 0
    checked = True
    for number, line in enumerate(lines, start=1):
        if trailer is not None:
            raise BackupFormatError(
                f"line {number} follows the trailer (line {trailer[0]}), which ends a backup"
            )
        if not line.strip():
            summary.add(line)
            continue
        record = parse_line(line, number)
        # Any JSON value may stand where a kind belongs; only a string is one (the import
        # refuses the rest by name).
        kind = record.get("type") if isinstance(record, dict) else None
        kind = kind if isinstance(kind, str) else None
        if checked and kind == TRAILER:
            trailer = (number, record)
            continue
        if number == 1 and kind == "header" and record.get("version") != VERSION:
            # An older file's trailer counts the kinds of its version (nothing is added yet).
            summary = Summary(kinds_of(record.get("version")))
        if number == 1 and kind == "header" and _is_version_1(record):
            if not unchecked_version_1:
                raise BackupFormatError(
                    f"a version 1 backup has no trailer, so whether it is whole cannot be "
                    f"checked; this server imports {FORMAT} version {VERSION} (export again to "
                    f"get one, or import this file with `manage.py import_memory "
                    f"--unchecked-version-1`)"
                )
            checked = False
        summary.add(line, kind)
        yield record
    if not checked:
        return
    if trailer is None:
        raise BackupFormatError(
            f"the backup ends at line {number} without its trailer: the file is cut short (or "
            "was not written by export); nothing was imported"
        )
    _check_trailer(trailer[1], summary)


def _is_version_1(header: dict[str, Any]) -> bool:
    return header.get("format") == FORMAT and header.get("version") == 1


def _check_trailer(trailer: dict[str, Any], summary: Summary) -> None:
    expected = summary.trailer()
    if trailer.get("counts") != expected["counts"]:
        raise BackupFormatError(
            f"the trailer counts {trailer.get('counts')} but the file holds {expected['counts']}: "
            "lines are missing or were added; nothing was imported"
        )
    if trailer.get("sha256") != expected["sha256"]:
        raise BackupFormatError(
            "the trailer's sha256 is not the digest of the lines before it: the file was changed "
            "after export; nothing was imported"
        )
