"""Statements with psycopg's placeholders sent with PostgreSQL's own, each text converted once
per process: the cursors of `db.binding_cursor`."""

from __future__ import annotations

import functools
import re

import psycopg


class BindingCursor(psycopg.RawCursor):
    """Takes psycopg's placeholders (`%s`, `%(name)s`, `%b`) and sends PostgreSQL's (`$1`),
    each text converted once per process (`_numbered`): psycopg keeps no conversion of a text
    over 4 KB (the keyword ranking's), and splits it anew by a regular expression on every
    call. `%b` takes the format psycopg chooses for the type (binary for bytes, numbers and
    `Float8Array`), as `%s` does."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        if params is not None:
            query, order = _numbered(query)
            params = _in_order(params, order)
        return super().execute(query, params, prepare=prepare, binary=binary)

    def executemany(self, query, params_seq, *, returning=False):
        query, order = _numbered(query)
        return super().executemany(
            query, (_in_order(p, order) for p in params_seq), returning=returning
        )


_PLACEHOLDER = re.compile(r"%(?:\(([^)]+)\))?(.)", re.DOTALL)


def _numbered(query: str) -> tuple[str, tuple[str, ...] | None]:
    """`query` with `$n` for its placeholders and `%%` as `%`; the names in their numbers'
    order (None for positional `%s`, taken in the order given). Kept for texts up to 16 KB: a
    batch's VALUES list, as long as its rows, is converted each time, as psycopg does."""
    return _numbered_kept(query) if len(query) <= 16_384 else _numbered_text(query)


def _numbered_text(query: str) -> tuple[str, tuple[str, ...] | None]:
    names: dict[str, str] = {}
    positional = 0

    def number(match: re.Match) -> str:
        nonlocal positional
        name, kind = match.groups()
        if kind == "%" and name is None:
            return "%"
        if kind not in "sb":
            raise psycopg.ProgrammingError(f"unsupported placeholder: {match.group()!r}")
        if name is None:
            positional += 1
            return f"${positional}"
        return names.setdefault(name, f"${len(names) + 1}")

    text = _PLACEHOLDER.sub(number, query)
    if names and positional:
        raise psycopg.ProgrammingError("named and positional placeholders mixed")
    return text, (tuple(names) if names else None)


_numbered_kept = functools.lru_cache(maxsize=256)(_numbered_text)


def _in_order(params, order: tuple[str, ...] | None):
    if order is None:
        return [] if isinstance(params, dict) else params  # a dict for a text without any
    return [params[name] for name in order]
