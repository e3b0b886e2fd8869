"""Framework interop endpoints: smolagents runs and transcripts, AgentScope memory, AgentKit input.

Thin: validate, one call into `memory_app.framework_io` / `memory_app.transcripts`, map errors.
"""

from __future__ import annotations

from typing import Any, Literal

from django.db import transaction
from django.http import HttpResponse, JsonResponse
from ninja import Query, Router, Status

from memory_app import framework_io, transcripts
from memory_app.api.common import (
    WRITE_ERRORS,
    ContextId,
    RunId,
    actor_for,
    context_for,
    require_scope,
    responses,
    run_for,
)
from memory_app.interop import agentkit
from memory_app.schemas.interop import (
    AGENTSCOPE_MSG_EXAMPLE,
    AddIn,
    AddOut,
    AgentScopeImportOut,
    ChatMessageOut,
    CountOut,
    DeleteByMarkIn,
    DeleteIn,
    MemoryOut,
    SmolExportOut,
    SmolRunIn,
    SmolRunOut,
    SmolStepsIn,
    StateIn,
    StepsOut,
    SummaryIn,
    ToolInputOut,
    ToolInputQuery,
    UpdateMarksIn,
)

router = Router(tags=["interop"])


@router.post(
    "/contexts/{context_id}/smolagents/runs",
    response=responses({200: SmolRunOut, 201: SmolRunOut}, WRITE_ERRORS),
    summary="Import a finished smolagents run (get_full_steps JSON)",
)
def smolagents_import(request, context_id: ContextId, body: SmolRunIn):
    require_scope(request, "write")
    context = context_for(request, context_id)
    run, created = framework_io.smolagents_run_import(
        context=context,
        steps=body.steps,
        system_prompt=body.system_prompt,
        client_id=body.client_id,
        agent_name=body.agent_name,
        task=body.task,
        status=body.status,
        final_answer=body.final_answer,
        metadata=body.metadata,
    )
    out = {"run_id": run.pk, "created": created, "status": run.status, "step_count": run.step_count}
    return Status(201 if created else 200, out)


@router.get(
    "/runs/{run_id}/smolagents",
    response=responses({200: SmolExportOut}),
    summary="Export a run as get_full_steps JSON",
)
def smolagents_export(request, run_id: RunId, include_pruned: bool = False):
    require_scope(request, "read")
    return framework_io.smolagents_run_export(
        run=run_for(request, run_id), include_pruned=include_pruned
    )


@router.post(
    "/runs/{run_id}/smolagents/steps",
    response=responses({200: StepsOut}, WRITE_ERRORS),
    summary="Append live smolagents steps (idempotent by index)",
)
def smolagents_steps(request, run_id: RunId, body: SmolStepsIn):
    require_scope(request, "write")
    steps = framework_io.smolagents_steps_append(
        run=run_for(request, run_id), steps=body.steps, start_index=body.start_index
    )
    return {"positions": [s.position for s in steps]}


@router.get(
    "/runs/{run_id}/messages",
    response=responses({200: list[ChatMessageOut]}),
    summary="The run as smolagents write_memory_to_messages()",
)
def run_transcript(request, run_id: RunId, summary_mode: bool = False):
    require_scope(request, "read")
    messages = transcripts.run_messages(run=run_for(request, run_id), summary_mode=summary_mode)
    # Already in the documented shape (built from stored JSON): rendering it straight skips a
    # pydantic pass over thousands of dicts, a third of the time on a 1,000-step run.
    return JsonResponse(messages, safe=False)


@router.get(
    "/contexts/{context_id}/agentscope/state",
    response=responses({200: dict[str, Any]}),
    summary="Export the context as an AgentScope 1.x memory state_dict",
    # A free-form object (its shape depends on `format`), so the example sits on the media type.
    openapi_extra={
        "responses": {
            200: {
                "content": {
                    "application/json": {
                        "example": {
                            "content": [[AGENTSCOPE_MSG_EXAMPLE, []]],
                            "_compressed_summary": "",
                        }
                    }
                }
            }
        }
    },
)
def agentscope_state(request, context_id: ContextId, format: Literal["marks", "legacy"] = "marks"):  # noqa: A002
    require_scope(request, "read")
    return framework_io.agentscope_state_export(
        context=context_for(request, context_id), fmt=format
    )


@router.post(
    "/contexts/{context_id}/agentscope/state",
    response=responses({200: AgentScopeImportOut}, WRITE_ERRORS),
    summary="Import an AgentScope 1.x memory state_dict (either format)",
)
def agentscope_state_import(request, context_id: ContextId, body: StateIn):
    require_scope(request, "write")
    return framework_io.agentscope_state_import(
        context=context_for(request, context_id),
        state=body.state,
        actor=actor_for(request),
        replace=body.replace,
    )


@router.post(
    "/contexts/{context_id}/agentscope/add",
    response=responses({200: AddOut}, WRITE_ERRORS),
    summary="AgentScope add(memories, marks, allow_duplicates)",
)
def agentscope_add(request, context_id: ContextId, body: AddIn):
    require_scope(request, "write")
    added = framework_io.agentscope_add(
        context=context_for(request, context_id),
        msgs=body.msgs,
        marks=body.marks,
        allow_duplicates=body.allow_duplicates,
    )
    return {"added": len(added)}


