"""The NinjaAPI instance: auth, strict JSON parsing, domain-error mapping, router registration."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import DataError, IntegrityError, InterfaceError, OperationalError
from django.http import HttpRequest
from ninja import NinjaAPI, Swagger
from ninja.errors import AuthenticationError
from ninja.parser import Parser
from ninja.renderers import JSONRenderer

from memory_app import db
from memory_app.api import common
from memory_app.errors import Conflict, FilterNotComparable, Forbidden, Invalid, NotFound

logger = logging.getLogger(__name__)


class StrictJSONParser(Parser):
    """RFC 8259 JSON only: NaN/Infinity (which Python accepts and PostgreSQL rejects) are a 400."""

    def parse_body(self, request: HttpRequest):
        return common.json_loads(request.body)


class StrictJSONRenderer(JSONRenderer):
    def render(self, request, data, *, response_status):
        return common.json_dumps(data)


class OfflineSwagger(Swagger):
    """ninja's Swagger page with ninja's own bundled assets. ninja renders its CDN page unless it
    is an installed app; it is not one here (settings.NINJA_DIR says why), so the page it
    renders is the offline one, found in the same folders."""

    template_cdn = str(settings.NINJA_DIR / "templates" / "ninja" / "swagger.html")


class AgentApi(NinjaAPI):
    def on_exception(self, request: HttpRequest, exc):
        # A key read late (`ApiKeyAuth(deferred=True)`) is checked before any error is
        # answered: a bad key is a 401 whatever else is wrong with the request.
        if common.has_pending_key(request):
            try:
                common.settle_key(request)
            except Exception as key_exc:  # noqa: BLE001 - answered below as any error is
                exc = key_exc
        return super().on_exception(request, exc)


api = AgentApi(
    title="agentmemory Agent API",
    version="1",
    description=(
        "Agents read and write their memory: contexts, messages, runs, steps and tool calls.\n\n"
        "Authenticate with `Authorization: Bearer <key>` (create one with "
        '`manage.py apikey create`). Errors are JSON `{"detail": ...}`.'
    ),
    auth=common.api_key_auth,
    parser=StrictJSONParser(),
    renderer=StrictJSONRenderer(),
    openapi_url="openapi.json",
    docs_url="docs",
    docs=OfflineSwagger(),
    urls_namespace="api",
)


@api.exception_handler(AuthenticationError)
def _unauthorized(request, exc):
    # RFC 9110 requires a challenge on every 401; clients and proxies read the scheme from it.
    response = api.create_response(request, {"detail": str(exc)}, status=exc.status_code)
    response["WWW-Authenticate"] = getattr(exc, "challenge", "Bearer")
    return response


@api.exception_handler(NotFound)
def _not_found(request, exc):
    return api.create_response(request, {"detail": str(exc)}, status=404)


@api.exception_handler(Forbidden)
def _forbidden(request, exc):
    return api.create_response(request, {"detail": str(exc)}, status=403)


@api.exception_handler(Conflict)
def _conflict(request, exc):
    return api.create_response(
        request, {"detail": str(exc), "differences": exc.differences}, status=409
    )


@api.exception_handler(Invalid)
def _invalid(request, exc):
    body = {"detail": str(exc)}
    if isinstance(exc, FilterNotComparable):
        # The store client raises what LangGraph's in-memory store raises on the same filter.
        body["python_error"] = exc.python_error
    return api.create_response(request, body, status=422)


@api.exception_handler(DataError)
def _data_error(request, exc):
    # Safety net: a value the schemas let through but PostgreSQL refuses is still client input.
    logger.warning("DataError reached the API layer: %s", exc)
    return api.create_response(
        request, {"detail": "a value cannot be stored (out of range or invalid)"}, status=422
    )


@api.exception_handler(IntegrityError)
def _integrity_error(request, exc):
    logger.warning("IntegrityError reached the API layer: %s", exc)
    return api.create_response(
        request, {"detail": "conflicting concurrent write; retry the request"}, status=409
    )


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def _database_unavailable(request, exc):
    # Down, stalled, restarting or out of pooled connections: the client retries (its writes
    # carry client ids), so nothing it sent is lost, as it would be after a 500.
    logger.warning("database unavailable (%s): %s", request.path, str(exc).strip()[:200])
    response = api.create_response(request, {"detail": db.UNAVAILABLE}, status=503)
    response["Retry-After"] = str(db.RETRY_AFTER_SECONDS)
    return response


# --- routers: one line per area (see memory_app/api/__init__.py) -------------------------------
from memory_app.api import contexts, messages, runs  # noqa: E402

api.add_router("/v1/", contexts.router)
api.add_router("/v1/", messages.router)
api.add_router("/v1/", runs.router)

from memory_app.api import backup as backup_api  # noqa: E402
from memory_app.api import interop  # noqa: E402

api.add_router("/v1/", interop.router)
api.add_router("/v1/", backup_api.router)

from memory_app.api import memories as memories_api  # noqa: E402
from memory_app.api import selectors as selectors_api  # noqa: E402

api.add_router("/v1/", selectors_api.router)
api.add_router("/v1/", memories_api.router)

from memory_app.api import traces as traces_api  # noqa: E402

api.add_router("/v1/", traces_api.router)

from memory_app.api import embedding_models as embedding_models_api  # noqa: E402

api.add_router("/v1/", embedding_models_api.router)

from memory_app.api import store as store_api  # noqa: E402

api.add_router("/v1/", store_api.router)

from memory_app.api import erasure as erasure_api  # noqa: E402

api.add_router("/v1/", erasure_api.router)

from memory_app.api import checkpoints as checkpoints_api  # noqa: E402

api.add_router("/v1/", checkpoints_api.router)

from memory_app.api import scores as scores_api  # noqa: E402

api.add_router("/v1/", scores_api.router)

from memory_app.api import search_all as search_all_api  # noqa: E402

api.add_router("/v1/", search_all_api.router)
