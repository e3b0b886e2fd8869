"""Curate a context's chat history and a run's logbook: select, prune/restore, edit, bulk prune.

Every POST works as a plain form (redirect back, Post/Redirect/Get) and under htmx (the
fragment with a stable id comes back and swaps outerHTML). Undo is an audit event reversed
(`views.audit.audit_undo_view`), so it stays available from the audit log long after the notice.
"""

from __future__ import annotations

from django.db.models.functions import Substr
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from memory_app.audit import Actor
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.models import AuditEvent, Context, Message, MessageRole, Run, Step
from memory_app.queries.dashboard import with_message_counts
from memory_app.rendering import content_blocks
from memory_app.roles import require
from memory_app.services import curation
from memory_app.services.curation import messages_set_pruned, steps_set_pruned
from memory_app.services.messages import message_edit
from memory_app.views.common import (
    bad_request,
    htmx_partial,
    invalid_form,
    page,
    query_string,
    wants_fragment,
)
from memory_app.views.forms import (
    CurateHistoryForm,
    CurateRunForm,
    MessageEditForm,
    PruneApplyForm,
    PruneFilterForm,
    SelectionForm,
    StepSelectionForm,
)

PAGE = 50
STEP_PAGE = 100


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
    events = list(events)
    _name_targets(context, events)
    return events


NAMED_TARGETS = 3
NAME_WORDS_CHARS = 40


