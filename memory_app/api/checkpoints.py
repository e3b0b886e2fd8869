"""LangGraph checkpoints of a thread, the context named by its exact keys: put a checkpoint, put
a task's pending writes, list (and so get) checkpoints, delete a thread's checkpoints. The
client is `memory_app.client.langgraph_checkpoint.AgentMemorySaver`."""

from __future__ import annotations

import json

from ninja import Query, Router, Status
from ninja.errors import HttpError
from pydantic import TypeAdapter, ValidationError

from memory_app import auth
from memory_app.api.common import WRITE_ERRORS, require_scope, responses
from memory_app.queries.checkpoints import checkpoints_list, thread_context
from memory_app.queries.lists import MAX_LIMIT
from memory_app.schemas.checkpoints import (
    CheckpointPage,
    CheckpointPutIn,
    ConfigOut,
    DeletedOut,
    WritesPutIn,
    WrittenOut,
)
from memory_app.schemas.fields import JsonObject
from memory_app.services import checkpoints as checkpoints_service
from memory_app.services import contexts as contexts_service

router = Router(tags=["checkpoints"])


def _json_object(raw: str | None, name: str) -> dict | None:
    """A query parameter holding a JSON object (`keys`, `filter`), or a 422 naming it."""
    if raw is None or raw == "":
        return None
    try:
        return TypeAdapter(JsonObject).validate_python(json.loads(raw))
    except (ValueError, ValidationError):
        raise HttpError(422, f'{name} must be a JSON object, e.g. {{"source": "loop"}}') from None


def _thread_for_write(request, keys: dict):
    auth.require_keys_allowed(require_scope(request, "write"), keys)
    context, _ = contexts_service.context_get_or_create(keys=keys)
    return context


@router.post(
    "/checkpoints",
    response=responses({201: ConfigOut}, WRITE_ERRORS),
    summary="Put a LangGraph checkpoint (the thread's context is created when missing)",
)
def checkpoint_put(request, body: CheckpointPutIn):
    context = _thread_for_write(request, body.keys)
    row = checkpoints_service.checkpoint_put(
        context=context,
        checkpoint_ns=body.checkpoint_ns,
        checkpoint_id=body.checkpoint_id,
        parent_checkpoint_id=body.parent_checkpoint_id,
        checkpoint=(body.checkpoint.type, body.checkpoint.data),
        channel_versions=body.channel_versions,
        metadata=body.metadata,
        metadata_typed=(body.metadata_typed.type, body.metadata_typed.data),
        blobs=[(b.channel, b.version, b.value.type, b.value.data) for b in body.blobs],
        ts=body.ts,
        task=body.task,
        finished=body.finished,
        answer=body.answer,
    )
    return Status(
        201,
        {
            "thread_keys": context.keys,
            "checkpoint_ns": row.checkpoint_ns,
            "checkpoint_id": row.checkpoint_id,
        },
    )


@router.post(
    "/checkpoints/writes",
    response=responses({201: WrittenOut}, WRITE_ERRORS),
    summary="Put a task's pending writes on a checkpoint",
)
def writes_put(request, body: WritesPutIn):
    context = _thread_for_write(request, body.keys)
    checkpoints_service.writes_put(
        context=context,
        checkpoint_ns=body.checkpoint_ns,
        checkpoint_id=body.checkpoint_id,
        task_id=body.task_id,
        task_path=body.task_path,
        writes=[(w.idx, w.channel, w.value.type, w.value.data, w.summary) for w in body.writes],
    )
    return Status(201, {"written": len(body.writes)})


@router.get(
    "/checkpoints",
    response=responses({200: CheckpointPage}),
    summary="List a thread's checkpoints, newest first",
)
def checkpoint_list(
    request,
    thread_keys: str = Query(
        ..., alias="keys", description="JSON object: the thread's context keys, exactly"
    ),
    checkpoint_ns: str | None = Query(None, max_length=500, description="default: every one"),
    checkpoint_id: str | None = Query(None, max_length=200),
    before: str | None = Query(None, max_length=200, description="only checkpoints before it"),
    metadata_filter: str | None = Query(
        None, alias="filter", description="JSON object the checkpoints' metadata contain"
    ),
    limit: int = Query(100, ge=1, le=MAX_LIMIT, description="page size; page on with `before`"),
):
    key = require_scope(request, "read")
    wanted = _json_object(metadata_filter, "filter")
    context = thread_context(
        within=auth.visible_contexts(key), keys=_json_object(thread_keys, "keys") or {}
    )
    if context is None:
        return Status(200, {"items": []})
    items = checkpoints_list(
        context=context,
        checkpoint_ns=checkpoint_ns,
        checkpoint_id=checkpoint_id,
        before=before,
        metadata_filter=wanted,
        limit=limit,
    )
    return Status(200, {"items": items})


@router.delete(
    "/checkpoints",
    response=responses({200: DeletedOut}, WRITE_ERRORS),
    summary="Delete a thread's checkpoints and pending writes (its runs stay)",
)
def thread_delete(
    request,
    thread_keys: str = Query(
        ..., alias="keys", description="JSON object: the thread's context keys, exactly"
    ),
):
    key = require_scope(request, "write")
    context = thread_context(
        within=auth.visible_contexts(key), keys=_json_object(thread_keys, "keys") or {}
    )
    if context is None:
        return Status(200, {"deleted": 0})
    return Status(200, {"deleted": checkpoints_service.thread_delete(context=context)})
