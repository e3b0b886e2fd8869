"""Audit log (filter, before/after, undo from an entry) and purge (admin, irreversible)."""

from __future__ import annotations

from datetime import datetime

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from memory_app import dashboard_queries as dq
from memory_app.audit import Actor
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.models import AuditEvent, Context, Message, Step
from memory_app.roles import require
from memory_app.services import curation
from memory_app.views.common import bad_request, query_string, render_page, wants_fragment

PAGE = 50


def _time(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise dq.BadQuery(f"{name} must be a date and time like 2025-01-31T14:00") from exc
    return timezone.make_aware(parsed) if timezone.is_naive(parsed) else parsed


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
def audit_log(request):
    qs = AuditEvent.objects.select_related("context")
    g = request.GET
    params = {
        k: g.get(k, "").replace("\x00", "").strip()
        for k in ("actor", "action", "target", "target_id", "context", "since", "until")
    }
    try:
        if params["actor"]:
            qs = qs.filter(actor__icontains=params["actor"])
        if params["action"]:
            qs = qs.filter(action=params["action"])
        if params["target"]:
            qs = qs.filter(target_type=params["target"])
        if target_id := dq.parse_int(params["target_id"], name="target id", minimum=1):
            qs = qs.filter(target_ids__contains=[target_id])
        if context_id := dq.parse_int(params["context"], name="context", minimum=1):
            qs = qs.filter(context_id=context_id)
        if since := _time(params["since"], "since"):
            qs = qs.filter(at__gte=since)
        if until := _time(params["until"], "until"):
            qs = qs.filter(at__lt=until)
        before = dq.parse_int(g.get("before"), name="before", minimum=1)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    if before:
        qs = qs.filter(id__lt=before)
    rows = list(qs.order_by("-id")[: PAGE + 1])
    events = rows[:PAGE]
    for e in events:
        e.links = target_links(e)
        e.undoable = curation.audit_undoable(e)
    older = None
    if len(rows) > PAGE:
        older = reverse("audit") + "?" + query_string(**params, before=events[-1].pk)
    page = {
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
        ],
        "targets": ["message", "step", "memoryrecord", "context", "apikey"],
    }
    return render_page(request, "memory_app/curate/audit.html", page, fragment="audit-list")


@require("audit")
def audit_entry(request, event_id: int):
    event = get_object_or_404(
        AuditEvent.objects.select_related("context", "undone_by"), pk=event_id
    )
    event.links = target_links(event, limit=500)
    event.undoable = curation.audit_undoable(event)
    return render_page(
        request, "memory_app/curate/audit_entry.html", {"e": event, "nav_active": "audit"}
    )


@require("curate")
@require_POST
def audit_undo_view(request, event_id: int):
    """Undo one audit event. Under htmx, the undo form is swapped for a notice and the page's
    lists refresh themselves (`HX-Trigger: curation-changed`)."""
    event = get_object_or_404(AuditEvent, pk=event_id)
    error = None
    try:
        curation.audit_undo(event=event, actor=Actor.for_user(request.user))
    except (Conflict, Invalid, NotFound) as exc:
        error = str(exc)
    event.refresh_from_db()
    if not wants_fragment(request):
        if error:
            return bad_request(request, dq.BadQuery(error))
        nxt = request.POST.get("next", "")
        if nxt and url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}):
            return redirect(nxt)
        return redirect("audit-entry", event_id=event.pk)
    response = render_page(
        request,
        "memory_app/curate/audit_parts.html#undo-result",
        {"e": event, "error": error},
        status=409 if error else 200,
    )
    if not error:
        response["HX-Trigger"] = "curation-changed"
    return response


# --- purge -------------------------------------------------------------------------------------


@require("purge")
@require_http_methods(["GET", "POST"])
def purge(request):
    data = request.POST if request.method == "POST" else request.GET
    page = {
        "phrase": curation.PURGE_CONFIRMATION,
        "older_than": data.get("older_than", ""),
        "nav_active": "purge",
        "context_id": data.get("context", ""),
    }
    try:
        older_than = _time(page["older_than"], "older than")
        context_id = dq.parse_int(page["context_id"], name="context", minimum=1)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    context = None
    if context_id:
        context = Context.objects.filter(pk=context_id).first()
        if context is None:
            raise Http404(f"context {context_id} not found")
    if older_than is not None:
        page["preview"] = curation.purge_preview(older_than=older_than, context=context)
    if request.method == "POST":
        if older_than is None:
            return bad_request(
                request, dq.BadQuery("choose the date: items pruned before it are purged")
            )
        try:
            page["done"] = curation.pruned_purge(
                older_than=older_than,
                confirmation=request.POST.get("confirmation", ""),
                actor=Actor.for_user(request.user),
                context=context,
            )
        except Invalid as exc:
            page["error"] = str(exc)
            return render_page(
                request, "memory_app/curate/purge.html", page, fragment="purge-panel", status=400
            )
        page["preview"] = curation.purge_preview(older_than=older_than, context=context)
    return render_page(request, "memory_app/curate/purge.html", page, fragment="purge-panel")
