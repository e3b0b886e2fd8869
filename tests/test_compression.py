"""Responses are gzipped when the client accepts it: pages, htmx fragments, API JSON, static
files (through WhiteNoise, so /api/docs' Swagger UI is light); each gzip stream is padded with
random bytes (Django's BREACH mitigation) and the CSRF token is masked anew each time."""

from __future__ import annotations

import gzip
import re

import pytest
from django.test import Client

from tests.api_helpers import make_key
from tests.builders import make_context, make_user

pytestmark = pytest.mark.django_db

GZIP = {"HTTP_ACCEPT_ENCODING": "gzip, deflate, br"}


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_api_docs_and_their_assets_go_out_gzipped_and_light():
    client = Client()
    page = client.get("/api/docs", **GZIP)
    html = gzip.decompress(body(page)).decode()
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html) + ["/api/openapi.json"]
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    wire = len(body(page))
    plain = 0
    for url in assets:
        response = client.get(url, **GZIP)
        assert response.status_code == 200, url
        data = body(response)
        wire += len(data)
        if response.get("Content-Encoding") == "gzip":
            data = gzip.decompress(data)
        else:
            assert len(data) < 2048, f"{url} ({len(data)} bytes) is not compressed"
        plain += len(data)
        assert "Accept-Encoding" in response["Vary"]
    print(f"/api/docs: {plain / 1024:.0f} KB of files, {wire / 1024:.0f} KB on the wire")
    assert plain > 1_500_000 and wire < 600 * 1024


def test_pages_fragments_and_api_json_are_gzipped():
    context = make_context(messages=40)
    client = Client()
    client.force_login(make_user(role="viewer"))
    for url, extra in (
        (f"/contexts/{context.pk}/", {}),
        (f"/contexts/{context.pk}/", {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "history"}),
    ):
        response = client.get(url, **GZIP, **extra)
        assert response.status_code == 200 and response["Content-Encoding"] == "gzip"
        assert b"message 40" in gzip.decompress(response.content)
    api = make_key(scopes=["read"])
    response = Client().get(
        f"/api/v1/contexts/{context.pk}/messages?limit=40",
        HTTP_AUTHORIZATION=f"Bearer {api.secret}",
        **GZIP,
    )
    assert response.status_code == 200 and response["Content-Encoding"] == "gzip"
    assert b"message 40" in gzip.decompress(response.content)


def test_no_compression_unless_asked():
    response = Client().get("/api/docs")
    assert "Content-Encoding" not in response and b"swagger" in response.content


def test_each_page_carries_its_own_csrf_mask_and_random_gzip_padding():
    client = Client()
    client.force_login(make_user(role="viewer"))
    make_context(messages=3)
    pages = [client.get("/contexts/", **GZIP) for _ in range(4)]
    tokens = {
        re.search(rb'"X-CSRFToken": "([^"]+)"', gzip.decompress(p.content)).group(1) for p in pages
    }
    assert len(tokens) == 4  # masked afresh: the compressed size says nothing about the secret
    assert len({len(p.content) for p in pages}) > 1  # random padding in each gzip header
