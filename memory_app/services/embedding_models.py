"""Writes of the embedding-model registry: an operator registers a model name with its
dimensions before vectors may be stored or searched under it (`memory_app.embeddings.registry`
reads it)."""

from __future__ import annotations

from memory_app.audit import Actor
from memory_app.embeddings.registry import store_registration
from memory_app.errors import Conflict, Forbidden, Invalid
from memory_app.models import EmbeddingModel

MAX_DIMENSIONS = 16000


def embedding_model_register(
    *, name: str, dimensions: int, actor: Actor
) -> tuple[EmbeddingModel, bool]:
    """Register `name` with `dimensions` (the model, and whether this call created it).

    Registering again with the same dimensions is a no-op; with others, a Conflict: vectors
    stored under the name have the registered length, and changing it would make them
    unsearchable. A name is global (an index, and what every tenant's vectors under it mean),
    so an API key confined to a key subset, a tenant, may not register one."""
    if actor.api_key is not None and actor.api_key.context_keys:
        raise Forbidden(
            "an API key confined to context keys cannot register embedding models "
            "(they are global): use an unconfined admin key, the dashboard or "
            "`manage.py embedding_model add`"
        )
    if not isinstance(name, str) or not name or name != name.strip() or len(name) > 200:
        raise Invalid(
            "an embedding model's name is 1 to 200 characters, without surrounding spaces"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise Invalid("an embedding model's name holds no control characters")
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise Invalid("dimensions is a whole number")
    if not 1 <= dimensions <= MAX_DIMENSIONS:
        raise Invalid(f"dimensions is between 1 and {MAX_DIMENSIONS:,}")
    row, created = store_registration(name, dimensions, actor=actor)
    if not created and row.dimensions != dimensions:
        raise Conflict(
            f"embedding model {name!r} is registered with {row.dimensions} dimensions",
            {"dimensions": {"stored": row.dimensions, "sent": dimensions}},
        )
    return row, created