@router.post(
    "/contexts/{context_id}/agentscope/delete",
    response=responses({200: CountOut}, WRITE_ERRORS),
    summary="AgentScope delete(msg_ids): prunes every live entry with those ids",
)
def agentscope_delete(request, context_id: ContextId, body: DeleteIn):
    require_scope(request, "write")
    n = framework_io.agentscope_delete(
        context=context_for(request, context_id), msg_ids=body.msg_ids, actor=actor_for(request)
    )
    return {"count": n}


@router.post(
    "/contexts/{context_id}/agentscope/delete_by_mark",
    response=responses({200: CountOut}, WRITE_ERRORS),
    summary="AgentScope delete_by_mark(mark): prunes every live entry with any of the marks",
)
def agentscope_delete_by_mark(request, context_id: ContextId, body: DeleteByMarkIn):
    require_scope(request, "write")
    n = framework_io.agentscope_delete_by_mark(
        context=context_for(request, context_id), marks=body.marks, actor=actor_for(request)
    )
    return {"count": n}


@router.post(
    "/contexts/{context_id}/agentscope/update_messages_mark",
    response=responses({200: CountOut}, WRITE_ERRORS),
    summary=(
        "AgentScope update_messages_mark(new_mark, old_mark, msg_ids): add, change or remove a mark"
    ),
)
def agentscope_update_messages_mark(request, context_id: ContextId, body: UpdateMarksIn):
    require_scope(request, "write")
    n = framework_io.agentscope_update_marks(
        context=context_for(request, context_id),
        new_mark=body.new_mark,
        old_mark=body.old_mark,
        msg_ids=body.msg_ids,
        actor=actor_for(request),
    )
    return {"count": n}


@router.post(
    "/contexts/{context_id}/agentscope/clear",
    response=responses({200: CountOut}, WRITE_ERRORS),
    summary="AgentScope clear(): prunes every live message",
)
def agentscope_clear(request, context_id: ContextId):
    require_scope(request, "write")
    return {
        "count": framework_io.agentscope_clear(
            context=context_for(request, context_id), actor=actor_for(request)
        )
    }


@router.put(
    "/contexts/{context_id}/agentscope/summary",
    response=responses({200: SummaryIn}, WRITE_ERRORS),
    summary="AgentScope update_compressed_summary(summary)",
)
def agentscope_summary(request, context_id: ContextId, body: SummaryIn):
    require_scope(request, "write")
    with transaction.atomic():
        framework_io.agentscope_set_summary(
            context=context_for(request, context_id), summary=body.summary
        )
    return {"summary": body.summary}


@router.get(
    "/contexts/{context_id}/agentscope/memory",
    response=responses({200: MemoryOut}),
    summary="Live [msg, marks] entries filtered like get_memory(mark, exclude_mark)",
)
def agentscope_memory(
    request, context_id: ContextId, mark: str | None = None, exclude_mark: str | None = None
):
    require_scope(request, "read")
    context = context_for(request, context_id)
    entries = framework_io.agentscope_entries(context=context, mark=mark, exclude_mark=exclude_mark)
    return {"summary": context.compressed_summary, "content": [[m, marks] for m, marks in entries]}


def _tool_input(request, context_id: int, params: ToolInputQuery) -> dict:
    require_scope(request, "read")
    context = context_for(request, context_id)
    run = run_for(request, params.run_id) if params.run_id else None
    if run is not None and run.context_id != context.pk:
        run = None
        raise framework_io.Invalid(f"run {params.run_id} is not in context {context_id}")
    return transcripts.context_tool_input(context=context, run=run, limit=params.limit)


@router.get(
    "/contexts/{context_id}/tool-input",
    response=responses({200: ToolInputOut}),
    summary="AgentKit ToolInputSchema for the latest user message",
)
def tool_input(request, context_id: ContextId, params: Query[ToolInputQuery]):
    return _tool_input(request, context_id, params)


@router.get(
    "/contexts/{context_id}/tool-input/query",
    # No JSON schema for 200: the answer is text/plain, documented (with an example) below.
    response=responses({200: None}),
    summary="AgentKit standard_query_format text (text/plain)",
    openapi_extra={
        "responses": {
            200: {
                "description": "OK",
                "content": {
                    "text/plain": {
                        "schema": {"type": "string"},
                        "example": "\nChat history: \nHuman: Hi\nAI: Hello! How can I help?"
                        "\nIntermediate tool outputs: get_weather: Sunny in Paris, 22C"
                        "Latest user question: What's the weather in Paris?",
                    }
                },
            }
        }
    },
)
def tool_input_query(request, context_id: ContextId, params: Query[ToolInputQuery]):
    text = agentkit.standard_query_format(_tool_input(request, context_id, params))
    return HttpResponse(text, content_type="text/plain; charset=utf-8")
