"""LangGraph's store over agentmemory's long-term memories: `AgentMemoryStore(BaseStore)`.

    from memory_app.client.langgraph import AgentMemoryStore
    store = AgentMemoryStore("http://localhost:8000", "am_...", scope_keys={"user": "ada"})
    store.put(("memories", "ada"), "food", {"likes": "pizza"})
    store.search(("memories",), filter={"likes": "pizza"})

Each item is a long-term memory of the key subset `scope_keys` (default: the subset the API key
is confined to), so operators see and curate it in the dashboard with the others. Operations
answer as LangGraph's `InMemoryStore` answers them; one `batch` runs its reads first, then its
writes (the last write of one namespace and key wins), as `InMemoryStore.batch` does. Search
with a `query` ranks by the server's configured embedding model (the store's own `index` and a
put's `index` fields are the server's business: it embeds the whole value). TTLs are in
minutes (`ttl={"default_ttl": 60, "refresh_on_read": True}`), as LangGraph's `TTLConfig` says.

Needs `langgraph` (the `langchain` extra); no Django.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import httpx
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)

from memory_app.client.client import (
    RETRY_STATUSES,
    ApiError,
    MemoryClient,
    NotFoundError,
    ServerUnreachable,
    _encode,
)

RETRYABLE = (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError, httpx.TimeoutException)


def _raise_as_in_memory_store(exc: ApiError) -> None:
    """A filter that `InMemoryStore` cannot evaluate raises its Python error here too."""
    raised = {"TypeError": TypeError, "ValueError": ValueError}.get(exc.body.get("python_error"))
    if raised is not None:
        raise raised(exc.detail) from exc


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _item(data: dict[str, Any], *, search: bool) -> Item:
    fields = {
        "namespace": tuple(data["namespace"]),
        "key": data["key"],
        "value": data["value"],
        "created_at": _time(data["created_at"]),
        "updated_at": _time(data["updated_at"]),
    }
    if search:
        return SearchItem(**fields, score=data.get("score"))
    return Item(**fields)


class AgentMemoryStore(BaseStore):
    """A LangGraph `BaseStore` whose items are the server's long-term memories."""

    supports_ttl = True

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        scope_keys: dict[str, Any] | None = None,
        ttl: TTLConfig | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.25,
        transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.scope_keys = scope_keys
        self.ttl_config = ttl
        self._client = MemoryClient(
            base_url, api_key, timeout=timeout, retries=retries, backoff=backoff,
            transport=transport,
        )  # fmt: skip
        self._async_args = {
            "base_url": base_url.rstrip("/") + "/api/v1/",
            "headers": {"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            "timeout": timeout,
            "transport": async_transport,
        }

    def close(self) -> None:
        self._client.close()

    # --- the ops as requests ------------------------------------------------------------------
    def _scoped(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.scope_keys is not None:
            body["scope_keys"] = self.scope_keys
        return body

    def _request(self, op: Op) -> tuple[str, str, dict[str, Any]]:
        """(method, path, body) of one op."""
        if isinstance(op, GetOp):
            body = {"namespace": list(op.namespace), "key": op.key, "refresh_ttl": op.refresh_ttl}
            return "POST", "store/items/get", self._scoped(body)
        if isinstance(op, SearchOp):
            body = {
                "namespace_prefix": list(op.namespace_prefix),
                "filter": op.filter,
                "query": op.query,
                "limit": op.limit,
                "offset": op.offset,
                "refresh_ttl": op.refresh_ttl,
            }
            return "POST", "store/items/search", self._scoped(body)
        if isinstance(op, ListNamespacesOp):
            body: dict[str, Any] = {
                "max_depth": op.max_depth,
                "limit": op.limit,
                "offset": op.offset,
            }
            for condition in op.match_conditions or ():
                if condition.match_type in body:
                    raise ValueError(f"one {condition.match_type} condition at most")
                body[condition.match_type] = list(condition.path)
            return "POST", "store/namespaces", self._scoped(body)
        if isinstance(op, PutOp):
            body = {"namespace": list(op.namespace), "key": op.key}
            if op.value is None:
                return "POST", "store/items/delete", self._scoped(body)
            body |= {"value": dict(op.value), "ttl": op.ttl}
            return "PUT", "store/items", self._scoped(body)
        raise ValueError(f"unknown operation {type(op).__name__}")

    @staticmethod
    def _result(op: Op, answer: Any) -> Result:
        if isinstance(op, GetOp):
            return None if answer is None else _item(answer, search=False)
        if isinstance(op, SearchOp):
            return [_item(i, search=True) for i in answer["items"]]
        if isinstance(op, ListNamespacesOp):
            return [tuple(ns) for ns in answer["namespaces"]]
        return None

    @staticmethod
    def _ordered(ops: Iterable[Op]) -> tuple[list[Op], list[int], dict[tuple, int]]:
        """The ops, the indexes of the reads, and of the last put per namespace and key."""
        ops = list(ops)
        reads = [n for n, op in enumerate(ops) if not isinstance(op, PutOp)]
        puts = {(op.namespace, op.key): n for n, op in enumerate(ops) if isinstance(op, PutOp)}
        return ops, reads, puts

    # --- BaseStore ----------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops, reads, puts = self._ordered(ops)
        results: list[Result] = [None] * len(ops)
        for n in [*reads, *puts.values()]:
            method, path, body = self._request(ops[n])
            try:
                answer = self._client.request(method, path, json_body=body)
            except NotFoundError:
                if not isinstance(ops[n], GetOp):
                    raise
                answer = None
            except ApiError as exc:
                _raise_as_in_memory_store(exc)
                raise
            results[n] = self._result(ops[n], answer)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops, reads, puts = self._ordered(ops)
        results: list[Result] = [None] * len(ops)
        async with httpx.AsyncClient(**self._async_args) as http:
            for n in [*reads, *puts.values()]:
                method, path, body = self._request(ops[n])
                try:
                    answer = await self._arequest(http, method, path, body)
                except NotFoundError:
                    if not isinstance(ops[n], GetOp):
                        raise
                    answer = None
                except ApiError as exc:
                    _raise_as_in_memory_store(exc)
                    raise
                results[n] = self._result(ops[n], answer)
        return results

    async def _arequest(
        self, http: httpx.AsyncClient, method: str, path: str, body: dict[str, Any]
    ) -> Any:
        """`MemoryClient.request`'s retries (every store request is idempotent), awaited."""
        content, headers = _encode(body), {"Content-Type": "application/json"}
        retries, backoff = self._client.retries, self._client.backoff
        for attempt in range(retries + 1):
            try:
                response = await http.request(method, path, content=content, headers=headers)
            except RETRYABLE as exc:
                if attempt == retries:
                    raise ServerUnreachable(
                        f"{method} {path}: no answer after {attempt + 1} attempts "
                        f"({type(exc).__name__}: {exc})"
                    ) from exc
            else:
                if response.status_code not in RETRY_STATUSES or attempt == retries:
                    return MemoryClient._answer(response, raw=False)
            await asyncio.sleep(backoff * (2**attempt))
        raise AssertionError("unreachable")
