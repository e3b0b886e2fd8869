"""Framework memory in and out of the database: smolagents runs, AgentScope working memory.

The mappings themselves are pure (`memory_app.interop.*`); this module applies them through the
write path (`memory_app.services`), so client ids, seq allocation, token counts and audit behave
exactly as for any other write. Every import is idempotent: the same payload twice writes
nothing the second time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.db.models import Q

from memory_app.audit import Actor
from memory_app.errors import Invalid
from memory_app.interop import agentscope as as_map
from memory_app.interop import smolagents as smol
from memory_app.models import Context, Message, Run, RunStatus, Step, ToolCall
from memory_app.new_message import NewMessage
from memory_app.services.curation import messages_set_pruned
from memory_app.services.messages import MAX_BATCH, messages_append, messages_retag
from memory_app.services.runs import STEP_FIELDS, run_create, run_finish, steps_append

STEP_CHUNK = 200


# --- smolagents -------------------------------------------------------------------------------


def _map_steps(steps: list[dict], *, start: int, prefix: str | None) -> list[dict]:
    try:
        return [
            smol.step_to_logbook(s, client_id=f"{prefix}:{i}" if prefix else None)
            for i, s in enumerate(steps, start=start)
        ]
    except smol.StepFormatError as exc:
        raise Invalid(str(exc)) from exc


def smolagents_run_import(
    *,
    context: Context,
    steps: list[dict[str, Any]],
    system_prompt: str = "",
    client_id: str | None = None,
    agent_name: str = "",
    task: str | None = None,
    status: str | None = None,
    final_answer: Any = None,
    metadata: dict | None = None,
) -> tuple[Run, bool]:
    """Store a finished run from `agent.memory.get_full_steps()` (+ system prompt), all or nothing.

    The run keeps the agent's own clock: it started at its first step's start time and finished
    at its last step's end time (the import time only when the steps carry no timing)."""
    if not isinstance(steps, list):
        raise Invalid("steps must be a list")
    _map_steps(steps, start=1, prefix=None)  # validates every step before anything is written
    summary = smol.run_summary(steps)
    start, end = smol.run_timing(steps)
    started_at, finished_at = (
        datetime.fromtimestamp(t, tz=UTC) if t is not None else None for t in (start, end)
    )
    with transaction.atomic():
        run, created = run_create(
            context=context,
            client_id=client_id,
            task=task if task is not None else summary["task"],
            system_prompt=system_prompt or "",
            agent_name=agent_name,
            framework=smol.FRAMEWORK,
            metadata=metadata,
            started_at=started_at,
        )
        prefix = client_id or (f"import-{run.pk}" if created else None)
        items = _map_steps(steps, start=1, prefix=prefix)
        if not created and not client_id:
            raise Invalid("re-importing needs the run's client_id")
        for i in range(0, len(items), STEP_CHUNK):
            steps_append(run=run, items=items[i : i + STEP_CHUNK])
        run.refresh_from_db()
        if run.status == RunStatus.RUNNING:
            run = run_finish(
                run=run,
                status=status or summary["status"],
                final_answer=final_answer if final_answer is not None else summary["final_answer"],
                finished_at=finished_at,
            )
    return run, created


def smolagents_steps_append(
    *, run: Run, steps: list[dict[str, Any]], start_index: int
) -> list[Step]:
    """Append live steps (the callback's), keyed `<run client id>:<index>` so retries are no-ops."""
    if start_index < 1:
        raise Invalid("start_index counts from 1")
    prefix = run.client_id or f"run-{run.pk}"
    result = steps_append(run=run, items=_map_steps(steps, start=start_index, prefix=prefix))
    return result.steps


def smolagents_run_export(*, run: Run, include_pruned: bool = False) -> dict[str, Any]:
    """The run as `{system_prompt, task, status, final_answer, steps: get_full_steps()}`."""
    qs = Step.objects.filter(context_id=run.context_id, run=run).order_by("position")
    if not include_pruned:
        qs = qs.filter(pruned_at__isnull=True)
    steps = list(qs)
    calls: dict[int, list[dict]] = {}
    for tc in (
        ToolCall.objects.filter(context_id=run.context_id, step__in=[s.pk for s in steps])
        .order_by("step_id", "position")
        .values()
    ):
        calls.setdefault(tc["step_id"], []).append(tc)
    out = []
    for s in steps:
        columns = {f: getattr(s, f) for f in STEP_FIELDS}
        out.append(
            smol.step_from_stored(
                payload=s.payload, columns=columns, tool_calls=calls.get(s.pk, [])
            )
        )
    return {
        "system_prompt": run.system_prompt,
        "task": run.task,
        "status": run.status,
        "final_answer": run.final_answer,
        "steps": out,
    }


