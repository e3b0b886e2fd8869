"""RFC 8259 JSON only: the hooks that make `json.loads` refuse what JSON cannot hold (NaN,
Infinity, numbers beyond a float), a walk that bounds nesting without recursion, and the check
that every string and key is one PostgreSQL can store (no NUL, no lone surrogate)."""

import math
from typing import Any


def reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def depth_over(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` arrays/objects (walked without recursion)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                if depth == limit:
                    return True
                stack.append((child, depth + 1))
    return False


def check_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("NUL characters (\\u0000) cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (lone surrogate found)") from None
    return value


def check_json(value: Any) -> Any:
    """Walk a JSON value: no NUL / lone surrogate in any string or key, no NaN or infinity."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            check_text(item)
        elif isinstance(item, bool) or item is None or isinstance(item, int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError("NaN and infinity are not valid JSON numbers")
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise ValueError("JSON object keys must be strings")
                check_text(k)
                stack.append(v)
        elif isinstance(item, list | tuple):
            stack.extend(item)
        else:
            raise ValueError(f"not a JSON value: {type(item).__name__}")
    return value
