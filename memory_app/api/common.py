"""Shared pieces of the Agent API: auth, scopes, visibility helpers, error schema, field types.

Every router imports from here; nothing here imports a router. These helpers are a stable
contract for the routers other modules add (see `memory_app/api/__init__.py`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from django.http import HttpRequest, HttpResponse
from ninja import Path, Schema
from ninja.errors import AuthenticationError, HttpError
from ninja.responses import NinjaJSONEncoder
from ninja.security import HttpBearer
from pydantic import ConfigDict

from memory_app import auth as keys
from memory_app import pipelines
from memory_app.audit import Actor
from memory_app.errors import NotFound
from memory_app.json_values import finite_float, may_hold_long_integer, reject_constant
from memory_app.models import ApiKey, Context, Message, Run, Step
from memory_app.schemas.fields import INT64_MAX

# PostgreSQL integer ranges: larger values would fail in the database, so they answer 422 here.


class Unauthorized(AuthenticationError):
    """A 401 with its RFC 6750 challenge: `Bearer` tells a client which scheme to send;
    `error="invalid_token"` that the key it sent is not one this server accepts."""

    def __init__(self, message: str, *, invalid_token: bool = False):
        super().__init__(message=message)
        self.challenge = 'Bearer error="invalid_token"' if invalid_token else "Bearer"


class ApiKeyAuth(HttpBearer):
    """`Authorization: Bearer am_<prefix>_<secret>`; sets `request.auth` to the ApiKey.

    `deferred`: on a context's route, a well-formed key is read later, with the first of the
    operation's own statements (`settle_key` and `key_read_with`), instead of in a round trip
    of its own; `request.auth` is the ApiKey once it is settled. Every error answer settles it
    first (api/app.py), so a bad key is still a 401 whatever else is wrong with the request.

    `id_suffices`: a context's route whose operation needs only the context's id (an append:
    its statement fails on a missing context) may take a reference by id instead of the
    context's row (`auth.apikey_verify_with_context`)."""

    def __init__(self, *, deferred: bool = False, id_suffices: bool = False):
        super().__init__()
        self.deferred = deferred
        self.id_suffices = id_suffices

    def __call__(self, request: HttpRequest) -> ApiKey | None:
        value = request.headers.get(self.header)
        if not value:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
        return self.authenticate(request, token.strip())

    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | bool:
        # A context's route reads the context with the key (one round trip); `context_for`
        # then answers from it.
        context_id = _route_context_id(request)
        # Only a key this process has verified before on this very context is read late: work
        # done ahead of the check is never done for a key string nobody was given, nor on a
        # context the key was not allowed to see (another tenant's: its timing would tell).
        if self.deferred and context_id is not None:
            size = _sizes.get((keys.hash_secret(token), context_id))
            if size is not None:
                request._pending_key = (token, context_id)  # type: ignore[attr-defined]
                request._known_size = size  # type: ignore[attr-defined]
                return True
        if self.id_suffices:
            return _verified(request, token, context_id, _verify_id_suffices)
        return _verified(request, token, context_id, keys.apikey_verify_with_context)


def _verify_id_suffices(token: str, context_id: int | None):
    return keys.apikey_verify_with_context(token, context_id, id_suffices=True)


def _verified(request: HttpRequest, token: str, context_id: int | None, read) -> ApiKey:
    key, context = read(token, context_id)
    if key is None:
        raise Unauthorized("invalid or revoked API key", invalid_token=True)
    if context_id is not None:
        request._key_context = (context_id, context)  # type: ignore[attr-defined]
        # A reference (`auth.context_reference`) has no count of its own.
        if context is not None and not keys.is_context_reference(context):
            _sizes.remember((key.secret_hash, context_id), context.message_count)
    return key


_UNREAD = object()


def settle_key(request: HttpRequest, rows: list | object = _UNREAD):
    """Check a deferred key (`ApiKeyAuth(deferred=True)`): from `rows`, the key statements'
    first rows read with other statements, else in a round trip now. 401 when the key is bad; then
    `request.auth` is the key and `context_for` answers from the context read with it. Nothing
    to do once settled."""
    pending = request.__dict__.pop("_pending_key", None)
    if pending is None:
        return
    token, context_id = pending
    read = keys.apikey_verify_with_context
    if rows is not _UNREAD:
        read = lambda secret, _context_id: keys.key_context_from_rows(secret, rows)  # noqa: E731
    request.auth = _verified(request, token, context_id, read)


