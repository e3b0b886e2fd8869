"""RFC 8259 JSON only: the hooks that make `json.loads` refuse what JSON cannot hold (NaN,
Infinity, numbers beyond a float) and a walk that bounds nesting without recursion."""

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
