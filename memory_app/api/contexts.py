"""Contexts: get-or-create by keys, get, list (filter by keys, cursor), update title/metadata."""

from __future__ import annotations

import json

from ninja import Query, Router, Status
from ninja.errors import HttpError
from pydantic import TypeAdapter, ValidationError

from memory_app import auth
from memory_app.api.common import (
    WRITE_ERRORS,
    ContextId,
    actor_for,
    context_for,
    require_scope,
    responses,
)
from memory_app.queries.lists import MAX_LIMIT, contexts_list
from memory_app.schemas.contexts import ContextIn, ContextOut, ContextPage, ContextUpdateIn
from memory_app.schemas.fields import INT64_MAX, JsonObject
from memory_app.services import contexts as contexts_service

router = Router(tags=["contexts"])


@router.post(
    "/contexts",
    response=responses({200: ContextOut, 201: ContextOut}, WRITE_ERRORS),
    summary="Get or create a context by its keys",
)
def context_get_or_create(request, body: ContextIn):
    """200 with the existing context for these keys, 201 when it was created now. A key
    confined to a key subset may only use keys that contain that subset (403 otherwise)."""
    auth.require_keys_allowed(require_scope(request, "write"), body.keys)
    context, created = contexts_service.context_get_or_create(
        keys=body.keys, title=body.title, metadata=body.metadata
    )
    return Status(201 if created else 200, context)


def keys_filter(raw: str | None) -> dict | None:
    """The `keys` query parameter: a JSON object the listed contexts' keys contain."""
    if raw is None or raw == "":
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        raise HttpError(422, 'keys must be a JSON object, e.g. {"user": "ada"}') from None
    try:
        return TypeAdapter(JsonObject).validate_python(value)
    except ValidationError as exc:
        raise HttpError(422, f"keys must be a JSON object: {exc.errors()[0]['msg']}") from None


@router.get("/contexts", response=responses({200: ContextPage}), summary="List contexts")
def context_list(
    request,
    keys_filter: str | None = Query(
        None,
        alias="keys",
        description='JSON object; contexts whose keys contain it, e.g. {"user": "ada"}',
        examples=['{"user": "ada"}'],
    ),
    after: int | None = Query(None, ge=0, le=INT64_MAX, description="cursor: last id seen"),
    limit: int = Query(50, ge=1, le=MAX_LIMIT),
):
    key = require_scope(request, "read")
    page = contexts_list(
        within=auth.visible_contexts(key), keys=keys_filter(keys_filter), after=after, limit=limit
    )
    return Status(200, page)


@router.get(
    "/contexts/{context_id}", response=responses({200: ContextOut}), summary="Get a context"
)
def context_get(request, context_id: ContextId):
    require_scope(request, "read")
    return Status(200, context_for(request, context_id))


@router.patch(
    "/contexts/{context_id}",
    response=responses({200: ContextOut}, WRITE_ERRORS),
    summary="Update a context's title or metadata",
)
def context_update(request, context_id: ContextId, body: ContextUpdateIn):
    require_scope(request, "write")
    context = context_for(request, context_id)
    return Status(
        200,
        contexts_service.context_update(
            context=context, title=body.title, metadata=body.metadata, actor=actor_for(request)
        ),
    )
