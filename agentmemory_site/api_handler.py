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
from django.db import close_old_connections
from django.urls import set_script_prefix


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
            response = self.get_response(request)
            response._handler_class = self.__class__
        if response.streaming:
            # Its body is read on another thread, with that thread's connection: this one's
            # goes back to the pool now.
            close_old_connections()
        else:
            response.close()
        return response
