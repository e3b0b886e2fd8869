"""Messages: append (one or a batch, idempotent by client id), list, get, edit, prune, restore."""

from __future__ import annotations

from typing import Literal

from django.http import HttpResponse
from ninja import Query, Router, Status

from memory_app.api.common import (
    WRITE_ERRORS,
    ContextId,
    MessageId,
    actor_for,
    append_auth,
    context_for,
    count_appended,
    json_response,
    message_for,
    require_scope,
    responses,
    superseded,
)
from memory_app.queries.lists import MAX_LIMIT, messages_list
from memory_app.schemas.fields import INT64_MAX
from memory_app.schemas.messages import (
    MessageBatchIn,
    MessageBatchOut,
    MessageEditIn,
    MessageIn,
    MessageOut,
    MessagePage,
    PruneIn,
    PruneNoteIn,
    PruneOut,
    message_out,
    message_ref,
)
from memory_app.services import curation as curation_service
from memory_app.services import messages as messages_service

router = Router(tags=["messages"])


def _append(request, context_id: int, items: list[MessageIn]) -> messages_service.AppendResult:
    require_scope(request, "write")
    context = context_for(request, context_id)
    # Links to runs or steps of another context are a NotFound (404) from the write path.
    result = messages_service.messages_append(
        context=context, items=[m.to_new_message() for m in items]
    )
    count_appended(request, context, sum(result.created))
    return result


@router.post(
    "/contexts/{context_id}/messages",
    response=responses({200: MessageOut, 201: MessageOut}, WRITE_ERRORS),
    auth=append_auth,
    summary="Append one message",
)
def message_append(request, context_id: ContextId, body: MessageIn):
    """201 with the stored message; 200 with the stored one when `client_id` was already
    appended with the same content; 409 with the differences when the content differs."""
    result = _append(request, context_id, [body])
    return json_response(201 if result.any_created else 200, message_out(result.messages[0]))


@router.post(
    "/contexts/{context_id}/messages/batch",
    response=responses({200: MessageBatchOut, 201: MessageBatchOut}, WRITE_ERRORS),
    auth=append_auth,
    summary="Append up to 1000 messages, all or nothing",
)
def message_append_batch(
    request,
    context_id: ContextId,
    body: MessageBatchIn,
    answer: Literal["ids", "full"] = Query(  # noqa: B008 - ninja parameter marker
        "ids",
        alias="return",
        description="`ids` (default): each message's id, seq and client id; `full`: each "
        "stored message whole, as one append answers it",
    ),
):
    """Seqs are consecutive in the order sent. One conflicting client id rejects the whole
    batch (409). 201 when at least one message was stored now, 200 when all were repeats."""
    # A large body runs with the cyclic GC paused from parsing to echo
    # (limits.BulkBodyGcMiddleware).
    result = _append(request, context_id, body.messages)
    out = message_out if answer == "full" else message_ref
    return json_response(
        201 if result.any_created else 200,
        {"messages": [out(m) for m in result.messages], "created": result.created},
    )


@router.get(
    "/contexts/{context_id}/messages",
    response=responses({200: MessagePage}),
    summary="List messages",
)
def message_list(
    request,
    context_id: ContextId,
    after: int | None = Query(None, ge=0, le=INT64_MAX, description="only seq > after"),
    before: int | None = Query(None, ge=0, le=INT64_MAX, description="only seq < before"),
    limit: int = Query(100, ge=1, le=MAX_LIMIT),
    include_pruned: bool = Query(False, description="include pruned (soft-deleted) messages"),
):
    """In seq order. Page forward with `after=next_cursor`; with only `before`, the page just
    before it (page backward with `before=next_cursor`)."""
    require_scope(request, "read")
    context = context_for(request, context_id)
    page = messages_list(
        context=context, after=after, before=before, limit=limit, include_pruned=include_pruned
    )
    return json_response(
        200,
        {
            "items": [message_out(m) for m in page.items],
            "has_more": page.has_more,
            "next_cursor": page.next_cursor,
        },
    )


def _message_get(request, message_id: int, context_id: int | None = None):
    require_scope(request, "read")
    return message_for(request, message_id, context_id)


def _message_edit(request, message_id: int, body: MessageEditIn, context_id: int | None = None):
    require_scope(request, "write")
    message = message_for(request, message_id, context_id)
    return messages_service.message_edit(
        message=message,
        actor=actor_for(request),
        text=body.text,
        tags=body.tags,
        metadata=body.metadata,
    )