def _name_targets(context: Context, events: list[AuditEvent]) -> None:
    """Set `named` on each event: its first few messages as "#seq · first words…" (or steps as
    "run R step N"), so a change says which message it touched. One query per kind of target."""
    wanted = {"message": set(), "step": set()}
    for event in events:
        ids = [i for i in (event.target_ids or [])[:NAMED_TARGETS] if isinstance(i, int)]
        wanted.get(event.target_type, set()).update(ids)
    names: dict[tuple[str, int], str] = {}
    if wanted["message"]:
        for pk, seq, words in Message.objects.filter(
            context=context, pk__in=wanted["message"]
        ).values_list("pk", "seq", Substr("text", 1, NAME_WORDS_CHARS + 1)):
            words = " ".join((words or "").split())
            if len(words) > NAME_WORDS_CHARS:
                cut = words[:NAME_WORDS_CHARS]
                words = (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "…"
            names["message", pk] = f"#{seq} · {words}" if words else f"#{seq}"
    if wanted["step"]:
        for pk, run_id, position in Step.objects.filter(
            context_id=context.pk, pk__in=wanted["step"]
        ).values_list("pk", "run_id", "position"):
            names["step", pk] = f"run {run_id} step {position}"
    for event in events:
        ids = (event.target_ids or [])[:NAMED_TARGETS]
        event.named = [names[key] for i in ids if (key := (event.target_type, i)) in names]


# --- chat history ----------------------------------------------------------------------------


def _history_state(context: Context, *, view: str, before: int | None = None) -> dict:
    """The curate list of `view` ("live" or "pruned"), the page of messages before `before`."""
    qs = Message.objects.filter(context=context)
    qs = qs.filter(pruned_at__isnull=view == "live")
    if before is not None:
        qs = qs.filter(seq__lt=before)
    rows = list(qs.order_by("-seq")[: PAGE + 1])
    messages = list(reversed(rows[:PAGE]))
    with_message_counts([context])
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
@require_GET
@htmx_partial(
    "curate-panel",
    targets={
        "curate-list": "curate-list",
        "recent-changes": "recent-changes",
        "context-counts-box": "counts",
    },
)
def curate_history(request, context_id: int):
    context = get_object_or_404(Context, pk=context_id)
    form = CurateHistoryForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    state = _history_state(context, view=data["view"], before=data["before"])
    if data["done"]:
        state["done"] = AuditEvent.objects.filter(pk=data["done"], context=context).first()
    # Refreshed after an undo: keep the list open where the operator was working.
    recent_open = bool(request.htmx) and request.htmx.target == "recent-changes"
    context_vars = {**state, "nav_active": "contexts", "recent_open": recent_open}
    return page(request, "memory_app/curate/history.html", context_vars)


@require("curate")
@require_POST
@htmx_partial("curate-panel")
def curate_set_pruned(request, context_id: int):
    """Prune or restore the selected messages; one audit event lists them (undo reverses it)."""
    context = get_object_or_404(Context, pk=context_id)
    form = SelectionForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    try:
        _, event = messages_set_pruned(
            context=context,
            ids=data["ids"],
            pruned=data["pruned"],
            actor=Actor.for_user(request.user),
        )
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    view = "pruned" if data["view"] == "pruned" else "live"
    if not wants_fragment(request):
        qs = query_string(view=view if view == "pruned" else "", done=event.pk if event else "")
        return redirect(reverse("curate-history", args=[context.pk]) + (f"?{qs}" if qs else ""))
    # The list the operator was on, from its first page, and the header's new counts.
    state = _history_state(context, view=view)
    state["done"] = event
    state["counts_changed"] = True
    return page(request, "memory_app/curate/history.html", state)


@require("curate")
@require_http_methods(["GET", "POST"])
@htmx_partial("row")
def message_edit_view(request, context_id: int, message_id: int):
    """GET: the row as an edit form; POST: save text and tags (previous version in the audit)."""
    context = get_object_or_404(Context, pk=context_id)
    message = get_object_or_404(Message, pk=message_id, context=context)
    row = {"ctx": context, "m": message, "editing": True}
    if request.method == "GET":
        return page(request, "memory_app/curate/row.html", row)
    form = MessageEditForm(request.POST)
    if not form.is_valid():
        # NUL (PostgreSQL text cannot hold it) or an overlong tag.
        return invalid_form(request, form)
    text, tags = form.cleaned_data["text"], form.cleaned_data["tags"]
    if not text.strip() and not content_blocks(message.content):
        # Blank text would leave an empty message in every transcript (unless it carries a
        # tool call or result): pruning is the way to take one out, and it stays restorable.
        form.add_error(None, "the text cannot be empty: to take the message out, prune it instead")
        if not wants_fragment(request):
            return invalid_form(request, form)
        row.update(form=form, draft={"text": text, "tags": ", ".join(tags)})
        return page(request, "memory_app/curate/row.html", row, status=400)
    message = message_edit(
        message=message, actor=Actor.for_user(request.user), text=text, tags=tags
    )
    if not wants_fragment(request):
        return redirect(reverse("curate-history", args=[context.pk]) + f"?before={message.seq + 1}")
    row.update(m=message, editing=False)
    return page(request, "memory_app/curate/row.html", row)


@require("curate")
@require_GET
@htmx_partial("row")
def message_row(request, context_id: int, message_id: int):
    """The row in view mode (the edit form's Cancel)."""
    context = get_object_or_404(Context, pk=context_id)
    message = get_object_or_404(Message, pk=message_id, context=context)
    if not wants_fragment(request):
        return redirect(reverse("curate-history", args=[context.pk]) + f"?before={message.seq + 1}")
    return page(request, "memory_app/curate/row.html", {"ctx": context, "m": message})


# --- bulk prune by filter -----------------------------------------------------------------------


@require("curate")
@require_GET
@htmx_partial("bulk-preview")
def bulk_prune(request, context_id: int):
    """The filter form and, once a filter is set, the preview: how many and which would go."""
    context = get_object_or_404(Context, pk=context_id)
    form = PruneFilterForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    flt = form.cleaned_data["filter"]
    state = {
        "ctx": context,
        "params": form.filter_params(),
        "roles": MessageRole.values,
        "runs": list(Run.objects.filter(context=context).order_by("-id").values("id", "task")[:50]),
        "nav_active": "contexts",
    }
    if not flt.is_empty:
        state["preview"] = curation.bulk_prune_preview(context=context, flt=flt)
        state["describe"] = flt.describe()
    return page(request, "memory_app/curate/bulk.html", state)


@require("curate")
@require_POST
@htmx_partial("bulk-preview")
def bulk_prune_apply(request, context_id: int):
    context = get_object_or_404(Context, pk=context_id)
    form = PruneApplyForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    data, params = form.cleaned_data, form.filter_params()
    flt = data["filter"]
    try:
        event = curation.bulk_prune_apply(
            context=context,
            flt=flt,
            upto_seq=data["upto_seq"],
            expected_count=data["expected_count"],
            actor=Actor.for_user(request.user),
        )
    except Invalid as exc:
        return bad_request(request, exc)
    except Conflict as exc:
        # The set changed since the preview: show the new preview instead of pruning blind.
        state = {
            "ctx": context,
            "params": params,
            "conflict": str(exc),
            "preview": curation.bulk_prune_preview(context=context, flt=flt),
            "describe": flt.describe(),
        }
        return page(request, "memory_app/curate/bulk.html", state, status=409)
    if not wants_fragment(request):
        return redirect(reverse("curate-history", args=[context.pk]) + f"?done={event.pk}")
    state = {"ctx": context, "params": params, "done": event}
    return page(request, "memory_app/curate/bulk.html", state)


# --- run logbook -------------------------------------------------------------------------------


def _steps_state(run: Run, *, after: int = 0) -> dict:
    """The curate list of a run's steps after position `after`."""
    rows = list(
        Step.objects.filter(context_id=run.context_id, run=run, position__gt=after)
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
@require_GET
@htmx_partial("steps-panel", targets={"steps-list": "steps-list"})
def curate_run(request, run_id: int):
    run = get_object_or_404(Run.objects.select_related("context"), pk=run_id)
    form = CurateRunForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    state = _steps_state(run, after=form.cleaned_data["after"] or 0)
    if form.cleaned_data["done"]:
        state["done"] = AuditEvent.objects.filter(pk=form.cleaned_data["done"]).first()
    return page(request, "memory_app/curate/run.html", {**state, "nav_active": "contexts"})


@require("curate")
@require_POST
@htmx_partial("steps-panel")
def curate_steps_set_pruned(request, run_id: int):
    run = get_object_or_404(Run.objects.select_related("context"), pk=run_id)
    form = StepSelectionForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    try:
        _, event = steps_set_pruned(
            run=run, ids=data["ids"], pruned=data["pruned"], actor=Actor.for_user(request.user)
        )
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    if not wants_fragment(request):
        return redirect(
            reverse("curate-run", args=[run.pk]) + (f"?done={event.pk}" if event else "")
        )
    state = _steps_state(run)
    state["done"] = event
    return page(request, "memory_app/curate/run.html", state)
