"""Context page: the chat history as a timeline (paged, filterable) and the context's runs."""

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from memory_app.audit import Actor
from memory_app.errors import NotFound
from memory_app.models import Context, MessageRole
from memory_app.queries.dashboard import (
    BadQuery,
    HistoryFilters,
    context_tags,
    history_window,
    messages_for_history,
    runs_page,
    with_message_counts,
)
from memory_app.roles import require
from memory_app.services.curation import messages_set_pruned
from memory_app.views.common import (
    bad_request,
    htmx_partial,
    invalid_form,
    page,
    query_string,
    replica_page,
    wants_fragment,
)
from memory_app.views.forms import HistoryForm, MessagePruneForm, RunsPageForm


# One URL, three shapes: the whole page, the history panel (filters, jump), or one more page of
# messages replacing the "load earlier/later" control that asked for it.
@require("view")
@require_GET
@replica_page
@htmx_partial(
    "history", targets={"history-earlier": "earlier-chunk", "history-later": "later-chunk"}
)
def context_page(request, context_id: int):
    context_obj = get_object_or_404(Context, pk=context_id)
    with_message_counts([context_obj])
    form = HistoryForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    before, after, around = data["before"], data["after"], data["seq"]
    try:
        filters = form.filters()
        window = history_window(
            context=context_obj, filters=filters, before=before, after=after, around=around
        )
    except BadQuery as exc:
        return bad_request(request, exc)
    markdown = data["md"]
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
        "tags": context_tags(context=context_obj),
        "jump_seq": around,
        "earlier_url": f"{base}?{filter_qs}{sep}before={window.first_seq}"
        if window.has_earlier
        else None,
        "later_url": f"{base}?{filter_qs}{sep}after={window.last_seq}"
        if window.has_later
        else None,
        "latest_url": f"{base}?{filter_qs}" if (around or before or after) else None,
        "runs": runs_page(context=context_obj),
    }
    return page(request, "memory_app/context.html", page_context)


@require("view")
@require_GET
@replica_page
@htmx_partial("runs")
def context_runs(request, context_id: int):
    context_obj = get_object_or_404(Context, pk=context_id)
    form = RunsPageForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    runs = runs_page(context=context_obj, before=form.cleaned_data["before"], limit=50)
    return page(request, "memory_app/context_runs.html", {"ctx": context_obj, "runs": runs})


@require("curate")
@require_POST
@htmx_partial("message-changed")
def message_prune(request, context_id: int, message_id: int):
    """Prune (soft delete) or restore one message; answers the message's updated row and, out of
    band, the header's counts."""
    context_obj = get_object_or_404(Context, pk=context_id)
    form = MessagePruneForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    try:
        messages_set_pruned(
            context=context_obj,
            ids=[message_id],
            pruned=form.cleaned_data["pruned"],
            actor=Actor.for_user(request.user),
        )
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    message = messages_for_history().get(pk=message_id, context=context_obj)
    with_message_counts([context_obj])
    if not wants_fragment(request):
        return redirect(reverse("context", args=[context_obj.pk]) + f"?pruned=1&seq={message.seq}")
    return page(
        request,
        "memory_app/context.html",
        {
            "ctx": context_obj,
            "m": message,
            "markdown": form.cleaned_data["md"],
            "filters": HistoryFilters(),
        },
    )
