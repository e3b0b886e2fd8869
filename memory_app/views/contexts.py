"""Contexts browser: filter by key=value chips, search text, sort by activity, cursor pages. The
home page is the same browser led by the latest failed and running runs."""

from django.urls import reverse
from django.views.decorators.http import require_GET

from memory_app.queries.dashboard import CONTEXT_ORDERS, BadQuery, contexts_page
from memory_app.queries.runs_table import runs_needing_attention
from memory_app.roles import require
from memory_app.views.common import (
    bad_request,
    htmx_partial,
    invalid_form,
    page,
    query_string,
    replica_page,
    wants_fragment,
)
from memory_app.views.forms import ContextListForm


@require("view")
@require_GET
@replica_page
@htmx_partial("results")
def home(request):
    return _context_list(request, attention=True)


@require("view")
@require_GET
@replica_page
@htmx_partial("results")
def context_list(request):
    return _context_list(request, attention=False)


def _context_list(request, *, attention: bool):
    form = ContextListForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    chips, text, order, cursor = data["key"] + data["add"], data["q"], data["sort"], data["cursor"]
    try:
        # The query layer checks the cursor (opaque to the form) and bounds the search text.
        found = contexts_page(chips=chips, text=text, order=order, cursor=cursor or None)
    except BadQuery as exc:
        return bad_request(request, exc)
    chip_values = [f"{k}={v}" for k, v in chips]
    base = reverse("contexts")
    chip_links = [
        {
            "label": value,
            "remove_url": base
            + "?"
            + query_string(key=[c for c in chip_values if c != value], q=text, sort=order),
        }
        for value in chip_values
    ]
    next_url = None
    if found.next_cursor:
        next_url = (
            base + "?" + query_string(key=chip_values, q=text, sort=order, cursor=found.next_cursor)
        )
    context = {
        "page": found,
        "chips": chip_links,
        "chip_values": chip_values,
        "text": text,
        "order": order,
        "orders": CONTEXT_ORDERS,
        "next_url": next_url,
        "paged": bool(cursor),
        "first_url": base + "?" + query_string(key=chip_values, q=text, sort=order),
        "nav_active": "contexts",
        # Only the whole home page shows them (its htmx answers are the contexts alone).
        "attention": runs_needing_attention()
        if attention and not wants_fragment(request)
        else None,
    }
    response = page(request, "memory_app/contexts.html", context)
    if request.htmx:
        # The address bar shows the chips as `key=` filters, not the one-off `add=` input.
        response["HX-Push-Url"] = (
            base + "?" + query_string(key=chip_values, q=text, sort=order, cursor=cursor)
        )
    return response
