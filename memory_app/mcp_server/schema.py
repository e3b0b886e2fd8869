"""Tool input schemas every MCP client can call, and null taken as "left out".

Pydantic writes an optional parameter as `anyOf: [X, {"type": "null"}]` with no top-level
`type`. smolagents' MCP path (`ToolCollection.from_mcp` through mcpadapt) gives such a property
the type "string", and treats every property without `"nullable": true` as required, so it
could not call a tool with an optional integer or leave one out. Here each optional property
gets one `type` (a list with "null"), `"nullable": true` and its default; a required one keeps
its plain type. Server side, an explicit null for an optional parameter is the parameter left
out (its default applies), whatever its type.
"""

from __future__ import annotations

import copy
from typing import Any

NULL = {"type": "null"}


def _merged(prop: dict[str, Any]) -> dict[str, Any]:
    """`anyOf: [X, null]` as X's keywords beside the property's own (description, default)."""
    variants = prop.get("anyOf")
    if not isinstance(variants, list) or len(variants) != 2 or NULL not in variants:
        return prop
    [other] = [v for v in variants if v != NULL]
    outer = {k: v for k, v in prop.items() if k != "anyOf"}
    return {**other, **outer}


def callable_by_every_client(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of a tool's input schema with each optional property typed `[X, "null"]` and
    marked `nullable` (smolagents' word), no `anyOf` with null at the top level."""
    schema = copy.deepcopy(schema)
    required = set(schema.get("required", ()))
    for name, prop in schema.get("properties", {}).items():
        prop = _merged(prop)
        if name not in required:
            kind = prop.get("type")
            if isinstance(kind, str) and kind != "null":
                prop["type"] = [kind, "null"]
            if isinstance(prop.get("enum"), list) and None not in prop["enum"]:
                prop["enum"] = [*prop["enum"], None]
            prop["nullable"] = True
        schema["properties"][name] = prop
    return schema


def without_nulls(schema: dict[str, Any], arguments: dict[str, Any] | None) -> dict[str, Any]:
    """The arguments minus an explicit null for any optional parameter (its default applies);
    a null for a required one stays, for validation to refuse."""
    required = set(schema.get("required", ()))
    return {k: v for k, v in (arguments or {}).items() if v is not None or k in required}
