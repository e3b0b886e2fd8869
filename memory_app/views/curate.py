"""Curate a context's chat history and a run's logbook: select, prune/restore, edit, bulk prune.

Every POST works as a plain form (redirect back, Post/Redirect/Get) and under htmx (the
fragment with a stable id comes back and swaps outerHTML). Undo is an audit event reversed
(`views.audit.audit_undo_view`), so it stays available from the audit log long after the notice.
"""

from __future__ import annotations

from datetime import datetime

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from memory_app import dashboard_queries as dq
from memory_app.audit import Actor
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.models import AuditEvent, Context, Message, MessageRole, Run, Step
from memory_app.rendering import content_blocks
from memory_app.roles import require
from memory_app.services import curation
from memory_app.services.curation import PruneFilter, messages_set_pruned, steps_set_pruned
from memory_app.services.messages import message_edit
from memory_app.views.common import bad_request, query_string, render_page, wants_fragment

PAGE = 50
STEP_PAGE = 100


def _ids(request) -> list[int]:
    try:
        return [int(v) for v in request.POST.getlist("ids")]
    except ValueError as exc:
        raise dq.BadQuery("ids must be whole numbers") from exc


def _recent_undoable(context: Context, limit: int = 5) -> list[AuditEvent]:
    """Changes here that Undo still applies to. An undone change and the event that undid it
    cancel out, so neither is offered (redoing stays possible from the audit log)."""
    undos = AuditEvent.objects.filter(context=context, undone_by__isnull=False).values("undone_by")
    events = (
        AuditEvent.objects.filter(
            context=context,
            undone_by__isnull=True,
            action__in=["prune", "bulk_prune", "restore", "edit"],
            target_type__in=["message", "step"],
        )
        .exclude(pk__in=undos)
        .order_by("-id")[:limit]
    )
    return list(events)


# --- chat history ----------------------------------------------------------------------------


def _history_state(request, context: Context) -> dict:
    view = "pruned" if request.GET.get("view") == "pruned" else "live"
    before = dq.parse_int(request.GET.get("before"), name="before", minimum=1)
    qs = Message.objects.filter(context=context)
    qs = qs.filter(pruned_at__isnull=view == "live")
    if before is not None:
        qs = qs.filter(seq__lt=before)
    rows = list(qs.order_by("-seq")[: PAGE + 1])
    messages = list(reversed(rows[:PAGE]))
    base = reverse("curate-history", args=[context.pk])
    here = query_string(view=view if view == "pruned" else "", before=before)
    earlier = (
        query_string(view=view if view == "pruned" else "", before=messages[0].seq)
        if len(rows) > PAGE
        else ""
    )
    return {
        "ctx": context,
        "view": view,
        "messages": messages,
        "list_url": f"{base}?{here}" if here else base,
        "earlier_url": f"{base}?{earlier}" if earlier else None,
        "latest_url": base + ("?view=pruned" if view == "pruned" else "") if before else None,
        "recent": _recent_undoable(context),
    }


@require("curate")
def curate_history(request, context_id: int):
    context = get_object_or_404(Context, pk=context_id)
    try:
        page = _history_state(request, context)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    done = request.GET.get("done")
    if done and done.isdigit():
        page["done"] = AuditEvent.objects.filter(pk=int(done), context=context).first()
    target = request.htmx.target if request.htmx else None
    fragment = target if target in ("curate-list", "recent-changes") else "curate-panel"
    return render_page(
        request,
        "memory_app/curate/history.html",
        # Refreshed after an undo: keep the list open where the operator was working.
        {**page, "nav_active": "contexts", "recent_open": target == "recent-changes"},
        fragment=fragment,
    )


@require("curate")
@require_POST
def curate_set_pruned(request, context_id: int):
    """Prune or restore the selected messages; one audit event lists them (undo reverses it)."""
    context = get_object_or_404(Context, pk=context_id)
    pruned = request.POST.get("pruned", "1") == "1"
    try:
        ids = _ids(request)
        if not ids:
            raise dq.BadQuery("select at least one message")
        _, event = messages_set_pruned(
            context=context, ids=ids, pruned=pruned, actor=Actor.for_user(request.user)
        )
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    view = "pruned" if request.POST.get("view") == "pruned" else ""
    if not wants_fragment(request):
        qs = query_string(view=view, done=event.pk if event else "")
        return redirect(reverse("curate-history", args=[context.pk]) + (f"?{qs}" if qs else ""))
    request.GET = request.GET.copy()
    request.GET["view"] = view
    page = _history_state(request, context)
    page["done"] = event
    return render_page(request, "memory_app/curate/history.html", page, fragment="curate-panel")


