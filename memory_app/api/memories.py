"""Long-term memories: record, retrieve, get, status, edit, archive, restore, purge
(`/api/v1/memories`).

A record's scope is one context (`context_id`) or a key subset (`scope_keys`) shared by every
context whose keys contain it. A key confined to `{"tenant": "acme"}` may only use scopes inside
its confinement; records outside it answer 404 as if absent.
"""

from __future__ import annotations

from typing import Annotated

from ninja import Path, Query, Router, Status

from memory_app.api.common import WRITE_ERRORS, actor_for, request_key, require_scope, responses
from memory_app.models import MemoryRecord
from memory_app.queries.memories import memory_for_key
from memory_app.schemas.fields import INT64_MAX
from memory_app.schemas.memories import (
    MemoryEditIn,
    MemoryNoteIn,
    MemoryPurgedOut,
    MemoryRecordBatchOut,
    MemoryRecordIn,
    MemoryRecordOut,
    MemoryRetrieveIn,
    MemoryRetrieveOut,
    MemoryStatusOut,
    MemoryStatusQuery,
    record,
    recorded_out,
    retrieve_out,
    status_out,
)
from memory_app.services import memories as memories_services
from memory_app.services.memories import memory_purge, memory_set_archived

router = Router(tags=["memories"])
MemoryId = Annotated[int, Path(ge=1, le=INT64_MAX, description="memory id", examples=[5])]


def _memory_for(request, memory_id: int) -> MemoryRecord:
    return memory_for_key(request_key(request), memory_id)


@router.post(
    "/memories",
    response=responses({200: MemoryRecordBatchOut, 201: MemoryRecordBatchOut}, WRITE_ERRORS),
    summary="Record memories",
)
def memories_record(request, body: MemoryRecordIn):
    """201 when at least one record is new; content already in the scope returns the stored
    record (`created: false`), 200 when nothing was new. Content nearly identical to a live
    memory of the scope returns that memory (`created: false`, `near_copy` its similarity).
    A key whose memories are reviewed records proposals (`status: proposed`): they are not
    recalled until an operator approves them."""
    key = require_scope(request, "write")
    results = record(key, body)
    status = 201 if any(r.created for r in results) else 200
    return Status(status, recorded_out(results))


@router.get(
    "/memories/status",
    response=responses({200: MemoryStatusOut}),
    summary="Status of memories",
)
def memories_status(request, params: Query[MemoryStatusQuery]):
    """The memories of `ids` this key may see, each with its review `status` (proposed, live,
    rejected, merged: `metadata.merged_into` names the memory it went into); `missing` lists the
    others."""
    return Status(200, status_out(require_scope(request, "read"), params.ids))


@router.post(
    "/memories/retrieve",
    response=responses({200: MemoryRetrieveOut}, WRITE_ERRORS),
    summary="Retrieve memories",
)
def memories_retrieve(request, body: MemoryRetrieveIn):
    """What a context recalls: its own records and those of every key subset its keys contain.
    `keywords` answer up to `limit` records each (AgentScope's `retrieve_from_memory`); `query`
    answers up to `limit` by full-text and, with vectors, similarity."""
    return Status(200, retrieve_out(require_scope(request, "read"), body))


@router.get(
    "/memories/{memory_id}", response=responses({200: MemoryRecordOut}), summary="Get a memory"
)
def memory_get(request, memory_id: MemoryId):
    require_scope(request, "read")
    return Status(200, _memory_for(request, memory_id))


@router.patch(
    "/memories/{memory_id}",
    response=responses({200: MemoryRecordOut}, WRITE_ERRORS),
    summary="Edit a memory",
)
def memory_edit(request, memory_id: MemoryId, body: MemoryEditIn):
    """The previous version is kept in the audit log; 409 when the new content already exists in
    the same scope. `expires_at` (null: never), `ttl_seconds` and `pinned` change its expiry."""
    require_scope(request, "write")
    record = _memory_for(request, memory_id)
    record = memories_services.memory_change(
        record=record,
        actor=actor_for(request),
        expiry=body.expiry(),
        content=body.content,
        kind=body.kind,
        thinking=body.thinking,
        keywords=body.keywords,
        metadata=body.metadata,
        note=body.note or "",
    )
    return Status(200, record)


@router.post(
    "/memories/{memory_id}/archive",
    response=responses({200: MemoryRecordOut}, WRITE_ERRORS),
    summary="Archive a memory",
)
def memory_archive(request, memory_id: MemoryId, body: MemoryNoteIn | None = None):
    require_scope(request, "write")
    record = memory_set_archived(
        record=_memory_for(request, memory_id),
        archived=True,
        actor=actor_for(request),
        note=(body.note if body else "") or "",
    )
    return Status(200, record)


@router.post(
    "/memories/{memory_id}/restore",
    response=responses({200: MemoryRecordOut}, WRITE_ERRORS),
    summary="Restore a memory",
)
def memory_restore(request, memory_id: MemoryId, body: MemoryNoteIn | None = None):
    require_scope(request, "write")
    record = memory_set_archived(
        record=_memory_for(request, memory_id),
        archived=False,
        actor=actor_for(request),
        note=(body.note if body else "") or "",
    )
    return Status(200, record)


@router.delete(
    "/memories/{memory_id}",
    response=responses({200: MemoryPurgedOut}, WRITE_ERRORS),
    summary="Purge a memory",
)
def memory_delete(request, memory_id: MemoryId, body: MemoryNoteIn | None = None):
    """Irreversible, 'admin' scope: the record, its vectors and its content in the audit trail
    are deleted for good (archive hides a memory and keeps it). The purge is audited without the
    content. 409 when the memory is under legal hold (`differences.legal_hold` says why)."""
    require_scope(request, "admin")
    event = memory_purge(
        record=_memory_for(request, memory_id),
        actor=actor_for(request),
        note=(body.note if body else "") or "",
    )
    return Status(200, {"id": memory_id, "audit_event_id": event.pk})
