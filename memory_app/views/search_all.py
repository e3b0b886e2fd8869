"""Search everything: one search over the messages, step outputs, errors and tool calls of every
context, its query and filters in the URL (a search is shared by its address), hits grouped by
context and run, each a link to its message or step; the htmx answer is the results alone."""

from django.urls import reverse
from django.views.decorators.http import require_GET

from memory_app.queries.search_all import KINDS, BadQuery, SearchFilters, search_all
from memory_app.roles import require
from memory_app.views.common import (
    bad_request,
    htmx_partial,
    invalid_form,
    page,
    query_string,
    replica_page,
)
from memory_app.views.forms import SearchAllForm


@require("view")
@require_GET
@replica_page
@htmx_partial("results")
def search_page(request):
    form = SearchAllForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    keys = data["key"] + data["add"]
    chip_values = [f"{k}={v}" for k, v in keys]
    typed = form.typed(("q", "kind"))
    base = reverse("search")

    def url(**changes) -> str:
        return base + "?" + query_string(**{**typed, "key": chip_values, **changes})

    found = None
    if data["q"]:
        try:
            filters = SearchFilters(q=data["q"], kinds=data["kind"], keys=keys)
            found = search_all(filters=filters, cursor=data["cursor"] or None)
        except BadQuery as exc:
            return bad_request(request, exc)
    context = {
        "found": found,
        "typed": typed,
        "kinds": KINDS,
        "chips": [
            {"label": value, "remove_url": url(key=[c for c in chip_values if c != value])}
            for value in chip_values
        ],
        "chip_values": chip_values,
        "next_url": url(cursor=found.next_cursor) if found and found.next_cursor else None,
        "first_url": url() if data["cursor"] else None,
        "nav_active": "search",
    }
    response = page(request, "memory_app/search.html", context)
    if request.htmx:
        # The address bar shows the chips as `key=` filters, not the one-off `add=` input.
        response["HX-Push-Url"] = url(cursor=data["cursor"])
    return response