@require("curate")
@require_http_methods(["GET", "POST"])
def message_edit_view(request, context_id: int, message_id: int):
    """GET: the row as an edit form; POST: save text and tags (previous version in the audit)."""
    context = get_object_or_404(Context, pk=context_id)
    message = get_object_or_404(Message, pk=message_id, context=context)
    page = {"ctx": context, "m": message, "editing": True}
    if request.method == "POST":
        text = request.POST.get("text", "")
        tags = [t.strip() for t in request.POST.get("tags", "").split(",") if t.strip()]
        if any(len(t) > 200 for t in tags):
            return bad_request(request, dq.BadQuery("a tag is longer than 200 characters"))
        if "\x00" in text or any("\x00" in t for t in tags):
            # PostgreSQL text cannot hold NUL: say so instead of failing in the database.
            return bad_request(request, dq.BadQuery("the text contains a NUL character"))
        if not text.strip() and not content_blocks(message.content):
            # Blank text would leave an empty message in every transcript (unless it carries a
            # tool call or result): pruning is the way to take one out, and it stays restorable.
            error = "the text cannot be empty: to take the message out, prune it instead"
            if not wants_fragment(request):
                return bad_request(request, dq.BadQuery(error))
            page.update(error=error, draft={"text": text, "tags": ", ".join(tags)})
            return render_page(
                request, "memory_app/curate/row.html", page, fragment="row", status=400
            )
        message = message_edit(
            message=message, actor=Actor.for_user(request.user), text=text, tags=tags
        )
        if not wants_fragment(request):
            return redirect(
                reverse("curate-history", args=[context.pk]) + f"?before={message.seq + 1}"
            )
        page.update(m=message, editing=False)
    return render_page(request, "memory_app/curate/row.html", page, fragment="row")


@require("curate")
def message_row(request, context_id: int, message_id: int):
    """The row in view mode (the edit form's Cancel)."""
    context = get_object_or_404(Context, pk=context_id)
    message = get_object_or_404(Message, pk=message_id, context=context)
    if not wants_fragment(request):
        return redirect(reverse("curate-history", args=[context.pk]) + f"?before={message.seq + 1}")
    return render_page(
        request, "memory_app/curate/row.html", {"ctx": context, "m": message}, fragment="row"
    )


# --- bulk prune by filter -----------------------------------------------------------------------


