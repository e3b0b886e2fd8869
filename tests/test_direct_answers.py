"""The calls answered directly (a selection, a single append: memory_app/api/direct.py, without
the middleware chain, the URL resolver's dispatch and ninja's operation) answer over HTTP
exactly as the chain and ninja answer them: status, headers and body, errors included."""

from __future__ import annotations

import io

import httpx
import orjson
import pytest
from django.conf import settings as django_settings
from django.db import IntegrityError, OperationalError

from agentmemory_site import asgi
from agentmemory_site.api_handler import DIRECT_CHAIN, ApiHandler, DirectAnswers
from memory_app import auth
from memory_app.api import app, direct, selectors
from tests.builders import make_context

pytestmark = pytest.mark.django_db(transaction=True)

# Headers the server adds whatever answered (uvicorn's date and name).
SERVER_HEADERS = {"date", "server"}


@pytest.fixture
def both(asgi_live_server, monkeypatch):
    """`send(method, path, other_path=None, **kw)`: the request sent once as it is answered
    (directly when it can be) and once through the chain (to `other_path` if given: a write's
    twin), as (the first answer, the chain's, whether the first was answered directly)."""
    # Not compressed unless a test asks: an answer near gzip's threshold is compressed or not
    # by chance (the random padding decides whether it comes out shorter).
    http = httpx.Client(
        base_url=asgi_live_server.url, timeout=60, headers={"Accept-Encoding": "identity"}
    )
    direct = asgi.api_app.direct
    assert direct is not None, "the shipped chain is answered directly"
    answered = []
    answer = DirectAnswers.answer

    def recorded(self, request):
        response = answer(self, request)
        answered.append(response is not None)
        return response

    monkeypatch.setattr(DirectAnswers, "answer", recorded)

    def send(method: str, path: str, other_path: str | None = None, **kw):
        answered.clear()
        first = http.request(method, path, **kw)
        ran_direct = answered == [True]
        asgi.api_app.direct = None
        try:
            second = http.request(method, other_path or path, **kw)
        finally:
            asgi.api_app.direct = direct
        return first, second, ran_direct

    yield send
    http.close()


def _same(
    first: httpx.Response, second: httpx.Response, masked: tuple[str, ...] = (), case=None
) -> None:
    """The two answers alike: status, headers in order, body (`masked` fields of a JSON object
    aside). The length aside too when fields are masked, or the body is compressed: each
    answer gzipped gets random padding (the chain's BREACH mitigation)."""
    assert first.status_code == second.status_code, (case, first.content, second.content)
    compressed = first.headers.get("content-encoding") == "gzip"
    skipped = SERVER_HEADERS | ({"content-length"} if masked or compressed else set())
    headers = [(k, v) for k, v in first.headers.multi_items() if k not in skipped]
    assert headers == [(k, v) for k, v in second.headers.multi_items() if k not in skipped], case
    if not masked:
        assert first.content == second.content
        return
    a, b = first.json(), second.json()
    for field in masked:
        a.pop(field, None), b.pop(field, None)
    assert a == b


def _key(**kw) -> dict[str, str]:
    secret = auth.apikey_create(name="direct", scopes=kw.pop("scopes", ["read", "write"]), **kw)
    return {"Authorization": f"Bearer {secret.secret}"}


def test_the_shipped_chain_and_routes_are_answered_directly_and_no_others():
    assert tuple(django_settings.API_MIDDLEWARE) == DIRECT_CHAIN
    assert set(ApiHandler(django_settings.API_MIDDLEWARE, 1).direct.routes) == {
        "select",
        "messages",
    }
    assert ApiHandler(django_settings.API_MIDDLEWARE[:-1], 1).direct is None


def _bound(view):
    return next(
        operation
        for router in app.api._get_bound_routers()
        for path_view in router.path_operations.values()
        for operation in path_view.operations
        if operation.view_func is view
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda op: setattr(op, "throttle_objects", [object()]),
        lambda op: setattr(op, "auth_callbacks", [*op.auth_callbacks, lambda request: True]),
        lambda op: setattr(op, "run", lambda request, **kw: None),
        lambda op: setattr(op, "view_func", lambda request, **kw: None),
        lambda op: setattr(op, "models", op.models[:1]),
    ],
    ids=["throttle", "second key check", "decorated run", "wrapped view", "no body"],
)
def test_a_route_whose_operation_runs_more_is_left_to_the_operation(monkeypatch, change):
    operation = _bound(selectors.select)
    kept = dict(vars(operation))
    try:
        change(operation)
        assert set(direct.routes()) == {"messages"}
    finally:
        vars(operation).clear()
        vars(operation).update(kept)
    assert set(direct.routes()) == {"select", "messages"}


