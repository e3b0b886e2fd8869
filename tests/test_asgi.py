"""The site under ASGI (what `make run` serves): Django answers beside /mcp; the export is whole."""

from __future__ import annotations

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


def test_export_under_asgi_is_the_whole_backup(asgi_live_server):
    # Under ASGI Django reads the export's sync iterator to its end before sending (it warns):
    # an async iterator would stream, but Django's GZip middleware then compresses each chunk
    # as a gzip member of its own, which clients read as a truncated body.
    context = make_context(keys={"user": "ada"}, messages=40)
    make_run(context=context, steps=3)
    secret = auth.apikey_create(name="backup", scopes=["read"]).secret
    expected = b"".join(ApiClient(secret).get("/api/v1/export").streaming_content)
    assert expected.count(b"\n") > 40

    with httpx.stream(
        "GET",
        asgi_live_server.url + "/api/v1/export",
        headers={"Authorization": f"Bearer {secret}", "Accept-Encoding": "gzip"},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        body = b"".join(response.iter_bytes())
    assert body == expected
