"""The key order of JSON objects, kept apart from the objects themselves.

PostgreSQL `jsonb` stores an object's keys sorted (shorter keys first, then bytewise), not in
the order they arrived. Most readers do not care, but agents do where a dict becomes text: an
AgentScope formatter turns a `tool_use` block's `input` into `json.dumps(input)`, smolagents
prints `str(tool_call.dict())` into "Calling tools:". A framework's memory must come back with
its keys in the original order, or the rehydrated agent's prompt differs from the original's.

`capture(value)` returns a small skeleton that records, for each object whose order jsonb would
change, its keys in order (and the same for nested values); `None` when jsonb keeps everything
as it was. `restore(value, skeleton)` puts the keys back. The skeleton is plain JSON, so it can
itself live in a jsonb column: it keeps orders in arrays, which jsonb never reorders.

Skeleton shape: an object node is `{"k": [keys in order], "c": {key: child node}}` (either part
left out when empty), an array node is `{"i": {"<index>": child node}}`.
"""

from __future__ import annotations

from typing import Any


def jsonb_order(keys: list[str]) -> list[str]:
    """The order PostgreSQL's jsonb keeps object keys in: by byte length, then bytewise."""
    return sorted(keys, key=lambda k: (len(k.encode()), k.encode()))


def capture(value: Any) -> dict | None:
    if isinstance(value, dict):
        node: dict[str, Any] = {}
        keys = list(value)
        if keys != jsonb_order(keys):
            node["k"] = keys
        children = {k: c for k, v in value.items() if (c := capture(v)) is not None}
        if children:
            node["c"] = children
        return node or None
    if isinstance(value, list):
        children = {str(i): c for i, v in enumerate(value) if (c := capture(v)) is not None}
        return {"i": children} if children else None
    return None


def restore(value: Any, skeleton: Any) -> Any:
    """`value` with its objects' keys in the captured order. Keys the skeleton does not know
    (the value was changed since) follow in their current order; unknown skeleton keys are
    ignored, so a stale skeleton never loses data."""
    if not isinstance(skeleton, dict):
        return value
    if isinstance(value, dict):
        known = [k for k in skeleton.get("k") or [] if k in value]
        order = known + [k for k in value if k not in set(known)]
        children = skeleton.get("c") or {}
        return {k: restore(value[k], children.get(k)) for k in order}
    if isinstance(value, list):
        children = skeleton.get("i") or {}
        if not children:
            return value
        return [restore(v, children.get(str(i))) for i, v in enumerate(value)]
    return value
