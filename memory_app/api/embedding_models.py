"""The embedding-model registry: `GET /embedding-models` lists the names vectors may be sent
under (read scope); `POST /embedding-models` registers one (admin scope, unconfined key: a
confined key is a tenant, and a name is global)."""

from __future__ import annotations

from ninja import Router, Status

from memory_app.api.common import (
    WRITE_ERRORS,
    actor_for,
    require_scope,
    responses,
)
from memory_app.embeddings.registry import registered_models
from memory_app.schemas.embedding_models import (
    EmbeddingModelIn,
    EmbeddingModelListOut,
    EmbeddingModelOut,
    embedding_model_out,
)
from memory_app.services.embedding_models import embedding_model_register

router = Router(tags=["embedding models"])


@router.get(
    "/embedding-models",
    response=responses({200: EmbeddingModelListOut}),
    summary="List the registered embedding models",
)
def embedding_model_list(request):
    """The model names vectors may be stored and searched under, with their dimensions. A
    vector under any other name is a 422."""
    require_scope(request, "read")
    return Status(200, {"items": [embedding_model_out(r) for r in registered_models()]})


@router.post(
    "/embedding-models",
    response=responses({200: EmbeddingModelOut, 201: EmbeddingModelOut}, WRITE_ERRORS),
    summary="Register an embedding model with its dimensions (unconfined admin key)",
)
def embedding_model_add(request, body: EmbeddingModelIn):
    """201 when registered, 200 when it already was with these dimensions, 409 when it is
    registered with others, 403 for a key without the admin scope or confined to context keys
    (names are global: a tenant may not claim one)."""
    require_scope(request, "admin")
    row, created = embedding_model_register(
        name=body.name, dimensions=body.dimensions, actor=actor_for(request)
    )
    return Status(201 if created else 200, embedding_model_out(row))
