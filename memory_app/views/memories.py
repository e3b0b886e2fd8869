"""Long-term memories: list and search per scope, edit, archive/restore, merge, promote, purge;
a memory's history (its versions with diffs), restore a version, undo the last change."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from memory_app.audit import Actor
from memory_app.errors import Conflict, Forbidden, Invalid, NotFound
from memory_app.models import MemoryKind, MemoryRecord, Message, Step
from memory_app.queries.memories import SOURCES, memories_search
from memory_app.queries.memory_history import memory_versions, with_last_versions
from memory_app.roles import require
from memory_app.services import memories as memories_services
from memory_app.services.curation import PURGE_CONFIRMATION
from memory_app.services.memories import (
    memories_merge,
    memory_promote,
    memory_purge,
    memory_set_archived,
)
from memory_app.services.memory_history import memory_restore_version, memory_undo
from memory_app.views.common import (
    bad_request,
    htmx_partial,
    invalid_form,
    page,
    replica_page,
    wants_fragment,
)
from memory_app.views.forms import (
    ArchiveForm,
    MemoryEditForm,
    MemoryListForm,
    MemoryMergeForm,
    MemoryPurgeForm,
    PromoteForm,
    VersionForm,
)

LIST = "memory_app/curate/memories.html"


@require("read_memories")
@require_GET
@replica_page
@htmx_partial("memory-list")
def memory_list(request):
    form = MemoryListForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    if data["id"]:
        records = list(MemoryRecord.objects.filter(pk=data["id"]).select_related(*SOURCES))
    else:
        records = memories_search(
            query=data["q"],
            context_id=data["context"],
            scope=data["scope"],
            archived=data["archived"],
        )
    context = {
        "records": with_last_versions(records),
        "params": form.typed(),
        "kinds": MemoryKind.values,
        "purge_phrase": PURGE_CONFIRMATION,
        "nav_active": "memories",
    }
    return page(request, LIST, context)


def _record_page(request, record, **extra):
    """The memories page holding only `record`; its `memory` partial is the record's card."""
    record = MemoryRecord.objects.select_related(*SOURCES).get(pk=record.pk)
    with_last_versions([record])
    context = {
        "records": [record],
        "r": record,
        "params": {},
        "kinds": MemoryKind.values,
        "purge_phrase": PURGE_CONFIRMATION,
    }
    return page(request, LIST, {**context, **extra})


@require("memories")
@require_http_methods(["GET", "POST"])
@htmx_partial("memory")
def memory_edit(request, memory_id: int):
    record = get_object_or_404(MemoryRecord, pk=memory_id)
    if request.method == "GET":
        return _record_page(request, record, editing=record.pk)
    form = MemoryEditForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            record = memories_services.memory_edit(
                record=record,
                actor=Actor.for_user(request.user),
                content=data["content"],
                keywords=data["keywords"],
                kind=data["kind"] or record.kind,
            )
        except (Invalid, Conflict) as exc:
            form.add_error(None, str(exc))
    if form.errors:
        if not wants_fragment(request):
            return invalid_form(request, form)
        return _record_page(request, record, editing=record.pk, form=form)
    if not wants_fragment(request):
        return redirect(reverse("memories") + f"?id={record.pk}")
    return _record_page(request, record)


@require("memories")
@require_POST
@htmx_partial("memory")
def memory_archive(request, memory_id: int):
    record = get_object_or_404(MemoryRecord, pk=memory_id)
    form = ArchiveForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    record = memory_set_archived(
        record=record, archived=form.cleaned_data["archived"], actor=Actor.for_user(request.user)
    )
    if not wants_fragment(request):
        return redirect(reverse("memories") + f"?id={record.pk}")
    return _record_page(request, record)


@require("memories")
@require_POST
def memory_merge(request):
    form = MemoryMergeForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    try:
        record = memories_merge(
            keep_id=form.cleaned_data["keep"],
            ids=form.cleaned_data["ids"],
            actor=Actor.for_user(request.user),
        )
    except (Invalid, ValueError) as exc:
        return bad_request(request, exc)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    return redirect(reverse("memories") + f"?id={record.pk}")


@require("purge")
@require_POST
@htmx_partial("memory")
def memory_purge_view(request, memory_id: int):
    """Irreversible: asks for the typed phrase of the dashboard's other purge."""
    record = get_object_or_404(MemoryRecord, pk=memory_id)
    form = MemoryPurgeForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    if form.cleaned_data["confirmation"].strip() != PURGE_CONFIRMATION:
        message = f"type {PURGE_CONFIRMATION!r} to confirm the purge: nothing was deleted"
        if not wants_fragment(request):
            return bad_request(request, message)
        response = _record_page(request, record, purge_error=message)
        response.status_code = 400
        return response
    event = memory_purge(record=record, actor=Actor.for_user(request.user))
    if not wants_fragment(request):
        return redirect(reverse("audit-entry", kwargs={"event_id": event.pk}))
    return page(request, f"{LIST}#memory-purged", {"purged": memory_id, "event": event})


def _promote(request, target_id: str, **source):
    form = PromoteForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    try:
        record, created = memory_promote(
            actor=Actor.for_user(request.user), kind=form.cleaned_data["kind"], **source
        )
    except Invalid as exc:
        return bad_request(request, exc)
    if not wants_fragment(request):
        return redirect(reverse("memories") + f"?id={record.pk}")
    context = {"r": record, "created": created, "target_id": target_id}
    return page(request, LIST, context)


@require("memories")
@require_POST
@htmx_partial("promoted")
def promote_message(request, message_id: int):
    message = get_object_or_404(Message.objects.select_related("context"), pk=message_id)
    return _promote(request, f"promote-{message.pk}", message=message)


@require("memories")
@require_POST
@htmx_partial("promoted")
def promote_step(request, step_id: int):
    step = get_object_or_404(Step.objects.select_related("run__context"), pk=step_id)
    return _promote(request, f"promote-s{step.pk}", step=step)


HISTORY = "memory_app/curate/memory_history.html"


@require("read_memories")
@require_GET
@replica_page
def memory_history(request, memory_id: int):
    """Every version of a memory, newest first, with who, when and a diff to the one before."""
    record = get_object_or_404(MemoryRecord.objects.select_related(*SOURCES), pk=memory_id)
    context = {
        "r": with_last_versions([record])[0],
        "versions": memory_versions(record.pk),
        "nav_active": "memories",
    }
    return page(request, HISTORY, context)


@require("memories")
@require_POST
def memory_restore(request, memory_id: int):
    """Make an earlier version current again (a new version, audited)."""
    record = get_object_or_404(MemoryRecord, pk=memory_id)
    form = VersionForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    try:
        memory_restore_version(
            record=record, version=form.cleaned_data["version"], actor=Actor.for_user(request.user)
        )
    except (Invalid, Conflict, Forbidden) as exc:
        return bad_request(request, exc)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    return redirect(reverse("memory-history", args=[record.pk]))


@require("memories")
@require_POST
@htmx_partial("memory")
def memory_undo_view(request, memory_id: int):
    """Undo the memory's last edit or archive, from its card (one click)."""
    record = get_object_or_404(MemoryRecord, pk=memory_id)
    try:
        record = memory_undo(record=record, actor=Actor.for_user(request.user))
    except (Invalid, Conflict, Forbidden) as exc:
        if not wants_fragment(request):
            return bad_request(request, exc)
        response = _record_page(request, record, undo_error=str(exc))
        response.status_code = 400
        return response
    if not wants_fragment(request):
        return redirect(reverse("memories") + f"?id={record.pk}")
    return _record_page(request, record)