def has_pending_key(request: HttpRequest) -> bool:
    return "_pending_key" in request.__dict__


class _Recent:
    """A bounded map of what this process saw last (the oldest forgotten first), shared by the
    API's threads."""

    def __init__(self, size: int):
        self._items: OrderedDict = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def remember(self, key, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            if len(self._items) > self._size:
                self._items.popitem(last=False)

    def get(self, key):
        return self._items.get(key)


# The message counts of contexts as last seen through a verified key, by (the key's hash, the
# context's id): a key is read with a selection's own read only on the contexts it was allowed
# to see (`ApiKeyAuth(deferred=True)`), and a search sizes its walk from the count.
_sizes = _Recent(10_000)


def known_size(request: HttpRequest) -> int | None:
    """The size of the route's context as last seen through the request's key, when its key is
    read late; None otherwise."""
    return request.__dict__.get("_known_size") if has_pending_key(request) else None


@contextmanager
def key_read_with(request: HttpRequest) -> Iterator[None]:
    """The block's first statements carry the request's deferred key read
    (`pipelines.deferred_read`: in the round trip of its first pipelined transaction or
    `pipelines.read_rows`, else just before its first statement), and nothing the block read is
    handed on before the key passed; the key is settled when the block ends, at the latest. A
    block that raises has the key settled first: a bad key's 401 answers instead of the block's
    own error."""
    token, context_id = request._pending_key  # type: ignore[attr-defined]
    statements = keys.key_context_statements(token, context_id)
    try:
        with pipelines.deferred_read(statements, lambda rows: settle_key(request, rows)):
            yield
    except BaseException:
        settle_key(request)
        raise
    settle_key(request)


def _route_context_id(request: HttpRequest) -> int | None:
    match = getattr(request, "resolver_match", None)
    value = match.kwargs.get("context_id") if match else None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if 0 < number <= INT64_MAX else None


api_key_auth = ApiKeyAuth()
# The append routes' authentication: their operation needs only the context's id.
append_auth = ApiKeyAuth(id_suffices=True)


def count_appended(request: HttpRequest, context: Context, created: int) -> None:
    """An append through a reference (`auth.context_reference`) read no message count: the size
    last seen through the request's key, if any, grows by the messages it stored, as the next
    read would show it (a selection sizes its work from it, `known_size`)."""
    if not keys.is_context_reference(context) or not created:
        return
    key = (request.auth.secret_hash, context.pk)
    size = _sizes.get(key)
    if size is not None:
        _sizes.remember(key, size + created)


def request_key(request: HttpRequest) -> ApiKey:
    settle_key(request)
    return request.auth  # type: ignore[attr-defined]


def require_scope(request: HttpRequest, scope: str) -> ApiKey:
    """The request's key, or 403 when it lacks `scope` ('read', 'write' or 'admin')."""
    return keys.require_scope(request_key(request), scope)


def actor_for(request: HttpRequest) -> Actor:
    """The actor named in audit events for this request (`key:<prefix>`)."""
    return Actor.for_key(request_key(request))


def not_found(what: str, ident: Any) -> HttpError:
    return HttpError(404, f"{what} {ident} not found")


def context_for(request: HttpRequest, context_id: int, *, lock: bool = False) -> Context:
    """The context if the request's key may see it, else 404 (unknown and foreign look alike).
    On a route authenticated with `append_auth` it may instead be a reference by id, nothing
    read: the write that follows answers 404 when the context does not exist."""
    settle_key(request)
    found = getattr(request, "_key_context", None)
    if found is not None and found[0] == context_id and not lock:
        if found[1] is None:
            raise NotFound(f"context {context_id} not found")
        return found[1]
    return keys.context_for_key(request_key(request), context_id, lock=lock)


def run_for(request: HttpRequest, run_id: int, context_id: int | None = None) -> Run:
    return keys.run_for_key(request_key(request), run_id, context_id)


def message_for(request: HttpRequest, message_id: int, context_id: int | None = None) -> Message:
    return keys.message_for_key(request_key(request), message_id, context_id)


def step_for(request: HttpRequest, step_id: int, context_id: int | None = None) -> Step:
    return keys.step_for_key(request_key(request), step_id, context_id)


def superseded(response: HttpResponse, row, kind: str, action: str = "") -> None:
    """Mark an answer of a by-id route kept for old clients: its successor names the row's
    context (`/contexts/{context_id}/{kind}/{id}[/action]`), which routes it to one shard on a
    distributed store (RFC 9745 Deprecation, RFC 8288 Link)."""
    path = f"/api/v1/contexts/{row.context_id}/{kind}/{row.pk}" + (f"/{action}" if action else "")
    response["Deprecation"] = "true"
    response["Link"] = f'<{path}>; rel="successor-version"'


# orjson parses and renders (a 1,000-message batch, or 384,000 vector numbers, in a fraction of
# the standard library's time); the standard library is the strict reference it falls back to.
# orjson refuses what the strict parser refuses (NaN/Infinity literals, numbers that overflow a
# double, raw control characters), so the fallback only runs on input orjson cannot represent
# exactly: lone surrogates (kept so the field checks answer 422 as before), a byte-order mark,
# integers beyond 64 bits (orjson would round them to floats; see
# `json_values.may_hold_long_integer`) and every malformed body (so the 400's message is
# unchanged).
def json_loads(body: bytes) -> Any:
    """A request body as Python values: RFC 8259 only (NaN, Infinity, 1e400 are refused)."""
    if not may_hold_long_integer(body):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body, parse_constant=reject_constant, parse_float=finite_float)


