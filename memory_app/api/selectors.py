"""Selectors and client vectors: `POST /contexts/{id}/select`, `POST /messages/{id}/embeddings`.

The select endpoint is a thin shell over `memory_app.selectors.select` (the function the
dashboard's playground calls too): the body names the selector and its options; the answer lists
the chosen messages oldest-first, each with its reason and token count, plus totals.
"""

from __future__ import annotations

from ninja import Router, Status
from ninja.errors import HttpError

from memory_app import errors
from memory_app.api.common import (
    WRITE_ERRORS,
    ContextId,
    MessageId,
    context_for,
    json_response,
    message_for,
    require_scope,
    responses,
)
from memory_app.embeddings import client_vectors
from memory_app.schemas.selectors import (
    MessageVectorIn,
    MessageVectorOut,
    SelectIn,
    SelectOut,
    select_out,
)

router = Router(tags=["selectors"])


@router.post(
    "/contexts/{context_id}/select",
    response=responses({200: SelectOut}, (*WRITE_ERRORS, 503)),
    url_name="select",
    summary="Select the messages for the next prompt",
)
def select(request, context_id: ContextId, body: SelectIn):
    """Run a selector on the context's live messages (pruned ones never appear). 422 for bad
    options, an unknown tokenizer, a vector of the wrong dimension, or semantic search with no
    embedding provider; 503 when the provider is configured but down."""
    require_scope(request, "read")
    context = context_for(request, context_id)
    try:
        return json_response(200, select_out(context, body))
    except errors.ProviderDown as exc:
        raise HttpError(503, str(exc)) from exc


@router.post(
    "/messages/{message_id}/embeddings",
    response=responses({200: MessageVectorOut}, WRITE_ERRORS),
    summary="Store a client-computed vector for a message",
)
def message_vector_put(request, message_id: MessageId, body: MessageVectorIn):
    """Agents may send their own vectors under a model name; the first vector of a model fixes its
    dimensions (a vector of another length is a 422). Replaces an earlier vector of that model."""
    require_scope(request, "write")
    message = message_for(request, message_id)
    row = client_vectors.vector_put(model=body.model, vector=body.vector, message=message)
    return Status(200, {"message_id": message.pk, "model": row.model, "dimensions": row.dimensions})