def _parse_time(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise dq.BadQuery(f"{name} must be a date and time like 2025-01-31T14:00") from exc
    return timezone.make_aware(parsed) if timezone.is_naive(parsed) else parsed


def _prune_filter(data) -> PruneFilter:
    try:
        return PruneFilter(
            role=data.get("role", "").strip(),
            tag=data.get("tag", "").strip(),
            text=data.get("text", "").strip(),
            before_seq=dq.parse_int(data.get("before_seq"), name="before seq", minimum=1),
            after_seq=dq.parse_int(data.get("after_seq"), name="after seq", minimum=0),
            before_time=_parse_time(data.get("before_time"), "before time"),
            after_time=_parse_time(data.get("after_time"), "after time"),
            run_id=dq.parse_int(data.get("run"), name="run", minimum=1),
        )
    except Invalid as exc:
        raise dq.BadQuery(str(exc)) from exc


def _filter_params(data) -> dict:
    keys = ("role", "tag", "text", "before_seq", "after_seq", "before_time", "after_time", "run")
    return {k: data.get(k, "") for k in keys}


@require("curate")
def bulk_prune(request, context_id: int):
    """The filter form and, once a filter is set, the preview: how many and which would go."""
    context = get_object_or_404(Context, pk=context_id)
    try:
        flt = _prune_filter(request.GET)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    page = {
        "ctx": context,
        "params": _filter_params(request.GET),
        "roles": MessageRole.values,
        "runs": list(Run.objects.filter(context=context).order_by("-id").values("id", "task")[:50]),
        "nav_active": "contexts",
    }
    if not flt.is_empty:
        page["preview"] = curation.bulk_prune_preview(context=context, flt=flt)
        page["describe"] = flt.describe()
    return render_page(request, "memory_app/curate/bulk.html", page, fragment="bulk-preview")


@require("curate")
@require_POST
def bulk_prune_apply(request, context_id: int):
    context = get_object_or_404(Context, pk=context_id)
    params = _filter_params(request.POST)
    try:
        flt = _prune_filter(request.POST)
        upto = dq.parse_int(request.POST.get("upto_seq"), name="upto_seq", minimum=0)
        expected = dq.parse_int(
            request.POST.get("expected_count"), name="expected_count", minimum=0
        )
        if upto is None or expected is None:
            raise dq.BadQuery("preview the filter first (upto_seq and expected_count are missing)")
        event = curation.bulk_prune_apply(
            context=context,
            flt=flt,
            upto_seq=upto,
            expected_count=expected,
            actor=Actor.for_user(request.user),
        )
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    except Invalid as exc:
        return bad_request(request, dq.BadQuery(str(exc)))
    except Conflict as exc:
        # The set changed since the preview: show the new preview instead of pruning blind.
        page = {
            "ctx": context,
            "params": params,
            "conflict": str(exc),
            "preview": curation.bulk_prune_preview(context=context, flt=flt),
            "describe": flt.describe(),
        }
        return render_page(
            request, "memory_app/curate/bulk.html", page, fragment="bulk-preview", status=409
        )
    if not wants_fragment(request):
        return redirect(reverse("curate-history", args=[context.pk]) + f"?done={event.pk}")
    page = {"ctx": context, "params": params, "done": event}
    return render_page(request, "memory_app/curate/bulk.html", page, fragment="bulk-preview")


# --- run logbook -------------------------------------------------------------------------------


def _steps_state(request, run: Run) -> dict:
    after = dq.parse_int(request.GET.get("after"), name="after", minimum=0) or 0
    rows = list(
        Step.objects.filter(run=run, position__gt=after)
        .order_by("position")
        .only(
            "id",
            "position",
            "kind",
            "step_number",
            "observations",
            "error_type",
            "plan",
            "task",
            "code_action",
            "pruned_at",
            "pruned_by",
            "is_final_answer",
            "run_id",
        )[: STEP_PAGE + 1]
    )
    steps = rows[:STEP_PAGE]
    base = reverse("curate-run", args=[run.pk])
    return {
        "run": run,
        "ctx": run.context,
        "steps": steps,
        "list_url": f"{base}?after={after}" if after else base,
        "later_url": f"{base}?after={steps[-1].position}" if len(rows) > STEP_PAGE else None,
        "recent": _recent_undoable(run.context),
    }


@require("curate")
def curate_run(request, run_id: int):
    run = get_object_or_404(Run.objects.select_related("context"), pk=run_id)
    try:
        page = _steps_state(request, run)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    done = request.GET.get("done")
    if done and done.isdigit():
        page["done"] = AuditEvent.objects.filter(pk=int(done)).first()
    fragment = (
        "steps-list" if request.htmx and request.htmx.target == "steps-list" else "steps-panel"
    )
    return render_page(
        request, "memory_app/curate/run.html", {**page, "nav_active": "contexts"}, fragment=fragment
    )


@require("curate")
@require_POST
def curate_steps_set_pruned(request, run_id: int):
    run = get_object_or_404(Run.objects.select_related("context"), pk=run_id)
    pruned = request.POST.get("pruned", "1") == "1"
    try:
        ids = _ids(request)
        if not ids:
            raise dq.BadQuery("select at least one step")
        _, event = steps_set_pruned(
            run=run, ids=ids, pruned=pruned, actor=Actor.for_user(request.user)
        )
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    if not wants_fragment(request):
        return redirect(
            reverse("curate-run", args=[run.pk]) + (f"?done={event.pk}" if event else "")
        )
    page = _steps_state(request, run)
    page["done"] = event
    return render_page(request, "memory_app/curate/run.html", page, fragment="steps-panel")
