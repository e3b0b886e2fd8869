"""Error answers for the dashboard: styled pages, and under htmx a message in the page.

htmx swaps 4xx answers (see `responseHandling` in base.html), so an error meant for the element
that made the request (a form answered with its own error) lands where the operator looks. The
handlers here answer errors with no such place, such as 403, 404 and a bad parameter: under htmx
they send a short message retargeted to the page's `#flash` region instead of a whole page
swapped into a fragment. The agent API answers JSON (ninja's handlers), including for unknown
/api/ URLs.
"""

from __future__ import annotations

import logging
import sys

from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string

from memory_app import db
from memory_app.url_prefixes import API_PREFIXES
from memory_app.views.common import TITLES, error_response

logger = logging.getLogger(__name__)


def bad_request(request, exception=None):
    # The exception's text may quote request headers: not echoed.
    return error_response(request, 400, "The request is malformed.")


def permission_denied(request, exception=None):
    detail = str(exception or "")
    return error_response(
        request,
        403,
        f"Your role does not allow this ({detail})."
        if detail
        else "Your role does not allow this.",
    )


def page_not_found(request, exception=None):
    detail = str(exception or "")
    # Django's resolver puts a dict of debug details in the exception: keep only real messages.
    if not detail or detail.startswith("{"):
        detail = f"Nothing lives at {request.path}."
    return error_response(request, 404, detail)


def csrf_failure(request, reason=""):
    return error_response(
        request, 403, "The form expired or came from another site: reload the page and try again."
    )


def server_error(request):
    """A page that needs neither the database nor the session: the error may come from them."""
    if db.is_database_fault(sys.exc_info()[1]):
        # A fault outside any view (a middleware saving the session): still a 503, not a 500.
        return database_unavailable(request)
    return _standalone(request, 500, "internal server error")


def database_unavailable(request, exc: BaseException | None = None) -> HttpResponse:
    """503 with Retry-After when the database fails: JSON on the API, a styled page (under htmx
    a message in #flash) on the dashboard, both built without the database or the session."""
    if exc is not None:
        logger.warning("database unavailable (%s): %s", request.path, str(exc).strip()[:200])
    response = _standalone(request, 503, db.UNAVAILABLE)
    response["Retry-After"] = str(db.RETRY_AFTER_SECONDS)
    return response


def _standalone(request, status: int, detail: str) -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return JsonResponse({"detail": detail}, status=status)
    page = {"status": status, "title": TITLES[status]}
    if request.headers.get("HX-Request") == "true":
        response = HttpResponse(render_to_string("500.html#flash", page), status=status)
        response["HX-Retarget"] = "#flash"
        response["HX-Reswap"] = "innerHTML"
        return response
    return HttpResponse(render_to_string("500.html", page), status=status)
