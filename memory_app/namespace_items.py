"""Namespace items: long-term memories addressed as LangGraph's store addresses its items.

An item is a `MemoryRecord` with a `namespace` (a path of labels, `("users", "ada", "prefs")`)
and an `item_key`, whose content is the JSON text of its value (an object, key order as
written). Its scope is a key subset: the `scope_keys` a request names, else the key subset its
API key is confined to. Namespace and key are unique within that scope (the scope's digest
leads the unique constraint and every query), so two tenants may both hold `("prefs",)/"theme"`
and never see each other's. Items are memories like the rest: recalled by the contexts their
scope covers, listed, edited, archived and purged in the dashboard. Deleting an item archives
it (restorable, audited); putting it again brings it back as a new item.

This module holds the rules an item follows; writes are `memory_app.services.store`, reads
`memory_app.queries.store`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from memory_app import auth
from memory_app.errors import Forbidden, Invalid
from memory_app.memories import MAX_CONTENT_CHARS, Scope
from memory_app.models import ApiKey, MemoryRecord

MAX_LABELS = 20
MAX_LABEL_CHARS = 200
MAX_KEY_CHARS = 1000
MAX_SEARCH_LIMIT = 1000
MAX_NAMESPACES_LIMIT = 1000
FILTER_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")


def scope_for_store(key: ApiKey, scope_keys: dict[str, Any] | None) -> Scope:
    """The key subset a store request works in: `scope_keys` (inside the key's confinement),
    else the key's own confinement. An unconfined key names one: an empty subset would be seen
    by every context."""
    if scope_keys is None:
        scope_keys = key.context_keys or None
        if not scope_keys:
            raise Invalid(
                "give scope_keys (the key subset the items belong to): this API key is not "
                "confined to one"
            )
    if not isinstance(scope_keys, dict) or not scope_keys:
        raise Invalid("scope_keys must be a non-empty object")
    if not auth.keys_allowed(key, scope_keys):
        raise Forbidden("scope_keys lie outside this API key's context keys")
    return Scope(keys=scope_keys)


def _label(label: Any, *, wildcard: bool = False) -> str:
    if not isinstance(label, str) or not label:
        raise Invalid("namespace labels must be non-empty strings")
    if "." in label or "\x00" in label:
        raise Invalid("namespace labels cannot contain periods or NUL characters")
    if len(label) > MAX_LABEL_CHARS:
        raise Invalid(f"a namespace label is longer than {MAX_LABEL_CHARS} characters")
    if label == "*" and not wildcard:
        raise Invalid("'*' is a wildcard: an item's namespace cannot hold it")
    return label


def clean_namespace(namespace: Any, *, empty: bool = False, wildcard: bool = False) -> list[str]:
    """A namespace path as LangGraph allows it: labels without periods; an item's namespace is
    not empty and does not start with "langgraph"; prefixes and suffixes may hold `*`."""
    if not isinstance(namespace, list | tuple):
        raise Invalid("a namespace is a list of strings")
    if len(namespace) > MAX_LABELS:
        raise Invalid(f"a namespace has at most {MAX_LABELS} labels")
    labels = [_label(label, wildcard=wildcard) for label in namespace]
    if not empty:
        if not labels:
            raise Invalid("the namespace cannot be empty")
        if labels[0] == "langgraph":
            raise Invalid('a namespace cannot start with "langgraph"')
    return labels


def clean_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise Invalid("the item key must be a non-empty string")
    if "\x00" in key or len(key) > MAX_KEY_CHARS:
        raise Invalid(f"the item key must hold no NUL and at most {MAX_KEY_CHARS} characters")
    return key


def clean_ttl(ttl: Any) -> float | None:
    """Minutes an item lives after its last write (or refreshing read); None for ever."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise Invalid("ttl must be a number of minutes")
    if ttl <= 0:
        raise Invalid("ttl must be more than 0 minutes")
    return float(ttl)


def content_of(value: Any) -> str:
    """The content an item's value is kept as: its JSON text, keys in the order written."""
    if not isinstance(value, dict):
        raise Invalid("an item's value must be a JSON object")
    content = json.dumps(value, ensure_ascii=False)
    if len(content) > MAX_CONTENT_CHARS:
        raise Invalid(f"an item's value is longer than {MAX_CONTENT_CHARS} characters as JSON")
    return content


def value_of(record: MemoryRecord) -> dict[str, Any]:
    return json.loads(record.content)


def clean_filter(value_filter: Any) -> dict[str, Any]:
    """LangGraph's value filter: key -> value (equality; an object matches key by key) or key ->
    {operator: operand} with `$eq $ne $gt $gte $lt $lte` (the four comparisons take numbers)."""
    if value_filter is None:
        return {}
    if not isinstance(value_filter, dict):
        raise Invalid("filter must be an object")
    # Top-level names are value keys (even one starting with "$"); operators sit below them.
    stack = [v for v in value_filter.values() if isinstance(v, dict)]
    while stack:
        current = stack.pop()
        operators = [k for k in current if k.startswith("$")]
        if operators and len(operators) != len(current):
            raise Invalid("a filter object holds either operators or value keys, not both")
        if operators:
            for op in operators:
                if op not in FILTER_OPERATORS:
                    raise Invalid(f"unknown filter operator {op!r}")
                operand = current[op]
                if op not in ("$eq", "$ne") and (
                    isinstance(operand, bool) or not isinstance(operand, int | float)
                ):
                    raise Invalid(f"{op} compares numbers: give a number")
        for child in current.values():
            if isinstance(child, dict):
                stack.append(child)
    return value_filter