def _scope(path: str, body: bytes, headers: dict[str, str], scheme: str = "http") -> dict:
    sent = {"host": "testserver", "content-type": "application/json", **headers}
    sent["content-length"] = str(len(body))
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in sent.items()],
        "scheme": scheme,
        "server": ("testserver", 443 if scheme == "https" else 80),
        "client": ("127.0.0.1", 5555),
        "root_path": "",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }


def _in_process(handler: ApiHandler, scope: dict, body: bytes):
    """(the direct answer, or None when declined; the chain's answer) to one request."""
    answers = []
    for direct_first in (True, False):
        request, _ = handler.create_request(scope, io.BytesIO(body))
        answers.append(
            handler.direct.answer(request) if direct_first else handler.get_response(request)
        )
    return answers


def _alike(mine, chains) -> None:
    assert mine is not None
    assert (mine.status_code, list(mine.items()), mine.content) == (
        chains.status_code,
        list(chains.items()),
        chains.content,
    )


@pytest.mark.parametrize(
    ("fault", "status"),
    [
        (OperationalError("the server closed the connection"), 503),  # with Retry-After
        (IntegrityError("duplicate key"), 409),
        (RuntimeError("a bug"), 500),  # no handler: Django's own answer
    ],
    ids=["database fault", "conflict", "bug"],
)
def test_an_error_the_view_raises_answers_as_through_the_chain(monkeypatch, fault, status):
    context = make_context(messages=2)
    handler = ApiHandler(django_settings.API_MIDDLEWARE, 1)

    def fails(*args, **kwargs):
        raise fault

    monkeypatch.setattr(selectors, "select_out", fails)
    body = orjson.dumps({"selector": "window", "k": 2})
    scope = _scope(f"/api/v1/contexts/{context.pk}/select", body, _key())
    mine, chains = _in_process(handler, scope, body)
    _alike(mine, chains)
    assert mine.status_code == status


def test_https_answers_carry_the_chains_transport_headers(settings):
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    handler = ApiHandler(django_settings.API_MIDDLEWARE, 1)  # middleware reads settings once
    context = make_context(messages=2)
    body = orjson.dumps({"selector": "window", "k": 2})
    path = f"/api/v1/contexts/{context.pk}/select"
    mine, chains = _in_process(handler, _scope(path, body, _key(), scheme="https"), body)
    _alike(mine, chains)
    assert "includeSubDomains" in mine["Strict-Transport-Security"]
    # Redirected to HTTPS: the chain's answer, declined here.
    settings.SECURE_SSL_REDIRECT = True
    handler = ApiHandler(django_settings.API_MIDDLEWARE, 1)
    mine, chains = _in_process(handler, _scope(path, body, _key()), body)
    assert mine is None and chains.status_code == 301


SELECTIONS = [
    {"selector": "window", "k": 3},
    {"selector": "token_window", "max_tokens": 20},
    {"selector": "search", "mode": "keyword", "query": "message", "k": 2},
    {"selector": "search", "mode": "keyword", "query": "nothing-like-it", "k": 2},
    {"selector": "search", "mode": "semantic", "query": "message", "k": 2},  # no provider
]


@pytest.mark.parametrize("body", SELECTIONS, ids=lambda b: b["selector"] + b.get("mode", ""))
def test_a_selection_answers_as_the_operation_does(both, body):
    context = make_context(messages=6)
    headers = _key()
    path = f"/api/v1/contexts/{context.pk}/select"
    # The second request of a key on a context reads the key with the selection.
    for _ in range(2):
        first, second, ran_direct = both("POST", path, json=body, headers=headers)
        assert ran_direct
        _same(first, second)


def test_a_large_answer_is_compressed_as_the_chain_compresses_it(both):
    context = make_context(messages=30, text="a longer message {i} " * 8)
    headers = {**_key(), "Accept-Encoding": "gzip"}
    body = {"selector": "window", "k": 30}
    first, second, ran_direct = both(
        "POST", f"/api/v1/contexts/{context.pk}/select", json=body, headers=headers
    )
    assert ran_direct and first.headers["Content-Encoding"] == "gzip"
    assert "Accept-Encoding" in first.headers["Vary"]
    assert first.num_bytes_downloaded < len(first.content)
    _same(first, second)


