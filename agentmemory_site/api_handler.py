"""The Agent API's requests under ASGI (`/api/`, OTLP's `/v1/`): one thread hop each, and only
the middleware an API request needs.

Django's ASGI handler runs a sync site in async mode: every `MiddlewareMixin` middleware's
`process_request`/`process_response` is its own `sync_to_async` call, the signals two more, and
all of them on a thread made for the request (asgiref's `ThreadSensitiveContext`), which then
checks a connection out of the pool. Here the whole sync chain (`settings.API_MIDDLEWARE`: the
dashboard's sessions, CSRF, login, messages, htmx and lockout middleware left out; the
security headers, compression, body limits, read-your-writes and the database-fault answer
kept) runs in one call on a thread of a fixed pool, whose thread-local connection is returned
to the pool when the request finishes, as Django's own `request_finished` handler does.
Request parsing and sending the answer stay Django's (`ASGIHandler`).

The calls an agent makes on every turn (a selection, a single append) are answered directly
(`DirectAnswers`, memory_app/api/direct.py) when that chain would only add its headers: no
redirect, no host refused, a declared body under the limits, no read replica. Such a request
skips the chain's wrappers, the URL resolver's dispatch and ninja's operation, and its answer is
given what the chain would give it on the way out, by the same middleware's own hooks. Any
other request, or any change to the chain, takes the chain.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import response_for_exception
from django.db import close_old_connections
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.gzip import GZipMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import set_script_prefix, set_urlconf
from django.utils.log import log_response

from memory_app import replica
from memory_app.api import direct, limits
from memory_app.middleware import ContentSecurityPolicyMiddleware, DatabaseUnavailableMiddleware

# The chain a direct answer stands for (settings.API_MIDDLEWARE as shipped): with any other,
# every request takes the chain.
DIRECT_CHAIN = (
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.gzip.GZipMiddleware",
    "memory_app.api.traces.OtlpErrorMiddleware",
    "memory_app.api.limits.RequestBodyLimitMiddleware",
    "memory_app.api.limits.BulkBodyGcMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "memory_app.middleware.ContentSecurityPolicyMiddleware",
    "memory_app.middleware.ReplicaPositionMiddleware",
    "memory_app.middleware.DatabaseUnavailableMiddleware",
)


class ApiHandler(ASGIHandler):
    def __init__(self, middleware: list[str], threads: int):
        BaseHandler.__init__(self)
        kept = settings.MIDDLEWARE
        settings.MIDDLEWARE = middleware  # load_middleware reads the setting
        try:
            self.load_middleware(is_async=False)
        finally:
            settings.MIDDLEWARE = kept
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="api")
        self.direct = DirectAnswers() if tuple(middleware) == DIRECT_CHAIN else None

    async def __call__(self, scope, receive, send):
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        loop = asyncio.get_running_loop()
        response = await loop.run_in_executor(self.pool, self._respond, scope, body_file)
        try:
            await self.send_response(response, send)
        except asyncio.CancelledError:
            pass  # the client went away while the answer was sent
        finally:
            if response.streaming:
                await sync_to_async(response.close)()
            body_file.close()

    def _respond(self, scope, body_file):
        """The whole request on this thread: signals, parsing, the sync middleware chain and the
        view; a complete (not streamed) answer is closed here too, which ends the request
        (`request_finished`) on the thread that holds its connection."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.direct and self.direct.answer(request)
            if response is None:
                response = self.get_response(request)
            response._handler_class = self.__class__
        if response.streaming:
            # Its body is read on another thread, with that thread's connection: this one's
            # goes back to the pool now.
            close_old_connections()
        else:
            response.close()
        return response


def _never_called(request):  # a middleware instance needs its next step; these call their hooks
    raise AssertionError("a direct answer's middleware is called by its hooks only")


class DirectAnswers:
    """What `BaseHandler.get_response` does through `DIRECT_CHAIN` for the requests
    memory_app/api/direct.py answers, without the chain. Each middleware of it either passes
    such a request and its answer through unchanged (the OTLP errors' form: not an OTLP path;
    the body limit and the GC pause: a declared body under both; read-your-writes: no replica)
    or is called by its own hooks here, in the chain's order: security redirects and host
    checks on the way in, the database fault's 503 for an exception, the headers, compression
    and Content-Length on the way out."""

    def __init__(self):
        self.security = SecurityMiddleware(_never_called)
        self.gzip = GZipMiddleware(_never_called)
        self.common = CommonMiddleware(_never_called)
        self.xframe = XFrameOptionsMiddleware(_never_called)
        self.csp = ContentSecurityPolicyMiddleware(_never_called)
        self.database_fault = DatabaseUnavailableMiddleware(_never_called)
        self.routes = direct.routes()

    def answer(self, request):
        """The answer to a request `memory_app.api.direct` answers, as the chain would give it;
        None for any other request (or a body for ninja to refuse): the chain answers it."""
        if request.method != "POST" or request.path != request.path_info:
            return None
        found = direct.route_for(request.path_info, self.routes)
        if found is None or not self._passes_through(request):
            return None
        set_urlconf(settings.ROOT_URLCONF)
        try:
            response = direct.answer(request, *found)
        except Exception as exc:  # noqa: BLE001 - as the chain's innermost handler answers it
            response = self.database_fault.process_exception(request, exc)
            if response is None:
                response = response_for_exception(request, exc)
        if response is None:
            return None
        response.headers.setdefault("Content-Security-Policy", self.csp.policy)
        for middleware in (self.xframe, self.common, self.gzip, self.security):
            # Each of the chain's layers answers its own middleware's exception.
            try:
                response = middleware.process_response(request, response)
            except Exception as exc:  # noqa: BLE001 - as the chain answers it
                response = response_for_exception(request, exc)
        response._resource_closers.append(request.close)
        if response.status_code >= 400:
            log_response(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request
            )
        return response

    def _passes_through(self, request) -> bool:
        """Whether the chain's middleware would let `request` through to its view unchanged: a
        declared body under the size limit and the GC pause's threshold, no read replica, and
        no redirect or refusal (host, user agent) on the way in."""
        if not limits.passed_on_untouched(request):
            return False
        if replica.configured():
            return False
        try:
            return (
                self.security.process_request(request) is None
                and self.common.process_request(request) is None
            )
        except Exception:  # noqa: BLE001 - the chain answers it, as it would
            return False
