"""Audit log (filter, before/after, undo from an entry) and purge (admin, irreversible)."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from memory_app.audit import Actor
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.models import AuditEvent, Context, Message, Step
from memory_app.roles import require
from memory_app.services import curation
from memory_app.views.common import (
    bad_request,
    htmx_partial,
    invalid_form,
    page,
    query_string,
    replica_page,
    wants_fragment,
)
from memory_app.views.forms import AuditFilterForm, PurgeForm, UndoForm

PAGE = 50


def target_links(event: AuditEvent, limit: int = 20) -> list[tuple[str, str | None]]:
    """(label, url) for each target of an event; url None when the target no longer exists."""
    ids = event.target_ids[:limit]
    links: list[tuple[str, str | None]] = []
    if event.target_type == "message":
        found = dict(Message.objects.filter(pk__in=ids).values_list("pk", "seq"))
        for pk in ids:
            seq = found.get(pk)
            url = (
                (reverse("context", args=[event.context_id]) + f"?pruned=1&seq={seq}#m-{seq}")
                if seq
                else None
            )
            links.append((f"message #{seq}" if seq else f"message {pk} (purged)", url))
    elif event.target_type == "step":
        found = {
            pk: (run, pos)
            for pk, run, pos in Step.objects.filter(pk__in=ids).values_list(
                "pk", "run_id", "position"
            )
        }
        for pk in ids:
            if pk in found:
                run, pos = found[pk]
                links.append((f"run {run} step {pos}", reverse("run-step", args=[run, pos])))
            else:
                links.append((f"step {pk} (purged)", None))
    elif event.target_type in ("memory", "memoryrecord"):
        links = [(f"memory {pk}", reverse("memories") + f"?id={pk}") for pk in ids]
    elif event.target_type == "context":
        links = [(f"context {pk}", reverse("context", args=[pk])) for pk in ids]
    elif event.target_type == "apikey":
        links = [(f"key {pk}", reverse("keys")) for pk in ids]
    else:
        links = [(f"{event.target_type} {pk}", None) for pk in ids]
    return links


@require("audit")
@require_GET
@replica_page
@htmx_partial("audit-list")
def audit_log(request):
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    params = form.typed(AuditFilterForm.FILTERS)
    qs = AuditEvent.objects.select_related("context")
    if data["actor"]:
        qs = qs.filter(actor__icontains=data["actor"])
    if data["action"]:
        qs = qs.filter(action=data["action"])
    if data["target"]:
        qs = qs.filter(target_type=data["target"])
    if data["target_id"]:
        qs = qs.filter(target_ids__contains=[data["target_id"]])
    if data["context"]:
        qs = qs.filter(context_id=data["context"])
    if data["since"]:
        qs = qs.filter(at__gte=data["since"])
    if data["until"]:
        qs = qs.filter(at__lt=data["until"])
    if data["before"]:
        qs = qs.filter(id__lt=data["before"])
    rows = list(qs.order_by("-id")[: PAGE + 1])
    events = rows[:PAGE]
    for e in events:
        e.links = target_links(e)
        e.undoable = curation.audit_undoable(e)
    older = None
    if len(rows) > PAGE:
        older = reverse("audit") + "?" + query_string(**params, before=events[-1].pk)
    context = {
        "events": events,
        "params": params,
        "older_url": older,
        "nav_active": "audit",
        "actions": [
            "edit",
            "prune",
            "bulk_prune",
            "restore",
            "undo",
            "purge",
            "key_create",
            "key_revoke",
            "record",
            "archive",
            "memory_merge",
            "memory_promote",
            "user_create",
            "user_role",
            "user_deactivate",
            "user_activate",
            "user_password",
        ],
        "targets": ["message", "step", "memoryrecord", "context", "apikey", "user"],
    }
    return page(request, "memory_app/curate/audit.html", context)


@require("audit")
@require_GET
@replica_page
def audit_entry(request, event_id: int):
    event = get_object_or_404(
        AuditEvent.objects.select_related("context", "undone_by"), pk=event_id
    )
    event.links = target_links(event, limit=500)
    event.undoable = curation.audit_undoable(event)
    return page(request, "memory_app/curate/audit_entry.html", {"e": event, "nav_active": "audit"})


@require("curate")
@require_POST
@htmx_partial("undo-result")
def audit_undo_view(request, event_id: int):
    """Undo one audit event. Under htmx, the undo form is swapped for a notice and the page's
    lists refresh themselves (`HX-Trigger: curation-changed`)."""
    event = get_object_or_404(AuditEvent, pk=event_id)
    form = UndoForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    error = None
    try:
        curation.audit_undo(event=event, actor=Actor.for_user(request.user))
    except (Conflict, Invalid, NotFound) as exc:
        error = str(exc)
    event.refresh_from_db()
    if not wants_fragment(request):
        if error:
            return bad_request(request, error)
        nxt = form.cleaned_data["next"]
        if nxt and url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}):
            return redirect(nxt)
        return redirect("audit-entry", event_id=event.pk)
    response = page(
        request,
        "memory_app/curate/audit_parts.html",
        {"e": event, "error": error},
        status=409 if error else 200,
    )
    if not error:
        response["HX-Trigger"] = "curation-changed"
    return response


# --- purge -------------------------------------------------------------------------------------


@require("purge")
@require_http_methods(["GET", "POST"])
@htmx_partial("purge-panel")
def purge(request):
    form = PurgeForm(request.POST if request.method == "POST" else request.GET)
    typed = form.typed()
    state = {
        "phrase": curation.PURGE_CONFIRMATION,
        "older_than": typed["older_than"],
        "nav_active": "purge",
        "context_id": typed["context"],
    }
    if not form.is_valid():
        return invalid_form(request, form)
    older_than = form.cleaned_data["older_than"]
    context_id = form.cleaned_data["context"]
    context = None
    if context_id:
        context = Context.objects.filter(pk=context_id).first()
        if context is None:
            raise Http404(f"context {context_id} not found")
    if older_than is not None:
        state["preview"] = curation.purge_preview(older_than=older_than, context=context)
    if request.method == "POST":
        if older_than is None:
            return bad_request(request, "choose the date: items pruned before it are purged")
        try:
            state["done"] = curation.pruned_purge(
                older_than=older_than,
                confirmation=form.cleaned_data["confirmation"],
                actor=Actor.for_user(request.user),
                context=context,
            )
        except Invalid as exc:
            form.add_error(None, str(exc))
            state["form"] = form
            return page(request, "memory_app/curate/purge.html", state, status=400)
        state["preview"] = curation.purge_preview(older_than=older_than, context=context)
    return page(request, "memory_app/curate/purge.html", state)