# --- AgentScope -------------------------------------------------------------------------------


def _live(context: Context):
    return Message.objects.filter(context=context, pruned_at__isnull=True).order_by("seq")


def agentscope_entries(
    *, context: Context, mark: str | None = None, exclude_mark: str | None = None
) -> list[tuple[dict, list[str]]]:
    qs = _live(context)
    if mark is not None:
        qs = qs.filter(tags__contains=[mark])
    if exclude_mark is not None:
        qs = qs.exclude(tags__contains=[exclude_mark])
    return [
        (
            as_map.message_to_msg(
                client_id=m.client_id,
                pk=m.pk,
                role=m.role,
                name=m.name,
                text=m.text,
                content=m.content,
                metadata=m.metadata,
                source_timestamp=m.source_timestamp,
                order=m.key_order,
            ),
            list(m.tags),
        )
        for m in qs.iterator(chunk_size=2000)
    ]


def agentscope_state_export(*, context: Context, fmt: str = "marks") -> dict[str, Any]:
    try:
        return as_map.build_state_dict(
            agentscope_entries(context=context), summary=context.compressed_summary, fmt=fmt
        )
    except as_map.StateFormatError as exc:
        raise Invalid(str(exc)) from exc


def _copies(msg_ids: list[str]) -> Q:
    """Client ids of every stored copy of these Msg ids (`<escaped id>` and
    `<escaped id>#dup<n>`)."""
    match = Q(pk__in=[])
    for mid in set(msg_ids):
        escaped = as_map.escape_id(mid)
        match |= Q(client_id=escaped) | Q(client_id__startswith=f"{escaped}{as_map.DUP_SEPARATOR}")
    return match


def _stored_copies(qs, msg_ids: list[str]) -> list[tuple[int, str, int]]:
    """(pk, Msg id, copy number) of the rows of `qs` that are copies of `msg_ids`."""
    wanted = set(msg_ids)
    out = []
    for pk, cid in qs.filter(_copies(msg_ids)).values_list("pk", "client_id"):
        mid, n = as_map.split_client_id(cid)
        if mid in wanted:
            out.append((pk, mid, n))
    return out


def _free_client_ids(context: Context, msg_ids: list[str]) -> dict[str, int]:
    """For each id, the next free copy number (0 when the id itself is free)."""
    if not msg_ids:
        return {}
    taken: dict[str, int] = {}
    for _, mid, n in _stored_copies(Message.objects.filter(context=context), msg_ids):
        taken[mid] = max(taken.get(mid, -1), n)
    return {mid: taken[mid] + 1 if mid in taken else 0 for mid in msg_ids}


def _items_for(context: Context, entries: list[tuple[dict, list[str]]]) -> list[NewMessage]:
    """Message items for new entries, each copy under the next free client id."""
    next_free = _free_client_ids(context, [m["id"] for m, _ in entries])
    items = []
    for msg, marks in entries:
        n = next_free[msg["id"]]
        next_free[msg["id"]] = n + 1
        items.append(
            as_map.msg_to_message(msg, marks, client_id=as_map.dup_client_id(msg["id"], n))
        )
    return items


def agentscope_add(
    *,
    context: Context,
    msgs: list[dict],
    marks: list[str] | None = None,
    allow_duplicates: bool = False,
) -> list[Message]:
    """AgentScope `MemoryBase.add`: skip ids already in the (live) memory unless duplicates
    allowed."""
    try:
        for m in msgs:
            as_map.validate_msg(m)
        with transaction.atomic():
            Context.objects.select_for_update().filter(pk=context.pk).first()
            if not allow_duplicates:
                live_ids = {
                    mid for _, mid, _ in _stored_copies(_live(context), [m["id"] for m in msgs])
                }
                msgs = [m for m in msgs if m["id"] not in live_ids]
            items = _items_for(context, [(m, marks) for m in msgs])
            return messages_append(context=context, items=items).messages if items else []
    except as_map.StateFormatError as exc:
        raise Invalid(str(exc)) from exc


def agentscope_delete(*, context: Context, msg_ids: list[str], actor: Actor) -> int:
    """AgentScope `delete(msg_ids)`: every live entry with those ids; here a (restorable) prune."""
    ids = [pk for pk, _, _ in _stored_copies(_live(context), list(msg_ids))]
    if not ids:
        return 0
    changed, _ = messages_set_pruned(
        context=context, ids=ids, pruned=True, actor=actor, note="agentscope delete"
    )
    return len(changed)


