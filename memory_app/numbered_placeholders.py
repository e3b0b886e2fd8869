"""Statements with psycopg's placeholders sent with PostgreSQL's own, each text converted once
per process: the cursors of `db.binding_cursor`."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

import psycopg
from psycopg import sql


class BindingCursor(psycopg.RawCursor):
    """Takes psycopg's `%s` and `%(name)s` placeholders and sends PostgreSQL's (`$1`), each
    text converted once per process (`_numbered`): psycopg keeps no conversion of a text over
    4 KB (the keyword ranking's), and splits it anew by a regular expression on every call. A
    parameter goes in the format psycopg picks for its type, as for `%s` (binary for bytes,
    numbers and `Float8Array`); `%b` and `%t` are refused rather than read otherwise. The
    parameters are checked against the placeholders as psycopg checks them."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        if params is not None:
            query, params = self._bound(query, params)
        return super().execute(query, params, prepare=prepare, binary=binary)

    def executemany(self, query, params_seq, *, returning=False):
        text, placeholders = _numbered(self._text(query))
        rows = (_in_order(params, placeholders) for params in params_seq)
        return super().executemany(text, rows, returning=returning)

    def stream(self, query, params=None, *, binary=None, size=1):
        if params is not None:
            query, params = self._bound(query, params)
        return super().stream(query, params, binary=binary, size=size)

    def _bound(self, query, params) -> tuple[str, Sequence]:
        text, placeholders = _numbered(self._text(query))
        return text, _in_order(params, placeholders)

    def _text(self, query) -> str:
        if isinstance(query, str):
            return query
        if isinstance(query, sql.Composable):
            return query.as_string(self)
        return bytes(query).decode(self.connection.info.encoding)


# As psycopg reads a placeholder: `%`, an optional `(name)`, one character (not a line's end).
_PLACEHOLDER = re.compile(r"%(?:\(([^)]+)\))?(.)")


def _numbered(query: str) -> tuple[str, int | tuple[str, ...]]:
    """`query` with `$n` for its placeholders and `%%` as `%`; the number of positional `%s`
    placeholders, or the names in their numbers' order. Kept for texts up to 16 KB: a batch's
    VALUES list, as long as its rows, is converted each time, as psycopg does."""
    return _numbered_kept(query) if len(query) <= 16_384 else _numbered_text(query)


def _numbered_text(query: str) -> tuple[str, int | tuple[str, ...]]:
    names: dict[str, str] = {}
    positional = 0

    def number(match: re.Match) -> str:
        nonlocal positional
        name, kind = match.groups()
        if kind == "%" and name is None:
            return "%"
        if kind != "s":
            raise psycopg.ProgrammingError(f"unsupported placeholder: {match.group()!r}")
        if name is None:
            positional += 1
            return f"${positional}"
        return names.setdefault(name, f"${len(names) + 1}")

    text = _PLACEHOLDER.sub(number, query)
    if names and positional:
        raise psycopg.ProgrammingError("named and positional placeholders mixed")
    return text, (tuple(names) if names else positional)


_numbered_kept = functools.lru_cache(maxsize=256)(_numbered_text)


def _in_order(params, placeholders: int | tuple[str, ...]) -> Sequence:
    """`params` in the order of the statement's numbers, refused as psycopg refuses them."""
    if isinstance(placeholders, tuple):
        if not isinstance(params, Mapping):
            raise TypeError("named placeholders take a mapping of parameters")
        missing = [name for name in placeholders if name not in params]
        if missing:
            raise psycopg.ProgrammingError(f"query parameter missing: {', '.join(missing)}")
        return [params[name] for name in placeholders]
    if isinstance(params, Mapping):
        if placeholders:
            raise TypeError("positional placeholders take a sequence of parameters")
        return []  # a text without placeholders, given a mapping
    if len(params) != placeholders:
        raise psycopg.ProgrammingError(
            f"the query has {placeholders} placeholders but {len(params)} parameters were passed"
        )
    return params
