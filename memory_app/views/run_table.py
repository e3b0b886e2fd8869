"""The runs table: every run across contexts, its filters and order in the URL (a view is shared
by its address), cursor pages; the htmx answer is the results section alone."""

from django.urls import reverse
from django.views.decorators.http import require_GET

from memory_app.models import RunStatus
from memory_app.queries.runs_table import ORDERS, BadQuery, runs_table
from memory_app.queries.scores import attach_run_scores
from memory_app.roles import require
from memory_app.views.common import (
    bad_request,
    htmx_partial,
    invalid_form,
    page,
    query_string,
    replica_page,
)
from memory_app.views.forms import RunTableForm

# The form's fields carried from one page to the next (the cursor and the one-off `add` aside).
CARRIED = (
    "status",
    "has_error",
    "error",
    "model",
    "started_after",
    "started_before",
    "min_duration",
    "min_cost",
    "score",
    "score_value",
    "score_min",
    "score_max",
    "label",
    "sort",
)


@require("view")
@require_GET
@replica_page
@htmx_partial("results")
def run_table(request):
    form = RunTableForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    order, cursor = form.cleaned_data["sort"], form.cleaned_data["cursor"]
    try:
        filters = form.filters()
        # The query layer checks the cursor (opaque to the form).
        found = runs_table(filters=filters, order=order, cursor=cursor or None)
    except BadQuery as exc:
        return bad_request(request, exc)
    attach_run_scores(found.runs)
    typed = form.typed(CARRIED)
    typed["sort"] = order
    chip_values = [f"{k}={v}" for k, v in filters.keys]
    base = reverse("runs")

    def url(**changes) -> str:
        params = {**typed, "key": chip_values, **changes}
        return base + "?" + query_string(**params)

    chips = [
        {"label": value, "remove_url": url(key=[c for c in chip_values if c != value])}
        for value in chip_values
    ]
    context = {
        "page": found,
        "filters": filters,
        "typed": typed,
        "chips": chips,
        "chip_values": chip_values,
        "statuses": RunStatus.choices,
        "orders": {name: label for name, (label, _, _) in ORDERS.items()},
        "order": order,
        "next_url": url(cursor=found.next_cursor) if found.next_cursor else None,
        "first_url": url() if cursor else None,
        "clear_url": base,
        # The filters as a review queue keeps them (no order, cursor or one-off chip input).
        "queue_filters": query_string(
            **{k: v for k, v in typed.items() if k != "sort"}, key=chip_values
        ),
        "nav_active": "runs",
    }
    response = page(request, "memory_app/runs.html", context)
    if request.htmx:
        # The address bar shows the chips as `key=` filters, not the one-off `add=` input.
        response["HX-Push-Url"] = url(cursor=cursor)
    return response