def agentscope_delete_by_mark(*, context: Context, marks: list[str], actor: Actor) -> int:
    """AgentScope `delete_by_mark(mark)`: every live entry carrying any of the marks (pruned)."""
    if not marks:
        return 0
    ids = list(_live(context).filter(tags__overlap=list(marks)).values_list("pk", flat=True))
    if not ids:
        return 0
    changed, _ = messages_set_pruned(
        context=context, ids=ids, pruned=True, actor=actor, note="agentscope delete_by_mark"
    )
    return len(changed)


def agentscope_update_marks(
    *,
    context: Context,
    new_mark: str | None,
    old_mark: str | None = None,
    msg_ids: list[str] | None = None,
    actor: Actor,
) -> int:
    """AgentScope `update_messages_mark(new_mark, old_mark, msg_ids)`, counted as InMemoryMemory
    counts: a message counts when `new_mark` is added to it, or (new_mark None) when `old_mark`
    is removed from it."""
    qs = _live(context)
    if msg_ids is not None:
        qs = qs.filter(pk__in=[pk for pk, _, _ in _stored_copies(qs, list(msg_ids))])
    if old_mark is not None:
        qs = qs.filter(tags__contains=[old_mark])
    elif new_mark is None:
        return 0  # nothing to remove, nothing to add
    tags_by_id: dict[int, list[str]] = {}
    count = 0
    for pk, tags in qs.order_by("seq").values_list("pk", "tags"):
        tags = list(tags)
        if new_mark is None:
            tags.remove(old_mark)
            count += 1
        else:
            if old_mark is not None:
                tags.remove(old_mark)
            if new_mark not in tags:
                tags.append(new_mark)
                count += 1
        tags_by_id[pk] = tags
    messages_retag(
        context=context, tags_by_id=tags_by_id, actor=actor, note="agentscope update_messages_mark"
    )
    return count


def agentscope_clear(*, context: Context, actor: Actor) -> int:
    ids = list(_live(context).values_list("pk", flat=True))
    if not ids:
        return 0
    changed, _ = messages_set_pruned(
        context=context, ids=ids, pruned=True, actor=actor, note="agentscope clear"
    )
    return len(changed)


def agentscope_set_summary(*, context: Context, summary: str) -> None:
    Context.objects.filter(pk=context.pk).update(compressed_summary=summary)
    context.compressed_summary = summary


def agentscope_state_import(
    *, context: Context, state: Any, actor: Actor, replace: bool = False
) -> dict[str, int]:
    """Import a 1.x memory state dict (either format) into the context's messages.

    Default: append the entries not yet stored (idempotent: the same state twice writes nothing).
    `replace=True` is `load_state_dict`: afterwards the live memory is exactly the state's; live
    messages that match the state's leading entries are kept, the rest pruned (restorable).
    """
    try:
        entries, summary = as_map.parse_state_dict(state)
        items = as_map.entries_to_messages(entries)
    except as_map.StateFormatError as exc:
        raise Invalid(str(exc)) from exc
    pruned = 0
    with transaction.atomic():
        Context.objects.select_for_update().filter(pk=context.pk).first()
        if replace:
            live = list(_live(context))
            keep = 0
            for row, (msg, marks) in zip(live, entries, strict=False):
                stored = as_map.message_to_msg(
                    client_id=row.client_id,
                    pk=row.pk,
                    role=row.role,
                    name=row.name,
                    text=row.text,
                    content=row.content,
                    metadata=row.metadata,
                    source_timestamp=row.source_timestamp,
                    order=row.key_order,
                )
                if stored != msg or list(row.tags) != list(marks):
                    break
                keep += 1
            drop = [r.pk for r in live[keep:]]
            if drop:
                changed, _ = messages_set_pruned(
                    context=context,
                    ids=drop,
                    pruned=True,
                    actor=actor,
                    note="agentscope load_state_dict",
                )
                pruned = len(changed)
            try:
                items = _items_for(context, entries[keep:])
            except as_map.StateFormatError as exc:
                raise Invalid(str(exc)) from exc
        created = 0
        for i in range(0, len(items), MAX_BATCH):
            result = messages_append(context=context, items=items[i : i + MAX_BATCH])
            created += sum(result.created)
        if summary is not None or replace:
            agentscope_set_summary(context=context, summary=summary or "")
    return {"created": created, "pruned": pruned}
