"""LangGraph's value filters as SQL, evaluated as `InMemoryStore` evaluates them in Python.

A filter maps value keys to wanted values: a plain value matches by Python's `==` (so `True`
equals `1`, a missing key equals `None`), an object matches key by key, a list element by
element, and an object of operators applies each of `$eq $ne $gt $gte $lt $lte` in turn. The four
comparisons call `float()` on the stored value, which raises on a missing key, `null`, a list or
an object (`TypeError`) and on a string that is not a number (`ValueError`); a number-like string
compares as its number. Python stops at the first condition that fails, so a raise happens only
on an item whose earlier conditions held.

Each condition becomes one SQL expression answering 't' (holds), 'f' (fails) or the name of the
exception Python would raise; `COALESCE(NULLIF(a, 't'), NULLIF(b, 't'), 't')` is Python's
short-circuiting `all()`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet, TextField
from django.db.models.expressions import RawSQL

from memory_app.errors import FilterNotComparable

TABLE = "memory_app_memoryrecord"
COMPARE = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
# What Python's float() reads from a string: digits with single underscores between them, a
# fraction, an exponent, or inf/infinity/nan, with any sign and surrounding whitespace.
_DIGITS = r"[0-9](_?[0-9])*"
FLOAT_TEXT = (
    rf"^\s*[+-]?(({_DIGITS}(\.({_DIGITS})?)?|\.{_DIGITS})([eE][+-]?{_DIGITS})?"
    r"|inf|infinity)\s*$"
)
# float() reads a signed "nan" too, which PostgreSQL's float8 does not: it is NaN here directly.
NAN_TEXT = r"^\s*[+-]?nan\s*$"


def _at(path: list[str]) -> tuple[str, list[Any]]:
    return f"({TABLE}.content::jsonb #> %s::text[])", [path]


def _state(condition: str) -> str:
    return f"CASE WHEN {condition} THEN 't' ELSE 'f' END"


def _all(states: list[tuple[str, list[Any]]]) -> tuple[str, list[Any]]:
    if not states:
        return "'t'", []
    sql = ", ".join(f"NULLIF({s}, 't')" for s, _ in states)
    return f"COALESCE({sql}, 't')", [p for _, params in states for p in params]


def _equal(path: list[str], wanted: Any) -> tuple[str, list[Any]]:
    """Python's `stored == wanted` as a boolean SQL expression, never NULL (a missing key is
    `None`, which differs from every value but `None`)."""
    sql, params = _equal_or_null(path, wanted)
    return f"COALESCE({sql}, false)", params


def _equal_or_null(path: list[str], wanted: Any) -> tuple[str, list[Any]]:
    at, p = _at(path)
    if wanted is None:
        return f"({at} IS NULL OR {at} = 'null'::jsonb)", [*p, *p]
    if isinstance(wanted, int | float) and not isinstance(wanted, bool):
        # A number equals the same number (1 == 1.0), and 1 and 0 equal True and False.
        sql = f"(jsonb_typeof({at}) = 'number' AND ({at} #>> '{{}}')::numeric = %s::numeric)"
        params = [*p, *p, repr(wanted)]
        if wanted in (0, 1):
            sql = f"({sql} OR {at} = %s::jsonb)"
            params += [*p, json.dumps(wanted == 1)]
        return sql, params
    if isinstance(wanted, bool):
        sql = (
            f"({at} = %s::jsonb OR (jsonb_typeof({at}) = 'number'"
            f" AND ({at} #>> '{{}}')::numeric = %s::numeric))"
        )
        return sql, [*p, json.dumps(wanted), *p, *p, int(wanted)]
    return f"({at} = %s::jsonb)", [*p, json.dumps(wanted)]


def _as_float(at: str) -> str:
    # The stored value as float() reads it; NULL where float() raises.
    return (
        f"CASE jsonb_typeof({at}) WHEN 'number' THEN ({at} #>> '{{}}')::float8 "
        f"WHEN 'boolean' THEN CASE WHEN {at} = 'true'::jsonb THEN 1.0 ELSE 0.0 END "
        f"WHEN 'string' THEN CASE WHEN ({at} #>> '{{}}') ~* %s THEN 'NaN'::float8 "
        f"WHEN ({at} #>> '{{}}') ~* %s THEN "
        f"regexp_replace(replace({at} #>> '{{}}', '_', ''), '^\\s+|\\s+$', '', 'g')::float8 "
        "END END"
    )


def _compare(path: list[str], op: str, operand: float) -> tuple[str, list[Any]]:
    at, p = _at(path)
    number = _as_float(at)
    number_params = [*p, *p, *p, *p, NAN_TEXT, *p, FLOAT_TEXT, *p]
    # float() of a string that is not a number raises ValueError; of anything else, TypeError.
    raises = f"CASE WHEN jsonb_typeof({at}) = 'string' THEN 'ValueError' ELSE 'TypeError' END"
    # NaN compares false either way in Python; PostgreSQL sorts it above every number.
    sql = (
        f"CASE WHEN {number} IS NULL THEN {raises} "
        f"WHEN {number} = 'NaN'::float8 THEN 'f' "
        f"ELSE {_state(f'{number} {COMPARE[op]} %s')} END"
    )
    params = [*number_params, *p, *number_params, *number_params, float(operand)]
    return sql, params


def _matches(path: list[str], wanted: Any) -> tuple[str, list[Any]]:
    """InMemoryStore's `_compare_values(value at path, wanted)` as a 't'/'f'/error state."""
    at, p = _at(path)
    if isinstance(wanted, dict) and any(k.startswith("$") for k in wanted):
        states = []
        for op, operand in wanted.items():
            if op in ("$eq", "$ne"):
                sql, params = _equal(path, operand)
                states.append((_state(sql if op == "$eq" else f"NOT {sql}"), params))
            else:
                states.append(_compare(path, op, operand))
        return _all(states)
    if isinstance(wanted, dict):
        inner, params = _all([_matches([*path, k], v) for k, v in wanted.items()])
        return f"CASE WHEN jsonb_typeof({at}) = 'object' THEN {inner} ELSE 'f' END", [
            *p,
            *params,
        ]
    if isinstance(wanted, list):
        inner, params = _all([_matches([*path, str(i)], v) for i, v in enumerate(wanted)])
        sql = (
            f"CASE WHEN jsonb_typeof({at}) = 'array' AND jsonb_array_length({at}) = %s "
            f"THEN {inner} ELSE 'f' END"
        )
        return sql, [*p, *p, len(wanted), *params]
    sql, params = _equal(path, wanted)
    return _state(sql), params


