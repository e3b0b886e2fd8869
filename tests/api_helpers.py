"""Builders for API tests: keys, an authenticated JSON client."""

from __future__ import annotations

import json
from typing import Any

from django.test import Client

from memory_app import auth


class ApiClient:
    """Django test client speaking JSON with a bearer key."""

    def __init__(self, secret: str | None):
        self.client = Client()
        self.secret = secret

    def _headers(self) -> dict[str, str]:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.secret}"} if self.secret else {}

    def get(self, path: str, params: dict | None = None):
        return self.client.get(path, params or {}, **self._headers())

    def send(
        self, method: str, path: str, body: Any = None, raw: bytes | str | None = None, **extra
    ):
        data = raw if raw is not None else ("" if body is None else json.dumps(body))
        return self.client.generic(
            method, path, data, content_type="application/json", **self._headers(), **extra
        )

    def post(self, path: str, body: Any = None, **kw):
        return self.send("POST", path, body, **kw)

    def patch(self, path: str, body: Any = None, **kw):
        return self.send("PATCH", path, body, **kw)


def make_key(
    *, scopes=("read", "write"), context_keys: dict | None = None, name: str = "test"
) -> ApiClient:
    issued = auth.apikey_create(name=name, scopes=list(scopes), context_keys=context_keys)
    client = ApiClient(issued.secret)
    client.key = issued.key
    return client


def new_context(client: ApiClient, keys: dict | None = None) -> int:
    response = client.post("/api/v1/contexts", {"keys": keys or {"user": "ada", "chat": "1"}})
    assert response.status_code in (200, 201), response.content
    return response.json()["id"]


def append(client: ApiClient, context_id: int, **message) -> dict:
    message.setdefault("role", "user")
    response = client.post(f"/api/v1/contexts/{context_id}/messages", message)
    assert response.status_code in (200, 201), response.content
    return response.json()
