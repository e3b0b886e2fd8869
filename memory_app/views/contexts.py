"""Contexts browser: filter by key=value chips, search text, sort by activity, cursor pages."""

from django.urls import reverse

from memory_app import dashboard_queries as dq
from memory_app.roles import require
from memory_app.views.common import bad_request, query_string, render_page


@require("view")
def context_list(request):
    try:
        chips = dq.parse_key_chips(request.GET.getlist("key"))
        # The chip input adds one more key=value to the current set.
        if new_chip := request.GET.get("add", "").strip():
            chips += dq.parse_key_chips([new_chip])
        text = request.GET.get("q", "").strip()
        order = request.GET.get("sort", "recent") or "recent"
        page = dq.contexts_page(
            chips=chips, text=text, order=order, cursor=request.GET.get("cursor") or None
        )
    except dq.BadQuery as exc:
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
    if page.next_cursor:
        next_url = (
            base + "?" + query_string(key=chip_values, q=text, sort=order, cursor=page.next_cursor)
        )
    context = {
        "page": page,
        "chips": chip_links,
        "chip_values": chip_values,
        "text": text,
        "order": order,
        "orders": dq.CONTEXT_ORDERS,
        "next_url": next_url,
        "paged": bool(request.GET.get("cursor")),
        "first_url": base + "?" + query_string(key=chip_values, q=text, sort=order),
    }
    context["nav_active"] = "contexts"
    response = render_page(request, "memory_app/contexts.html", context, fragment="results")
    if request.htmx:
        # The address bar shows the chips as `key=` filters, not the one-off `add=` input.
        cursor = request.GET.get("cursor")
        response["HX-Push-Url"] = (
            base + "?" + query_string(key=chip_values, q=text, sort=order, cursor=cursor)
        )
    return response