def filter_state(value_filter: dict[str, Any]) -> RawSQL:
    """Per item: 't' when it passes the filter, 'f' when not, else the exception's name."""
    sql, params = _all([_matches([key], wanted) for key, wanted in value_filter.items()])
    # Values reach the SQL as parameters; the fragments are this module's constants.
    return RawSQL(sql, params, TextField())  # noqa: S611


def _compares(value_filter: Any) -> bool:
    if isinstance(value_filter, dict):
        return any(k in COMPARE or _compares(v) for k, v in value_filter.items())
    if isinstance(value_filter, list):
        return any(_compares(v) for v in value_filter)
    return False


def filtered(
    qs: QuerySet, value_filter: dict[str, Any], in_order: Callable[[QuerySet], QuerySet]
) -> QuerySet:
    """`qs` narrowed to the items passing `value_filter`. Raises `FilterNotComparable` when an
    item would make `InMemoryStore` raise (the first in listing order, as it meets them)."""
    if not value_filter:
        return qs
    if _compares(value_filter):
        states = qs.annotate(filter_state=filter_state(value_filter))
        failing = in_order(states.exclude(filter_state__in=("t", "f")))
        for namespace, key, error in failing.values_list("namespace", "item_key", "filter_state")[
            :1
        ]:
            raise FilterNotComparable(
                f"filter {json.dumps(value_filter)} cannot compare the value of item "
                f"{'/'.join(namespace)}/{key}: float() raises {error} on it",
                error,
            )
    return qs.alias(filter_state=filter_state(value_filter)).filter(filter_state="t")