_ENCODER = NinjaJSONEncoder(allow_nan=False)
# The last datetime written, by identity: the rows of one batch share one `created_at` object
# (and `updated_at`), 2,000 formattings of one distinct value.
_last_default: tuple[Any, Any] = (object(), None)


def _default(value: Any) -> Any:
    global _last_default
    last, text = _last_default
    if value is last:
        return text
    if type(value) is datetime:  # immutable: the same object always writes the same text
        text = datetime_text(value)
        _last_default = (value, text)
        return text
    return _ENCODER.default(value)


def datetime_text(value: datetime) -> str:
    """A datetime as ninja's encoder writes it (Django's: milliseconds, UTC as "Z"), without the
    encoder's chain of type checks: every message in an answer carries two or three. A UTC
    time (what the database's times read as) is written by orjson, in its ISO 8601 form with
    "Z" and six digits of microseconds when there are any, cut to milliseconds: the same text
    in a third of `isoformat`'s time."""
    if value.tzinfo is UTC:
        text = orjson.dumps(value, option=orjson.OPT_UTC_Z)
        return (text[1:24] + b"Z" if value.microsecond else text[1:-1]).decode()
    text = value.isoformat()
    if value.microsecond:
        text = text[:23] + text[26:]
    if text.endswith("+00:00"):
        text = text[:-6] + "Z"
    return text


def json_dumps(data: Any) -> bytes:
    """`data` as the API renders it: datetimes, decimals, schemas as ninja's encoder writes them;
    the standard library (no NaN) for what orjson cannot write exactly (integers beyond 64 bits,
    lone surrogates, non-string keys)."""
    try:
        return orjson.dumps(data, default=_default, option=orjson.OPT_PASSTHROUGH_DATETIME)
    except orjson.JSONEncodeError:
        return _ENCODER.encode(data).encode()


class ErrorOut(Schema):
    """Every error: `detail` is a message, a list of validation errors, or a dict (409)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"detail": "context 42 not found"}]})
    detail: Any


class ConflictOut(Schema):
    """409: the client id exists with different content; `differences` maps field to both values."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "detail": "message 'm-1' already exists with different content",
                    "differences": {"text": {"stored": "hello", "sent": "hullo"}},
                }
            ]
        }
    )
    detail: str
    differences: dict[str, Any] = {}


READ_ERRORS = (401, 403, 404, 413, 422)
WRITE_ERRORS = (400, 401, 403, 404, 409, 413, 422)


def responses(ok: dict[int, Any], errors: tuple[int, ...] = READ_ERRORS) -> dict[int, Any]:
    """A ninja `response=` mapping: the success schemas plus documented error schemas."""
    out = dict(ok)
    for code in errors:
        out[code] = ConflictOut if code == 409 else ErrorOut
    return out


ContextId = Annotated[int, Path(ge=1, le=INT64_MAX, description="context id", examples=[7])]
MessageId = Annotated[int, Path(ge=1, le=INT64_MAX, description="message id", examples=[101])]
RunId = Annotated[int, Path(ge=1, le=INT64_MAX, description="run id", examples=[3])]
StepId = Annotated[int, Path(ge=1, le=INT64_MAX, description="step id", examples=[11])]


def json_response(status: int, data: Any):
    """`data` rendered as the API's renderer would (ninja's encoder, no NaN)."""
    return HttpResponse(
        json_dumps(data), status=status, content_type="application/json; charset=utf-8"
    )
