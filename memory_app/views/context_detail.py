"""Context page: the chat history as a timeline (paged, filterable) and the context's runs."""

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from memory_app import dashboard_queries as dq
from memory_app.audit import Actor
from memory_app.errors import NotFound
from memory_app.models import Context, MessageRole
from memory_app.roles import require
from memory_app.services.curation import messages_set_pruned
from memory_app.views.common import bad_request, query_string, render_page, wants_fragment


def _filters(request) -> dq.HistoryFilters:
    return dq.HistoryFilters(
        role=request.GET.get("role", "").strip(),
        tag=request.GET.get("tag", "").strip(),
        text=request.GET.get("q", "").strip(),
        show_pruned=request.GET.get("pruned") == "1",
    )


@require("view")
def context_page(request, context_id: int):
    context_obj = get_object_or_404(Context, pk=context_id)
    dq.with_message_counts([context_obj])
    try:
        filters = _filters(request)
        before = dq.parse_int(request.GET.get("before"), name="before", minimum=1)
        after = dq.parse_int(request.GET.get("after"), name="after", minimum=0)
        around = dq.parse_int(request.GET.get("seq"), name="seq", minimum=1)
        window = dq.history_window(
            context=context_obj, filters=filters, before=before, after=after, around=around
        )
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    markdown = request.GET.get("md") == "1"
    filter_qs = query_string(
        role=filters.role, tag=filters.tag, q=filters.text, pruned=filters.show_pruned, md=markdown
    )
    base = reverse("context", args=[context_obj.pk])
    sep = "&" if filter_qs else ""
    page_context = {
        "ctx": context_obj,
        "window": window,
        "filters": filters,
        "markdown": markdown,
        "roles": MessageRole.values,
        "tags": dq.context_tags(context=context_obj),
        "jump_seq": around,
        "earlier_url": f"{base}?{filter_qs}{sep}before={window.first_seq}"
        if window.has_earlier
        else None,
        "later_url": f"{base}?{filter_qs}{sep}after={window.last_seq}"
        if window.has_later
        else None,
        "latest_url": f"{base}?{filter_qs}" if (around or before or after) else None,
        "runs": dq.runs_page(context=context_obj),
    }
    # One URL, three shapes: the whole page, the history panel (filters, jump), or one more page
    # of messages replacing the "load earlier/later" control that asked for it.
    target = request.htmx.target if request.htmx else None
    fragment = {
        "history": "history",
        "history-earlier": "earlier-chunk",
        "history-later": "later-chunk",
    }.get(target)
    return render_page(
        request, "memory_app/context.html", page_context, fragment=fragment or "history"
    )


@require("view")
def context_runs(request, context_id: int):
    context_obj = get_object_or_404(Context, pk=context_id)
    try:
        before = dq.parse_int(request.GET.get("before"), name="before", minimum=1)
    except dq.BadQuery as exc:
        return bad_request(request, exc)
    runs = dq.runs_page(context=context_obj, before=before, limit=50)
    return render_page(
        request, "memory_app/context_runs.html", {"ctx": context_obj, "runs": runs}, fragment="runs"
    )


@require("curate")
@require_POST
def message_prune(request, context_id: int, message_id: int):
    """Prune (soft delete) or restore one message; answers the message's updated row."""
    context_obj = get_object_or_404(Context, pk=context_id)
    pruned = request.POST.get("pruned", "1") == "1"
    try:
        messages_set_pruned(
            context=context_obj, ids=[message_id], pruned=pruned, actor=Actor.for_user(request.user)
        )
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    message = dq.messages_for_history().get(pk=message_id)
    if not wants_fragment(request):
        return redirect(reverse("context", args=[context_obj.pk]) + f"?pruned=1&seq={message.seq}")
    return render_page(
        request,
        "memory_app/context.html#message",
        {
            "ctx": context_obj,
            "m": message,
            "markdown": request.POST.get("md") == "1",
            "filters": dq.HistoryFilters(),
        },
    )
