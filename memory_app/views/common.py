"""Helpers shared by the dashboard views: full page or htmx fragment from one template.

A view answers `page(...)`: a TemplateResponse of the whole page. The partial it answers under
htmx is declared on the view with `@htmx_partial("name")`, so one URL serves both and no view
picks templates by looking at the request itself.
"""

from __future__ import annotations

from functools import wraps
from urllib.parse import urlencode

from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.template.response import SimpleTemplateResponse, TemplateResponse
from django.utils.cache import patch_cache_control, patch_vary_headers

from memory_app.replica import replica_reads
from memory_app.url_prefixes import API_PREFIXES


def wants_fragment(request) -> bool:
    """An htmx request for part of a page; a history restore (back button, cache miss) needs it
    all."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request and not htmx.boosted


def page(request, template: str, context: dict, *, status: int = 200) -> TemplateResponse:
    """The whole page (or, for a name with `#`, that partial whatever the request)."""
    return private(TemplateResponse(request, template, context, status=status))


def htmx_partial(name: str, *, targets: dict[str, str] | None = None):
    """View decorator: under htmx, the view's page answers only its partial `name`, or the partial
    `targets` names for the element the request targets (`HX-Target`)."""
    targets = targets or {}

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            response = view(request, *args, **kwargs)
            if (
                isinstance(response, TemplateResponse)
                and isinstance(response.template_name, str)
                and "#" not in response.template_name
                and wants_fragment(request)
            ):
                chosen = targets.get(request.htmx.target, name)
                response.template_name = f"{response.template_name}#{chosen}"
            return response

        wrapped.htmx_partial = name
        return wrapped

    return decorator


def replica_page(view):
    """View decorator: a GET of this page reads from the read replica when one is configured (a
    page a moment behind the primary is fine to look at; memory_app/replica.py). Its template
    is rendered inside too, since querysets are read as the template reaches them. Any other
    method, and any read inside a transaction, stays on the primary. Above `htmx_partial`, which
    picks the template to render."""

    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if request.method not in ("GET", "HEAD"):
            return view(request, *args, **kwargs)
        with replica_reads():
            response = view(request, *args, **kwargs)
            if isinstance(response, SimpleTemplateResponse):
                response.render()
        return response

    return wrapped


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
    503: "The database is unavailable",
}


def error_response(request, status: int, message: str = "", *, form=None) -> HttpResponse:
    """The error page; under htmx only the message, retargeted to the page's `#flash` region
    (a whole page swapped into a fragment would break the screen). /api/ and /v1/ answer JSON.
    With `form`, the message is the form's errors."""
    if request.path.startswith(API_PREFIXES):
        return JsonResponse({"detail": message}, status=status)
    details = {
        "status": status,
        "title": TITLES.get(status, f"Error {status}"),
        "message": message,
        "form": form,
    }
    if wants_fragment(request):
        html = render_to_string("memory_app/error.html#flash", details, request=request)
        response = HttpResponse(html, status=status)
        response["HX-Retarget"] = "#flash"
        response["HX-Reswap"] = "innerHTML"
    else:
        html = render_to_string("memory_app/error.html", details, request=request)
        response = HttpResponse(html, status=status)
    return private(response)


def bad_request(request, error: Exception | str) -> HttpResponse:
    """A 400 for a refusal the form could not see (a stale cursor, a domain rule)."""
    return error_response(request, 400, str(error))


def invalid_form(request, form) -> HttpResponse:
    """A 400 whose message is the form's errors (for input with no form on screen to answer in)."""
    return error_response(request, 400, form=form)


def query_string(**params) -> str:
    """`a=1&b=x` from the non-empty params (lists give repeated keys)."""
    pairs = []
    for key, value in params.items():
        if isinstance(value, list | tuple):
            pairs.extend((key, v) for v in value if v not in (None, ""))
        elif value not in (None, "", False):
            pairs.append((key, "1" if value is True else value))
    return urlencode(pairs)
