"""Selectors and client vectors: `POST /contexts/{id}/select`, `POST /messages/{id}/embeddings`.

The select endpoint is a thin shell over `memory_app.selectors.select` (the function the
dashboard's playground calls too): the body names the selector and its options; the answer lists
the chosen messages oldest-first, each with its reason and token count, plus totals.
"""

from __future__ import annotations

from ninja import Router, Status
from ninja.errors import AuthenticationError, HttpError

from memory_app import errors
from memory_app.api.common import (
    WRITE_ERRORS,
    ApiKeyAuth,
    ContextId,
    MessageId,
    context_for,
    json_response,
    key_read_with,
    known_size,
    message_for,
    require_scope,
    responses,
)
from memory_app.embeddings import client_vectors
from memory_app.models import Context
from memory_app.schemas.selectors import (
    MessageVectorIn,
    MessageVectorOut,
    SelectIn,
    SelectOut,
    select_out,
)
from memory_app.search.keyword import KEYWORD_EXACT_MESSAGES

router = Router(tags=["selectors"])
# A selection that is one read takes the request's key with it (`_key_read_with_the_selection`).
router_auth = ApiKeyAuth(deferred=True)


@router.post(
    "/contexts/{context_id}/select",
    response=responses({200: SelectOut}, (*WRITE_ERRORS, 503)),
    url_name="select",
    auth=router_auth,
    summary="Select the messages for the next prompt",
)
def select(request, context_id: ContextId, body: SelectIn):
    """Run a selector on the context's live messages (pruned ones never appear). 422 for bad
    options, an unknown tokenizer, a vector of the wrong dimension, or semantic search with no
    embedding provider; 503 when the provider is configured but down."""
    if _key_read_with_the_selection(request, body):
        return _select_with_the_key(request, context_id, body)
    require_scope(request, "read")
    context = context_for(request, context_id)
    try:
        return json_response(200, select_out(context, body))
    except errors.ProviderDown as exc:
        raise HttpError(503, str(exc)) from exc


def _key_read_with_the_selection(request, body: SelectIn) -> bool:
    """A selection that is one read, by a key this process has verified on this context before
    (`known_size`): the key and the context are read in that read's round trip. The window's
    last k is one statement, and a contiguous token window's first; a semantic search with the
    client's query vector is sized from the size last seen (its walk's settings, and whether
    the context is large enough for the index: the one before or after a few appends answers
    the same); a keyword search ranks a small context in one statement that reads the
    counters itself (and sends none back when the context has outgrown it). The answer is used
    only once the key has passed."""
    size = known_size(request)
    if size is None:
        return False
    if body.selector == "window":
        return body.semantics == "plain"
    if body.selector == "token_window":
        # Its first read is the window's (the newest messages), which most budgets end in.
        return body.policy == "contiguous"
    if body.selector != "search":
        return False
    if body.mode == "semantic":
        return body.query_vector is not None
    return body.mode == "keyword" and size <= KEYWORD_EXACT_MESSAGES


def _select_with_the_key(request, context_id: int, body: SelectIn):
    # Only the id and the size are read from the context by these selections (the counters the
    # keyword statement needs are read by it).
    context = Context(
        id=context_id, message_count=known_size(request), last_seq=None, search_seq=None
    )
    try:
        with key_read_with(request):
            out = select_out(context, body)
    except AuthenticationError:
        raise
    except Exception:
        # What the request would have met first, before the search's own errors: 403, 404.
        require_scope(request, "read")
        context_for(request, context_id)
        raise
    require_scope(request, "read")
    context_for(request, context_id)
    return json_response(200, out)


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
