"""The site under ASGI (what `make run` serves): Django answers beside /mcp, and a streamed
export still streams (no sync iterator read to its end in memory first)."""

from __future__ import annotations

import warnings

import httpx
import pytest

from memory_app import auth
from tests.api_helpers import ApiClient
from tests.builders import make_context, make_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_django_answers_beside_mcp(asgi_live_server):
    # Generous timeouts: the first requests load Django's URLconf and templates.
    http = httpx.Client(base_url=asgi_live_server.url, timeout=60)
    assert http.get("/healthz").status_code == 200
    response = http.get("/api/v1/contexts")
    assert response.status_code == 401 and "missing API key" in response.json()["detail"]
    assert http.get("/accounts/login/").status_code == 200


def test_export_streams_line_by_line_under_asgi(asgi_live_server):
    context = make_context(keys={"user": "ada"}, messages=40)
    make_run(context=context, steps=3)
    secret = auth.apikey_create(name="backup", scopes=["read"]).secret
    expected = b"".join(ApiClient(secret).get("/api/v1/export").streaming_content)
    assert expected.count(b"\n") > 40

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with httpx.stream(
            "GET", asgi_live_server.url + "/api/v1/export",
            headers={"Authorization": f"Bearer {secret}"}, timeout=60,
        ) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/x-ndjson"
            body = b"".join(response.iter_raw())
    assert body == expected
    assert not [w for w in caught if "consume synchronous iterators" in str(w.message)]
