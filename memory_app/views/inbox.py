"""The memory review inbox: what agents propose, with provenance and look-alikes among the live
memories of the same scope; approve, edit then approve, merge into a live memory, reject (one or
many at once). Every decision needs the `approve` capability (no API key holds it)."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from memory_app.audit import Actor
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.models import MemoryKind, MemoryRecord, MemoryStatus
from memory_app.queries.memory_review import memories_inbox
from memory_app.roles import require
from memory_app.services.memory_review import (
    proposal_edit_approve,
    proposal_merge,
    proposals_approve,
    proposals_reject,
)
from memory_app.views.common import bad_request, invalid_form, page
from memory_app.views.forms import InboxDecideForm, InboxMergeForm, MemoryEditForm

INBOX = "memory_app/curate/inbox.html"
# What the last decision did, by the `done` parameter of the redirect back to the inbox.
DONE = {
    "approve": "Approved",
    "reject": "Rejected",
    "edit": "Edited and approved",
    "merge": "Merged",
}


def _back(done: str, count: int):
    return redirect(reverse("memory-inbox") + f"?done={done}&n={count}")


@require("approve")
@require_GET
def inbox(request):
    done = DONE.get(request.GET.get("done", ""))
    count = request.GET.get("n", "")
    context = {
        "proposals": memories_inbox(),
        "kinds": MemoryKind.values,
        "done": f"{done} {int(count)} memor{'y' if count == '1' else 'ies'}."
        if done and count.isdigit()
        else "",
        "nav_active": "inbox",
    }
    return page(request, INBOX, context)


@require("approve")
@require_POST
def inbox_decide(request):
    """Approve or reject the selected proposals."""
    form = InboxDecideForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    decide = proposals_approve if data["action"] == "approve" else proposals_reject
    try:
        records = decide(data["ids"], actor=Actor.for_user(request.user), note=data["note"])
    except Invalid as exc:
        return bad_request(request, exc)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    return _back(data["action"], len(records))


@require("approve")
@require_POST
def inbox_edit(request, memory_id: int):
    """Edit a proposal, then approve it."""
    record = get_object_or_404(MemoryRecord, pk=memory_id, status=MemoryStatus.PROPOSED)
    form = MemoryEditForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    try:
        proposal_edit_approve(
            record,
            actor=Actor.for_user(request.user),
            content=data["content"],
            keywords=data["keywords"],
            kind=data["kind"] or record.kind,
        )
    except (Invalid, Conflict) as exc:
        return bad_request(request, exc)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    return _back("edit", 1)


@require("approve")
@require_POST
def inbox_merge(request):
    """Merge a proposal into a live memory of its scope."""
    form = InboxMergeForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    try:
        proposal_merge(
            proposal_id=form.cleaned_data["proposal"],
            into_id=form.cleaned_data["into"],
            actor=Actor.for_user(request.user),
        )
    except Invalid as exc:
        return bad_request(request, exc)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    return _back("merge", 1)
