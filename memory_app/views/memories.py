"""Long-term memories: list and search per scope, edit, archive/restore, merge, promote."""

from __future__ import annotations

import json

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from memory_app import dashboard_queries as dq
from memory_app import memories
from memory_app.audit import Actor
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.models import MemoryKind, MemoryRecord, Message, Step
from memory_app.roles import require
from memory_app.views.common import bad_request, render_page, wants_fragment


def _scope(raw: str) -> dict | None:
    raw = (raw or "").strip()
    if not raw:
        return None
    if raw.startswith("{"):
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise dq.BadQuery(
                f'the scope must be JSON like {{"user": "ada"}} or key=value: {exc}'
            ) from exc
        if not isinstance(value, dict):
            raise dq.BadQuery("the scope must be a JSON object")
        return value
    return dict(dq.parse_key_chips(raw.split()))


@require("read_memories")
@require_GET
def memory_list(request):
    g = request.GET
    params = {
        k: g.get(k, "").replace("\x00", "").strip()
        for k in ("q", "context", "scope", "archived", "id")
    }
    try:
        context_id = dq.parse_int(params["context"], name="context", minimum=1)
        scope = _scope(params["scope"])
        one = dq.parse_int(params["id"], name="id", minimum=1)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    if one:
        records = list(
            MemoryRecord.objects.filter(pk=one).select_related(
                "context", "source_message", "source_step"
            )
        )
    else:
        records = memories.memories_search(
            query=params["q"],
            context_id=context_id,
            scope=scope,
            archived=params["archived"] == "1",
        )
    page = {
        "records": records,
        "params": params,
        "kinds": MemoryKind.values,
        "nav_active": "memories",
    }
    return render_page(request, "memory_app/curate/memories.html", page, fragment="memory-list")


def _record_fragment(request, record, **extra):
    record = MemoryRecord.objects.select_related("context", "source_message", "source_step").get(
        pk=record.pk
    )
    return render_page(
        request,
        "memory_app/curate/memories.html#memory",
        {"r": record, "kinds": MemoryKind.values, **extra},
    )


@require("memories")
@require_http_methods(["GET", "POST"])
def memory_edit(request, memory_id: int):
    record = get_object_or_404(MemoryRecord, pk=memory_id)
    if request.method == "GET":
        if not wants_fragment(request):
            return render_page(
                request,
                "memory_app/curate/memories.html",
                {
                    "records": [record],
                    "editing": record.pk,
                    "params": {},
                    "kinds": MemoryKind.values,
                },
            )
        return _record_fragment(request, record, editing=record.pk)
    try:
        record = memories.memory_edit(
            record=record,
            actor=Actor.for_user(request.user),
            content=request.POST.get("content", ""),
            keywords=[k.strip() for k in request.POST.get("keywords", "").split(",") if k.strip()],
            kind=request.POST.get("kind", record.kind),
        )
    except (Invalid, Conflict) as exc:
        if not wants_fragment(request):
            return bad_request(request, dq.BadQuery(str(exc)))
        return _record_fragment(request, record, editing=record.pk, error=str(exc))
    if not wants_fragment(request):
        return redirect(reverse("memories") + f"?id={record.pk}")
    return _record_fragment(request, record)


@require("memories")
@require_POST
def memory_archive(request, memory_id: int):
    record = get_object_or_404(MemoryRecord, pk=memory_id)
    record = memories.memory_set_archived(
        record=record,
        archived=request.POST.get("archived", "1") == "1",
        actor=Actor.for_user(request.user),
    )
    if not wants_fragment(request):
        return redirect(reverse("memories") + f"?id={record.pk}")
    return _record_fragment(request, record)


@require("memories")
@require_POST
def memory_merge(request):
    try:
        ids = [int(v) for v in request.POST.getlist("ids")]
        keep = dq.parse_int(request.POST.get("keep"), name="keep", minimum=1) or (
            min(ids) if ids else None
        )
        if keep is None:
            raise dq.BadQuery("select the memories to merge")
        record = memories.memories_merge(keep_id=keep, ids=ids, actor=Actor.for_user(request.user))
    except (ValueError, dq.BadQuery, Invalid) as exc:
        return bad_request(request, dq.BadQuery(str(exc)))
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    return redirect(reverse("memories") + f"?id={record.pk}")


def _promoted(request, record, created: bool, target_id: str):
    if not wants_fragment(request):
        return redirect(reverse("memories") + f"?id={record.pk}")
    return render_page(
        request,
        "memory_app/curate/memories.html#promoted",
        {"r": record, "created": created, "target_id": target_id},
    )


@require("memories")
@require_POST
def promote_message(request, message_id: int):
    message = get_object_or_404(Message.objects.select_related("context"), pk=message_id)
    try:
        record, created = memories.memory_promote(
            actor=Actor.for_user(request.user),
            message=message,
            kind=request.POST.get("kind", "fact"),
        )
    except Invalid as exc:
        return bad_request(request, dq.BadQuery(str(exc)))
    return _promoted(request, record, created, f"promote-{message.pk}")


@require("memories")
@require_POST
def promote_step(request, step_id: int):
    step = get_object_or_404(Step.objects.select_related("run__context"), pk=step_id)
    try:
        record, created = memories.memory_promote(
            actor=Actor.for_user(request.user), step=step, kind=request.POST.get("kind", "fact")
        )
    except Invalid as exc:
        return bad_request(request, dq.BadQuery(str(exc)))
    return _promoted(request, record, created, f"promote-s{step.pk}")
