"""The calls an agent makes on every turn, a selection (`POST /contexts/{id}/select`) and a
single append (`POST /contexts/{id}/messages`), answered without ninja's operation around them.

ninja's operation (its authentication loop, parameter models, temporal response and result
protocol) and the URL resolver cost such a request about half a millisecond of Python, a tenth
of what it spends above the database. Here the route's own parts run instead: its schema
validates the body (with the context ninja gives it), its key check runs, its view answers, and
an error of either is answered by the API's exception handlers (`api.on_exception`), as the
operation answers it. A body the schema refuses (or that is no JSON) is not answered here: the
operation answers it, with ninja's own 400 or 422. Validating before the key is checked changes
nothing a client sees: a refused body goes to the operation, which checks the key first.

agentmemory_site/api_handler.py decides which requests come here and gives their answers the
headers the middleware chain would.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import ResolverMatch, resolve
from ninja.errors import AuthenticationError

from memory_app.api import common, messages, selectors
from memory_app.api.app import api
from memory_app.schemas.fields import INT64_MAX
from memory_app.schemas.messages import MessageIn
from memory_app.schemas.selectors import SelectIn


@dataclass(frozen=True)
class Operation:
    """A route's parts as its ninja operation runs them: body schema, key check and view."""

    schema: type
    auth: Callable[[HttpRequest], Any]
    view: Callable[..., HttpResponse]


OPERATIONS = {
    "select": Operation(SelectIn, selectors.router_auth, selectors.select),
    "messages": Operation(MessageIn, common.append_auth, messages.message_append),
}
PATHS = re.compile(r"/api/v1/contexts/([1-9][0-9]{0,18})/(select|messages)")


def operation_for(path: str) -> tuple[Operation, int] | None:
    """The operation answered here for a POST to `path`, and the route's context id."""
    match = PATHS.fullmatch(path)
    if match is None:
        return None
    context_id = int(match[1])
    if context_id > INT64_MAX:
        return None  # the operation answers the path parameter's 422
    return OPERATIONS[match[2]], context_id


@cache
def _route_template(name: str) -> ResolverMatch:
    return resolve(f"/api/v1/contexts/1/{name}")


def _route_match(name: str, context_id: int) -> ResolverMatch:
    """What `resolve` answers for the route's path, without trying the site's patterns one by
    one: its match for another context, with this one's id."""
    template = _route_template(name)
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


def answer(request: HttpRequest, operation: Operation, context_id: int) -> HttpResponse | None:
    """The operation's answer to `request`, or None when its body is for ninja to refuse."""
    try:
        body = operation.schema.model_validate(
            common.json_loads(request.body), context={"request": request}
        )
    except Exception:  # noqa: BLE001 - any refusal is ninja's to word
        return None
    # The key check reads the route's context from its match.
    request.resolver_match = _route_match(request.path_info.rsplit("/", 1)[1], context_id)
    try:
        key = operation.auth(request)
    except Exception as exc:  # noqa: BLE001 - answered as the operation answers it
        return api.on_exception(request, exc)
    if not key:
        return api.on_exception(request, AuthenticationError())
    request.auth = key
    try:
        return operation.view(request, context_id=context_id, body=body)
    except Exception as exc:  # noqa: BLE001 - answered as the operation answers it
        return api.on_exception(request, exc)
