"""The calls an agent makes on every turn, a selection (`POST /contexts/{id}/select`) and a
single append (`POST /contexts/{id}/messages`), answered without ninja's operation around them.

The operation's machinery (its authentication loop, parameter models, temporal response and
result protocol) and the URL resolver's search are a visible share of such a request's Python
(memory_app/bench/notes.md). Here the route's own parts run in the operation's order: its key
check, then its schema on the body (validated with the context ninja gives it), then its view;
an error of either is answered by the API's exception handlers (`api.on_exception`), as the
operation answers it. A body the schema refuses (or that is no JSON) is not answered here: the
operation answers it with ninja's own 400 or 422, checking the key again on the way (nothing was
written). A route is answered here only while its bound operation runs nothing but these parts
(`routes`): a throttle, another key check, a decorator, a parameter of another kind or a view
ninja would wrap, and the operation answers it.

agentmemory_site/api_handler.py decides which requests come here and gives their answers what
the middleware chain would give them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import ResolverMatch, get_urlconf, resolve
from ninja.errors import AuthenticationError
from ninja.operation import Operation
from ninja.params.models import BodyModel, PathModel

from memory_app.api import common, messages, selectors
from memory_app.api.app import api
from memory_app.schemas.fields import INT64_MAX
from memory_app.schemas.messages import MessageIn
from memory_app.schemas.selectors import SelectIn


@dataclass(frozen=True)
class Route:
    """A route's parts as its ninja operation runs them: key check, body schema and view."""

    auth: Callable[[HttpRequest], Any]
    schema: type
    view: Callable[..., HttpResponse]


ROUTES = {
    "select": Route(selectors.router_auth, SelectIn, selectors.select),
    "messages": Route(common.append_auth, MessageIn, messages.message_append),
}
PATHS = re.compile(r"/api/v1/contexts/([1-9][0-9]{0,18})/(select|messages)")


def routes() -> dict[str, Route]:
    """The routes of ROUTES whose operation, as bound to the API, runs only their parts: POST,
    that key check alone, no throttle, no decorator around the operation or the view, a path
    parameter and the body as the schema, nothing streamed."""
    bound = getattr(api, "_get_bound_routers", None)  # ninja's routers as mounted on the API
    operations = [
        operation
        for router in (bound() if bound else [])
        for path_view in router.path_operations.values()
        for operation in path_view.operations
    ]
    return {
        name: route
        for name, route in ROUTES.items()
        if any(_runs_only(operation, route) for operation in operations)
    }


def _runs_only(operation: Operation, route: Route) -> bool:
    models = {
        base: model
        for model in operation.models
        for base in (PathModel, BodyModel)
        if issubclass(model, base)
    }
    body = models.get(BodyModel)
    return (
        operation.view_func is route.view
        and operation.methods == ["POST"]
        and type(operation) is Operation
        and getattr(operation.run, "__func__", None) is Operation.run
        and not getattr(operation, "_run_decorators", None)
        and operation.auth_callbacks == [route.auth]
        and not operation.throttle_objects
        and not operation.stream_format
        and len(operation.models) == 2 == len(models)
        and body is not None
        and list(body.model_fields) == ["body"]
        and body.model_fields["body"].annotation is route.schema
    )


def route_for(path: str, answered: dict[str, Route]) -> tuple[Route, int] | None:
    """The route of `answered` a POST to `path` is for, and the route's context id."""
    match = PATHS.fullmatch(path)
    if match is None or match[2] not in answered:
        return None
    context_id = int(match[1])
    if context_id > INT64_MAX:
        return None  # the operation answers the path parameter's 422
    return answered[match[2]], context_id


@cache
def _route_template(path: str, urlconf: str | None) -> ResolverMatch:
    return resolve(path, urlconf)


def _route_match(path: str, context_id: int) -> ResolverMatch:
    """What `resolve` answers for the route's path, without trying the site's patterns one by
    one: its match for context 1, with this one's id."""
    template = _route_template(PATHS.sub(r"/api/v1/contexts/1/\2", path), get_urlconf())
    kwargs = {"context_id": str(context_id)}
    return ResolverMatch(
        template.func,
        (),
        kwargs,
        url_name=template.url_name,
        app_names=template.app_names,
        namespaces=template.namespaces,
        route=template.route,
        tried=template.tried,
        captured_kwargs=kwargs,
        extra_kwargs=template.extra_kwargs,
    )


def answer(request: HttpRequest, route: Route, context_id: int) -> HttpResponseBase | None:
    """The operation's answer to `request`, or None when its body is for ninja to refuse."""
    request.resolver_match = _route_match(request.path_info, context_id)  # the key check reads it
    try:
        key = route.auth(request)
    except Exception as exc:  # noqa: BLE001 - answered as the operation answers it
        return api.on_exception(request, exc)
    if not key:
        return api.on_exception(request, AuthenticationError())
    request.auth = key
    try:
        body = route.schema.model_validate(
            common.json_loads(request.body), context={"request": request}
        )
    except Exception:  # noqa: BLE001 - any refusal is ninja's to word
        return None
    try:
        result = route.view(request, context_id=context_id, body=body)
    except Exception as exc:  # noqa: BLE001 - answered as the operation answers it
        # (In DEBUG, ninja also rewords a TypeError about a missing positional argument.)
        return api.on_exception(request, exc)
    if not isinstance(result, HttpResponseBase):
        # ninja would render it; these views answer whole responses.
        raise TypeError(f"{route.view.__name__} answered {type(result).__name__}, not a response")
    return result