def test_errors_answer_as_the_operation_and_the_chain_answer_them(both, settings):
    context = make_context(messages=2)
    mine = _key()
    foreign = make_context(keys={"tenant": "other"}, messages=1)
    scoped = _key(context_keys={"tenant": "mine"})
    write_only = _key(scopes=["write"])
    path = f"/api/v1/contexts/{context.pk}/select"
    window = {"selector": "window", "k": 2}
    cases = [
        # (path, headers, body or raw bytes, taken directly)
        (path, {}, window, True),  # no key: 401 with its challenge
        (path, {"Authorization": "Bearer am_nope_nope"}, window, True),
        (path, {"Authorization": "Basic abc"}, window, True),
        (path, write_only, window, True),  # 403
        (f"/api/v1/contexts/{foreign.pk}/select", scoped, window, True),  # 404, as unknown
        ("/api/v1/contexts/987654321/select", mine, window, True),
        (path, mine, {"selector": "window", "k": 0}, False),  # 422: ninja's own
        (path, mine, {"selector": "nope"}, False),
        (path, mine, b'{"selector": "window", "k": NaN}', False),  # 400: not RFC 8259 JSON
        (path, mine, b"{not json", False),
        (path, mine, b"", False),
        (path, {}, b"{not json", True),  # the key's 401 before the body's 400
        ("/api/v1/contexts/99999999999999999999/select", mine, window, False),
        (path, mine, {"selector": "search", "mode": "semantic", "query_vector": [0.5]}, True),
    ]
    for url, headers, body, taken in cases:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        kw["headers"] = {"Content-Type": "application/json", **headers}
        first, second, ran_direct = both("POST", url, **kw)
        assert ran_direct == taken, (url, body, first.status_code)
        _same(first, second, case=(url, headers, body))
    # A refused host and a body over the limit are declined here: the chain answers them.
    first, second, ran_direct = both("POST", path, json=window, headers={**mine, "Host": "evil"})
    assert first.status_code == 400 and not ran_direct
    _same(first, second)
    settings.MAX_REQUEST_BODY_BYTES = 20
    first, second, ran_direct = both("POST", path, json=window, headers=mine)
    assert first.status_code == 413 and not ran_direct
    _same(first, second)


def test_appends_answer_as_the_operation_does(both):
    # Each side writes to a context of its own, alike before each step: ids, times and the
    # context differ between the two answers, nothing else.
    first, second = make_context(messages=1).pk, make_context(messages=1).pk
    headers, read_only = _key(), _key(scopes=["read"])
    masked = ("id", "context_id", "created_at", "updated_at")
    steps = [
        ({"role": "user", "text": "hello"}, headers, True, 201),
        (
            {"role": "user", "text": "once", "client_id": "c-1", "metadata": {"b": 1, "a": 2}},
            headers,
            True,
            201,
        ),
        (
            {"role": "user", "text": "once", "client_id": "c-1", "metadata": {"b": 1, "a": 2}},
            headers,
            True,
            200,
        ),  # the stored one
        ({"role": "user", "text": "twice", "client_id": "c-1"}, headers, True, 409),
        ({"role": "user", "text": "no scope"}, read_only, True, 403),
        ({"role": "nobody", "text": "x"}, headers, False, 422),  # ninja's own
    ]
    for body, key, taken, status in steps:
        mine, chains, ran_direct = both(
            "POST",
            f"/api/v1/contexts/{first}/messages",
            f"/api/v1/contexts/{second}/messages",
            json=body,
            headers=key,
        )
        assert (ran_direct, mine.status_code) == (taken, status), mine.content
        _same(mine, chains, masked=masked)


@pytest.mark.parametrize("path", ["/api/v1/contexts/1/select", "/api/v1/import"])
def test_a_body_is_answered_directly_only_where_the_limits_middleware_passes_it_on(settings, path):
    """`limits.passed_on_untouched`, which the direct answers ask, agrees with the two body
    middlewares it stands for: a declared length it accepts is passed on by the body limit
    without a read and runs with the GC on; every other declared length is answered or paused
    by one of them."""
    import gc

    from django.test import RequestFactory

    from memory_app.api import limits
    from memory_app.url_prefixes import IMPORT_PATH

    assert (path == IMPORT_PATH) == path.endswith("import")  # both limits are tried
    settings.MAX_REQUEST_BODY_BYTES = 100
    settings.MAX_IMPORT_BYTES = limits.GC_PAUSE_MIN_BODY * 4
    passed = object()

    def view(request):
        return passed if gc.isenabled() else "paused"

    gc_was = gc.isenabled()
    gc.enable()
    try:
        for length in [
            "0",
            "99",
            "100",
            "101",
            str(limits.GC_PAUSE_MIN_BODY - 1),
            str(limits.GC_PAUSE_MIN_BODY),
            "-1",
            "x1",
            "",
        ]:
            request = RequestFactory().post(path, data=b"", content_type="application/json")
            request.META["CONTENT_LENGTH"] = length
            through_limit = limits.RequestBodyLimitMiddleware(limits.BulkBodyGcMiddleware(view))(
                request
            )
            untouched = through_limit is passed and not hasattr(request, "_body")
            if limits.passed_on_untouched(request):
                assert untouched, length
            elif length.lstrip("-").isdigit() and int(length) >= 0:
                assert not untouched, length  # a 413, or the GC paused
    finally:
        if not gc_was:
            gc.disable()
