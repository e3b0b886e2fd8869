"""Request-body limit for the API (`/api/`, and OTLP's `/v1/traces`): 413 before a body over
`MAX_REQUEST_BODY_BYTES` is read.

A declared Content-Length is checked without reading anything. A body streamed without a
length (chunked transfer encoding) is read at most limit + 1 bytes: more than the limit is a
413; otherwise the bytes read become the request body.
"""

from __future__ import annotations

import io

from django.conf import settings
from django.http import JsonResponse

from memory_app.url_prefixes import API_PREFIXES

BODYLESS = {"GET", "HEAD", "OPTIONS", "TRACE"}


def _too_large(limit: int) -> JsonResponse:
    return JsonResponse({"detail": f"request body is over the limit of {limit} bytes"}, status=413)


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
        limit = settings.MAX_REQUEST_BODY_BYTES
        declared = request.META.get("CONTENT_LENGTH")
        if declared:
            try:
                length = int(declared)
            except ValueError:
                return JsonResponse({"detail": "Content-Length is not a number"}, status=400)
            return _too_large(limit) if length > limit else None
        stream = self._lengthless_stream(request)
        if stream is None:
            return None
        data = stream.read(limit + 1)
        if len(data) > limit:
            return _too_large(limit)
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
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length >= GC_PAUSE_MIN_BODY:
                from memory_app.db import gc_paused

                with gc_paused():
                    return self.get_response(request)
        return self.get_response(request)
