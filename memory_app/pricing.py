"""What a step's model calls cost: the agent's own figure when it reports one, else its token
counts at the per-model prices in settings (`AGENTMEMORY_DEFAULT_MODEL_PRICES`, overridden by
the JSON in `AGENTMEMORY_MODEL_PRICES`). Unknown stays unknown (None), never 0."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

PER_TOKENS = 1_000_000


@lru_cache(maxsize=4)
def _table(defaults: str, override: str) -> dict[str, tuple[float, float]]:
    table = json.loads(defaults)
    try:
        extra = json.loads(override) if override.strip() else {}
    except ValueError as exc:
        raise ImproperlyConfigured(f"AGENTMEMORY_MODEL_PRICES is not valid JSON: {exc}") from exc
    if not isinstance(extra, dict):
        raise ImproperlyConfigured(
            "AGENTMEMORY_MODEL_PRICES must be a JSON object of model: [input, output]"
        )
    table.update(extra)
    prices = {}
    for model, price in table.items():
        if price is None:
            continue
        if (
            not isinstance(price, list | tuple)
            or len(price) != 2
            or not all(isinstance(p, int | float) and math.isfinite(p) and p >= 0 for p in price)
        ):
            raise ImproperlyConfigured(
                f"AGENTMEMORY_MODEL_PRICES[{model!r}] must be [input, output] "
                "USD per million tokens"
            )
        prices[model.lower()] = (float(price[0]), float(price[1]))
    return prices


def price_table() -> dict[str, tuple[float, float]]:
    return _table(
        json.dumps(settings.AGENTMEMORY_DEFAULT_MODEL_PRICES), settings.AGENTMEMORY_MODEL_PRICES
    )


# Inside `prices_fixed`: each model's price as first looked up in the block.
_fixed: ContextVar[dict[str, tuple[float, float] | None] | None] = ContextVar(
    "agentmemory_prices_fixed", default=None
)


@contextmanager
def prices_fixed() -> Iterator[None]:
    """Within the block, a model's price is looked up once (a batch pricing thousands of steps:
    each lookup reads the settings' table again, serialised for its cache key)."""
    token = _fixed.set({})
    try:
        yield
    finally:
        _fixed.reset(token)


def model_price(model: str) -> tuple[float, float] | None:
    """(input, output) USD per million tokens for `model`, or None when it has no price."""
    if not model:
        return None
    fixed = _fixed.get()
    if fixed is None:
        return _model_price(model)
    if model not in fixed:
        fixed[model] = _model_price(model)
    return fixed[model]


def _model_price(model: str) -> tuple[float, float] | None:
    table = price_table()
    name = model.lower().rsplit("/", 1)[-1]
    best = None
    for listed in table:
        if (name == listed or name.startswith(listed + "-")) and (
            best is None or len(listed) > len(best)
        ):
            best = listed
    return table[best] if best else None


def tokens_cost(*, model: str, input_tokens: int | None, output_tokens: int | None) -> float | None:
    price = model_price(model)
    if price is None or (input_tokens is None and output_tokens is None):
        return None
    return ((input_tokens or 0) * price[0] + (output_tokens or 0) * price[1]) / PER_TOKENS


def step_cost(
    *, model: str, cost: float | None, input_tokens: int | None, output_tokens: int | None
) -> float | None:
    if cost is not None:
        return cost
    return tokens_cost(model=model, input_tokens=input_tokens, output_tokens=output_tokens)
