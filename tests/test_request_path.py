"""The API's request path: its own middleware chain under ASGI, and its hot paths in database
round trips (a single append, a semantic search)."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory_app import auth
from tests.api_helpers import make_key, new_context
from tests.builders import make_context, register_models

MODEL = "path-model"


def _vector(seed: int) -> list[float]:
    v = np.random.default_rng(seed).normal(size=384)
    return (v / np.linalg.norm(v)).tolist()


@pytest.mark.django_db(transaction=True)
def test_api_requests_skip_the_dashboard_middleware_and_keep_the_headers(asgi_live_server):
    context = make_context(keys={"user": "ada"}, messages=3)
    secret = auth.apikey_create(name="path", scopes=["read", "write"]).secret
    http = httpx.Client(base_url=asgi_live_server.url, timeout=60)
    headers = {"Authorization": f"Bearer {secret}", "Accept-Encoding": "gzip"}
    response = http.get(f"/api/v1/contexts/{context.pk}/messages", headers=headers)
    assert response.status_code == 200 and len(response.json()["items"]) == 3
    # The security headers stay; nothing of a session (no cookie read or set, no Vary on it).
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src" in response.headers["Content-Security-Policy"]
    assert "set-cookie" not in response.headers
    assert "cookie" not in response.headers.get("Vary", "").lower()
    # A write answers through the same chain (no CSRF check on a bearer-key request).
    posted = http.post(
        f"/api/v1/contexts/{context.pk}/messages",
        json={"role": "user", "text": "over ASGI"},
        headers=headers,
    )
    assert posted.status_code == 201 and posted.json()["seq"] == 4
    missing = http.get("/api/v1/contexts")
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    # The dashboard keeps its middleware: the login page sets its CSRF cookie.
    login = http.get("/accounts/login/")
    assert login.status_code == 200 and "csrftoken" in login.headers.get("set-cookie", "")


@pytest.mark.django_db(transaction=True)
def test_api_requests_run_on_a_fixed_pool_of_threads(asgi_live_server):
    secret = auth.apikey_create(name="path", scopes=["read"]).secret
    http = httpx.Client(base_url=asgi_live_server.url, timeout=60)
    headers = {"Authorization": f"Bearer {secret}"}
    before = {t.name for t in threading.enumerate()}
    for _ in range(30):
        assert http.get("/api/v1/contexts", headers=headers).status_code == 200
    made = {t.name for t in threading.enumerate()} - before
    # A thread per request would leave up to 30 here; the pool's threads are reused.
    assert all(name.startswith("api") for name in made), made
    assert len(made) <= 10