@router.get(
    "/contexts/{context_id}/messages/{int:message_id}",
    response=responses({200: MessageOut}),
    summary="Get a message",
)
def context_message_get(request, context_id: ContextId, message_id: MessageId):
    return Status(200, _message_get(request, message_id, context_id))


@router.patch(
    "/contexts/{context_id}/messages/{int:message_id}",
    response=responses({200: MessageOut}, WRITE_ERRORS),
    summary="Edit a message's text, tags or metadata (audited)",
)
def context_message_edit(
    request, context_id: ContextId, message_id: MessageId, body: MessageEditIn
):
    return Status(200, _message_edit(request, message_id, body, context_id))


@router.get(
    "/messages/{message_id}",
    response=responses({200: MessageOut}),
    summary="Get a message (by id alone; superseded by the route with its context)",
    deprecated=True,
)
def message_get(request, message_id: MessageId, response: HttpResponse):
    message = _message_get(request, message_id)
    superseded(response, message, "messages")
    return Status(200, message)


@router.patch(
    "/messages/{message_id}",
    response=responses({200: MessageOut}, WRITE_ERRORS),
    summary="Edit a message (by id alone; superseded by the route with its context)",
    deprecated=True,
)
def message_edit(request, message_id: MessageId, body: MessageEditIn, response: HttpResponse):
    message = _message_edit(request, message_id, body)
    superseded(response, message, "messages")
    return Status(200, message)


def _set_pruned(request, context_id: int, ids: list[int], note: str, pruned: bool) -> dict:
    require_scope(request, "write")
    context = context_for(request, context_id)
    changed, event = curation_service.messages_set_pruned(
        context=context, ids=ids, pruned=pruned, actor=actor_for(request), note=note
    )
    return {"changed": changed, "audit_event_id": event.pk if event else None}


@router.post(
    "/contexts/{context_id}/messages/prune",
    response=responses({200: PruneOut}, WRITE_ERRORS),
    summary="Prune (soft-delete) messages of a context (audited)",
)
def messages_prune(request, context_id: ContextId, body: PruneIn):
    """All or nothing: an id not in this context is a 404 and nothing changes."""
    return Status(200, _set_pruned(request, context_id, body.ids, body.note, True))


@router.post(
    "/contexts/{context_id}/messages/restore",
    response=responses({200: PruneOut}, WRITE_ERRORS),
    summary="Restore pruned messages of a context (audited)",
)
def messages_restore(request, context_id: ContextId, body: PruneIn):
    return Status(200, _set_pruned(request, context_id, body.ids, body.note, False))


def _prune_one(request, message_id, body, pruned: bool, context_id: int | None = None):
    require_scope(request, "write")
    message = message_for(request, message_id, context_id)
    note = body.note if body else ""
    return message, _set_pruned(request, message.context_id, [message.pk], note, pruned)


@router.post(
    "/contexts/{context_id}/messages/{int:message_id}/prune",
    response=responses({200: PruneOut}, WRITE_ERRORS),
    summary="Prune one message (audited)",
)
def context_message_prune(
    request, context_id: ContextId, message_id: MessageId, body: PruneNoteIn | None = None
):
    return Status(200, _prune_one(request, message_id, body, True, context_id)[1])


@router.post(
    "/contexts/{context_id}/messages/{int:message_id}/restore",
    response=responses({200: PruneOut}, WRITE_ERRORS),
    summary="Restore one message (audited)",
)
def context_message_restore(
    request, context_id: ContextId, message_id: MessageId, body: PruneNoteIn | None = None
):
    return Status(200, _prune_one(request, message_id, body, False, context_id)[1])


@router.post(
    "/messages/{message_id}/prune",
    response=responses({200: PruneOut}, WRITE_ERRORS),
    summary="Prune one message (by id alone; superseded by the route with its context)",
    deprecated=True,
)
def message_prune(
    request, message_id: MessageId, response: HttpResponse, body: PruneNoteIn | None = None
):
    message, answer = _prune_one(request, message_id, body, True)
    superseded(response, message, "messages", "prune")
    return Status(200, answer)


@router.post(
    "/messages/{message_id}/restore",
    response=responses({200: PruneOut}, WRITE_ERRORS),
    summary="Restore one message (by id alone; superseded by the route with its context)",
    deprecated=True,
)
def message_restore(
    request, message_id: MessageId, response: HttpResponse, body: PruneNoteIn | None = None
):
    message, answer = _prune_one(request, message_id, body, False)
    superseded(response, message, "messages", "restore")
    return Status(200, answer)
