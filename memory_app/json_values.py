"""RFC 8259 JSON only: the hooks that make `json.loads` refuse what JSON cannot hold (NaN,
Infinity, numbers beyond a float), a walk that bounds nesting without recursion, the check
that every string and key is one PostgreSQL can store (no NUL, no lone surrogate), and the test
for a text orjson would read otherwise than `json.loads` (an integer beyond 64 bits)."""

import math
import re
from typing import Any

_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
# orjson keeps integers from -2**63 to 2**64 - 1: 20 digits are beyond them, and so are 19
# after a minus sign (-9223372036854775809 would come back as a rounded float).
_LONG_RUN = b"0" * 19
_DIGIT_RUN = re.compile(rb"[0-9]*")


def may_hold_long_integer(text: bytes) -> bool:
    """True when `text` holds 20 digits in a row (19 after a minus sign) anywhere but after a
    decimal point: an integer orjson would round to a float, which only `json.loads` reads
    exactly.

    Fraction digits are left out: they make a float whichever parser reads them, and a vector
    written by Python's `json` puts 20 in a row in every value between 1e-4 and 1e-3
    (`0.00012345678901234567`), which sent ~1,300 of a 1,000 × 384 body's numbers, and so the
    whole body, to the exact parser (a tenth of orjson's speed). One pass of `bytes.translate`
    and `find` instead of a regular expression: the check stays small beside the parse.
    """
    masked = text.translate(_DIGITS_AS_ZERO)
    at = masked.find(_LONG_RUN)
    while at != -1:
        end = _DIGIT_RUN.match(text, at).end()
        before = masked[at - 1] if at else None
        if before != ord(".") and (before == ord("-") or end - at >= 20):
            return True
        at = masked.find(_LONG_RUN, end)
    return False


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
