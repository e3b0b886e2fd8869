"""Helpers shared by the dashboard views: full page or htmx fragment from one template."""

from __future__ import annotations

from urllib.parse import urlencode

from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.cache import patch_cache_control, patch_vary_headers

from memory_app.url_prefixes import API_PREFIXES
from memory_app.dashboard_queries import BadQuery


def wants_fragment(request) -> bool:
    """An htmx request for part of a page; a history restore (back button, cache miss) needs it all."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request and not htmx.boosted


def render_page(
    request, template: str, context: dict, *, fragment: str | None = None, status: int = 200
):
    """The full page, or under htmx only the partial `fragment` of the same template."""
    name = f"{template}#{fragment}" if fragment and wants_fragment(request) else template
    response = render(request, name, context, status=status)
    return private(response)


def private(response: HttpResponse) -> HttpResponse:
    # The same URL answers a page or a fragment: caches must keep them apart, and a reload after
    # hx-push-url must never show a cached fragment.
    patch_vary_headers(response, ["HX-Request", "HX-Target", "HX-History-Restore-Request"])
    patch_cache_control(response, private=True, no_cache=True)
    return response


TITLES = {
    400: "That request cannot be answered",
    403: "Not allowed",
    404: "Not found",
    500: "Something went wrong on the server",
}


def error_response(request, status: int, message: str) -> HttpResponse:
    """The error page; under htmx only the message, retargeted to the page's `#flash` region
    (a whole page swapped into a fragment would break the screen). /api/ and /v1/ answer JSON."""
    if request.path.startswith(API_PREFIXES):
        return JsonResponse({"detail": message}, status=status)
    page = {"status": status, "title": TITLES.get(status, f"Error {status}"), "message": message}
    if wants_fragment(request):
        html = render_to_string("memory_app/error.html#flash", page, request=request)
        response = HttpResponse(html, status=status)
        response["HX-Retarget"] = "#flash"
        response["HX-Reswap"] = "innerHTML"
    else:
        html = render_to_string("memory_app/error.html", page, request=request)
        response = HttpResponse(html, status=status)
    return private(response)


def bad_request(request, error: BadQuery) -> HttpResponse:
    return error_response(request, 400, str(error))


def query_string(**params) -> str:
    """`a=1&b=x` from the non-empty params (lists give repeated keys)."""
    pairs = []
    for key, value in params.items():
        if isinstance(value, list | tuple):
            pairs.extend((key, v) for v in value if v not in (None, ""))
        elif value not in (None, "", False):
            pairs.append((key, "1" if value is True else value))
    return urlencode(pairs)
