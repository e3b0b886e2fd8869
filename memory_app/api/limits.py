"""Request-body limit for the API (`/api/`, and OTLP's `/v1/traces`): 413 before a body over
`MAX_REQUEST_BODY_BYTES` is read.

A declared Content-Length is checked without reading anything. A body streamed without a
length (chunked transfer encoding) is read at most limit + 1 bytes: more than the limit is a
413; otherwise the bytes read become the request body.

The backup import (`IMPORT_PATH`) reads its body line by line and never whole, so it has a limit
of its own, `MAX_IMPORT_BYTES`: a declared length is checked the same way, and a body without
one is counted as the import reads it (`CappedStream`), the import answering 413 and writing
nothing once it is past the limit.
"""

from __future__ import annotations

import io

from django.conf import settings
from django.http import JsonResponse

from memory_app.errors import BodyTooLarge
from memory_app.url_prefixes import API_PREFIXES, IMPORT_PATH

BODYLESS = {"GET", "HEAD", "OPTIONS", "TRACE"}


def _too_large(limit: int, setting: str) -> JsonResponse:
    return JsonResponse({"detail": str(BodyTooLarge(limit, setting))}, status=413)


def _limit(request) -> tuple[int, str]:
    """The body limit of `request`'s path, and the setting that sets it."""
    if request.path == IMPORT_PATH:
        return settings.MAX_IMPORT_BYTES, "AGENTMEMORY_MAX_IMPORT_BYTES"
    return settings.MAX_REQUEST_BODY_BYTES, "AGENTMEMORY_MAX_BODY_BYTES"


def _declared_length(request) -> int | None:
    """The body length the request declares (Content-Length); None without one or for one that
    is not a number."""
    try:
        return int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None


def passed_on_untouched(request) -> bool:
    """Whether this module's middleware would pass the API request `request` on as it is: a
    body of a declared length within its limit (no 400 or 413, nothing read) and below the GC
    pause's size (`BulkBodyGcMiddleware`). A request answered without that middleware
    (agentmemory_site.api_handler.DirectAnswers) asks this first."""
    length = _declared_length(request)
    return length is not None and 0 <= length <= _limit(request)[0] and length < GC_PAUSE_MIN_BODY


class CappedStream:
    """A body stream that raises `BodyTooLarge` once more than `limit` bytes are read from it."""

    def __init__(self, stream, limit: int, setting: str) -> None:
        self.stream, self.limit, self.setting, self.seen = stream, limit, setting, 0

    def _count(self, data: bytes) -> bytes:
        self.seen += len(data)
        if self.seen > self.limit:
            raise BodyTooLarge(self.limit, self.setting)
        return data

    def read(self, size: int = -1) -> bytes:
        return self._count(self.stream.read(size))

    def readline(self, size: int = -1) -> bytes:
        return self._count(self.stream.readline(size))

    def close(self) -> None:
        self.stream.close()


class RequestBodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(API_PREFIXES) and request.method not in BODYLESS:
            response = self._check(request)
            if response is not None:
                return response
        return self.get_response(request)

    def _check(self, request) -> JsonResponse | None:
        importing = request.path == IMPORT_PATH
        limit, setting = _limit(request)
        if request.META.get("CONTENT_LENGTH"):
            length = _declared_length(request)
            if length is None:
                return JsonResponse({"detail": "Content-Length is not a number"}, status=400)
            return _too_large(limit, setting) if length > limit else None
        stream = self._lengthless_stream(request)
        if stream is None:
            return None
        if importing:
            request._stream = CappedStream(stream, limit, setting)
            return None
        data = stream.read(limit + 1)
        if len(data) > limit:
            return _too_large(limit, setting)
        # Hand the bytes already read to Django as the body.
        request._body = data
        request._stream = io.BytesIO(data)
        return None

    @staticmethod
    def _lengthless_stream(request):
        environ = getattr(request, "environ", None)
        if environ is not None and "wsgi.input" in environ:
            # WSGI: Django reads nothing without a length; only a chunked body carries data.
            if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
                return environ["wsgi.input"]
            return None
        # ASGI: the server has already spooled the whole body into request._stream.
        return getattr(request, "_stream", None)


# From this body size on, an API write runs with the cyclic garbage collector paused.
GC_PAUSE_MIN_BODY = 64 * 1024


class BulkBodyGcMiddleware:
    """API writes with a large body (a batch of messages, steps or vectors) run with the cyclic
    GC paused from parsing to response (`memory_app.db.gc_paused`): the tens of thousands of objects
    a 1,000-item body becomes live for the whole request, and young collections during it
    moved them to the oldest generation, where each few batches cost a full collection of the
    heap. Paused, they are freed by reference counting when the request ends."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(API_PREFIXES) and request.method not in BODYLESS:
            if (_declared_length(request) or 0) >= GC_PAUSE_MIN_BODY:
                from memory_app.db import gc_paused

                with gc_paused():
                    return self.get_response(request)
        return self.get_response(request)
