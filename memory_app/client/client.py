"""A typed Python client for the agentmemory Agent API: httpx and orjson, no Django.

    from memory_app.client import MemoryClient
    mc = MemoryClient("http://localhost:8000", api_key="am_...")
    ctx = mc.context(keys={"user": "ada", "chat": "42"})
    mc.append_message(ctx["id"], role="user", text="hi", client_id="m1")

One `httpx.Client` is kept per MemoryClient (connection reuse). Connection errors, timeouts and
503 answers are retried with exponential backoff: safe, because writes carry client ids and the
server answers a repeated write with the stored row. A message, run, step or smolagents import
sent without a client id gets a fresh one (a UUID4) before its first attempt, and every retry
repeats it: a write whose answer was lost after the server committed it is stored once. Errors
raise `ApiError` carrying the server's `detail` (and, for 409, `differences`); a server that
cannot be reached at all raises `ServerUnreachable` once the retries are spent. `retries` and
`backoff` (seconds before the first retry, doubled each time) are constructor arguments.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import orjson

RETRY_STATUSES = {502, 503, 504}


class ApiError(Exception):
    """The server answered with an error status; `detail` is its message."""

    def __init__(self, status: int, detail: Any, differences: dict | None = None, body: Any = None):
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail
        self.differences = differences or {}
        # The whole error answer, for the fields a caller knows beyond `detail`.
        self.body = body if isinstance(body, dict) else {}


class NotFoundError(ApiError):
    pass


class ServerUnreachable(ApiError):
    """No answer at all (connection refused, timed out, dropped) after every retry."""

    def __init__(self, detail: str):
        super().__init__(0, detail)

    def __str__(self) -> str:
        return str(self.detail)


class ConflictError(ApiError):
    pass


def _without_none(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def _plain_vector(vector: Any) -> Any:
    """A vector as the encoder can write it: a numpy array stays an array (orjson writes its
    numbers straight from the buffer, several times faster than from a list of Python floats);
    other sequences become lists of floats."""
    if vector is None:
        return None
    if type(vector).__module__ == "numpy":
        return vector
    return vector.tolist() if hasattr(vector, "tolist") else [float(x) for x in vector]


def _as_list(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _encode(body: Any) -> bytes:
    """A request body as JSON: orjson (numpy arrays and scalars included); the standard library
    for what orjson refuses (integers beyond 64 bits, arrays it cannot read in place)."""
    try:
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        return json.dumps(body, default=_as_list).encode()


def _new_client_id() -> str:
    return str(uuid.uuid4())


def _by_id(kind: str, item_id: int, context_id: int | None) -> str:
    """The path of a message, run or step: under its context when the caller knows it (routed
    to one shard on a distributed store), else by id alone (answered, marked superseded)."""
    if context_id is None:
        return f"{kind}/{item_id}"
    return f"contexts/{context_id}/{kind}/{item_id}"


def _with_client_id(item: dict[str, Any]) -> dict[str, Any]:
    """`item`, or a copy of it with a fresh client id when it has none (the server treats an empty
    one as none). A copy: the caller's dict is not changed."""
    if item.get("client_id"):
        return item
    return {**item, "client_id": _new_client_id()}


def _with_vector(item: dict[str, Any], vector: Any, vector_model: str | None) -> dict[str, Any]:
    """`item` with `vector` (when given) and the default `vector_model` for an item with a vector
    and no model of its own."""
    out = dict(item)
    if vector is not None:
        out["vector"] = vector
    if "vector" in out:
        out["vector"] = _plain_vector(out["vector"])
        if vector_model is not None:
            out.setdefault("vector_model", vector_model)
    return out


class MemoryClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.25,
        transport: httpx.BaseTransport | None = None,
    ):
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1/",
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )

    # --- plumbing --------------------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict | None = None,
        content: Any = None,
        raw: bool = False,
    ) -> Any:
        params = {k: v for k, v in (params or {}).items() if v is not None}
        headers = None
        if json_body is not None:
            content, headers = _encode(json_body), {"Content-Type": "application/json"}
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(
                    method, path.lstrip("/"), params=params, content=content, headers=headers
                )
            except (
                httpx.ConnectError,
                httpx.ReadError,
                httpx.RemoteProtocolError,
                httpx.TimeoutException,
            ) as exc:
                if attempt == self.retries:
                    raise ServerUnreachable(
                        f"{method} {self._http.base_url}{path.lstrip('/')}: no answer after "
                        f"{attempt + 1} attempts ({type(exc).__name__}: {exc})"
                    ) from exc
            else:
                if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                    return self._answer(response, raw=raw)
            time.sleep(self.backoff * (2**attempt))
        raise AssertionError("unreachable")

    @staticmethod
    def _answer(response: httpx.Response, *, raw: bool) -> Any:
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {"detail": response.text}
            detail = body.get("detail", body) if isinstance(body, dict) else body
            differences = body.get("differences") if isinstance(body, dict) else None
            cls = {404: NotFoundError, 409: ConflictError}.get(response.status_code, ApiError)
            raise cls(response.status_code, detail, differences, body)
        if raw:
            return response.text
        return response.json() if response.content else None

    # --- contexts --------------------------------------------------------------------------------
    def context(
        self, *, keys: dict[str, Any], title: str | None = None, metadata: dict | None = None
    ) -> dict:
        """Get or create the context for `keys`."""
        return self.request(
            "POST", "contexts", json_body={"keys": keys, "title": title, "metadata": metadata}
        )

    def get_context(self, context_id: int) -> dict:
        return self.request("GET", f"contexts/{context_id}")

    def list_contexts(
        self, *, keys: dict | None = None, cursor: str | None = None, limit: int | None = None
    ) -> dict:
        return self.request(
            "GET",
            "contexts",
            params={"keys": json.dumps(keys) if keys else None, "cursor": cursor, "limit": limit},
        )

    def update_context(
        self, context_id: int, *, title: str | None = None, metadata: dict | None = None
    ) -> dict:
        return self.request(
            "PATCH", f"contexts/{context_id}", json_body={"title": title, "metadata": metadata}
        )

    # --- messages --------------------------------------------------------------------------------
    def append_message(
        self,
        context_id: int,
        *,
        vector: Any = None,
        vector_model: str | None = None,
        **message: Any,
    ) -> dict:
        """`vector`: the client's embedding of the text (a list or numpy array), stored with the
        message under `vector_model` (default: the server's configured model)."""
        message = _with_client_id(_with_vector(message, vector, vector_model))
        return self.request("POST", f"contexts/{context_id}/messages", json_body=message)

    def append_messages(
        self,
        context_id: int,
        messages: list[dict[str, Any]],
        *,
        vectors: Any = None,
        vector_model: str | None = None,
        full: bool = False,
    ) -> Any:
        """Up to 1,000 messages, all or nothing. `vectors`: one embedding per message (a list of
        lists or a 2-D numpy array, None for a message without one), stored with the messages under
        `vector_model` (default: the server's configured model); a message dict may also carry its
        own `vector` / `vector_model`. The answer's `messages` hold each message's `id`, `seq`
        and `client_id`; `full=True` asks for each stored message whole."""
        if vectors is not None:
            if len(vectors) != len(messages):
                raise ValueError(f"{len(vectors)} vectors for {len(messages)} messages")
            messages = [
                _with_vector(m, v, vector_model) for m, v in zip(messages, vectors, strict=True)
            ]
        elif vector_model is not None:
            messages = [_with_vector(m, None, vector_model) for m in messages]
        messages = [_with_client_id(m) for m in messages]
        return self.request(
            "POST",
            f"contexts/{context_id}/messages/batch",
            json_body={"messages": messages},
            params={"return": "full"} if full else None,
        )

    def list_messages(self, context_id: int, **params: Any) -> dict:
        return self.request("GET", f"contexts/{context_id}/messages", params=params)

    def get_message(self, message_id: int, *, context_id: int | None = None) -> dict:
        return self.request("GET", _by_id("messages", message_id, context_id))

    def edit_message(self, message_id: int, *, context_id: int | None = None, **changes) -> dict:
        path = _by_id("messages", message_id, context_id)
        return self.request("PATCH", path, json_body=changes)

    def prune_messages(self, context_id: int, ids: list[int], note: str = "") -> Any:
        return self.request(
            "POST", f"contexts/{context_id}/messages/prune", json_body={"ids": ids, "note": note}
        )

    def restore_messages(self, context_id: int, ids: list[int], note: str = "") -> Any:
        return self.request(
            "POST", f"contexts/{context_id}/messages/restore", json_body={"ids": ids, "note": note}
        )

    # --- runs and steps --------------------------------------------------------------------------
    def create_run(self, context_id: int, **run: Any) -> dict:
        return self.request("POST", f"contexts/{context_id}/runs", json_body=_with_client_id(run))

    def list_runs(self, context_id: int, **params: Any) -> dict:
        return self.request("GET", f"contexts/{context_id}/runs", params=params)

    def get_run(self, run_id: int, *, context_id: int | None = None) -> dict:
        return self.request("GET", _by_id("runs", run_id, context_id))

    def append_steps(
        self, run_id: int, steps: list[dict[str, Any]], *, context_id: int | None = None
    ) -> Any:
        steps = [_with_client_id(s) for s in steps]
        path = _by_id("runs", run_id, context_id) + "/steps"
        return self.request("POST", path, json_body={"steps": steps})

    def list_steps(self, run_id: int, *, context_id: int | None = None, **params: Any) -> Any:
        return self.request("GET", _by_id("runs", run_id, context_id) + "/steps", params=params)

    def get_step(self, step_id: int, *, context_id: int | None = None) -> dict:
        return self.request("GET", _by_id("steps", step_id, context_id))

    def finish_run(
        self,
        run_id: int,
        *,
        status: str,
        final_answer: Any = None,
        context_id: int | None = None,
        **tokens: Any,
    ) -> dict:
        return self.request(
            "POST",
            _by_id("runs", run_id, context_id) + "/finish",
            json_body={"status": status, "final_answer": final_answer, **tokens},
        )

    # --- selectors and long-term memory (called by path) --------------------
    def select(self, context_id: int, **options: Any) -> Any:
        return self.request("POST", f"contexts/{context_id}/select", json_body=options)

    def record_memory(self, **record: Any) -> dict:
        """POST /memories: `context_id` and/or `scope_keys`, then `content`, `contents` (shared
        `thinking`) or `items`; optional kind, keywords, metadata, source_message_id/step_id.
        Answers `{"items": [{"memory": {...}, "created": bool}]}`; safe to retry (the server
        returns the stored record for content already in the scope). Vectors: `vector` (with
        `content`) or `items[].vector`, lists or numpy arrays, under `vector_model` (default: the
        server's configured model)."""
        if "vector" in record:
            record["vector"] = _plain_vector(record["vector"])
        if record.get("items"):
            record["items"] = [
                _with_vector(i, None, None) if "vector" in i else i for i in record["items"]
            ]
        return self.request("POST", "memories", json_body=_without_none(record))

    def retrieve_memories(self, **query: Any) -> dict:
        """POST /memories/retrieve: `context_id`, `keywords` (up to `limit` each) and/or `query`,
        optional kinds, include_archived. Answers `{"items": [{..., "score", "reason"}]}`."""
        return self.request("POST", "memories/retrieve", json_body=_without_none(query))

    def get_memory(self, memory_id: int) -> dict:
        return self.request("GET", f"memories/{memory_id}")

    def memory_status(self, memory_ids: list[int]) -> dict:
        """`{"items": [memory, ...], "missing": [id, ...]}`, each memory with its review
        `status` (proposed, live, rejected, merged)."""
        return self.request("GET", "memories/status", params={"ids": list(memory_ids)})

    # --- smolagents ------------------------------------------------------------------------------
    def import_smolagents_run(
        self,
        context_id: int,
        *,
        steps: list[dict],
        system_prompt: str = "",
        client_id: str | None = None,
        **extra: Any,
    ) -> dict:
        client_id = client_id or _new_client_id()
        body = {"steps": steps, "system_prompt": system_prompt, "client_id": client_id, **extra}
        return self.request("POST", f"contexts/{context_id}/smolagents/runs", json_body=body)

    def export_smolagents_run(self, run_id: int, *, include_pruned: bool = False) -> dict:
        return self.request(
            "GET", f"runs/{run_id}/smolagents", params={"include_pruned": include_pruned}
        )

    def append_smolagents_steps(self, run_id: int, *, steps: list[dict], start_index: int) -> dict:
        return self.request(
            "POST",
            f"runs/{run_id}/smolagents/steps",
            json_body={"steps": steps, "start_index": start_index},
        )

    def run_messages(self, run_id: int, *, summary_mode: bool = False) -> list[dict]:
        """The run as smolagents `write_memory_to_messages(summary_mode)` (ChatMessage dicts)."""
        return self.request("GET", f"runs/{run_id}/messages", params={"summary_mode": summary_mode})

    # --- AgentScope ------------------------------------------------------------------------------
    def agentscope_state(self, context_id: int, *, format: str = "marks") -> dict:  # noqa: A002
        return self.request(
            "GET", f"contexts/{context_id}/agentscope/state", params={"format": format}
        )

    def agentscope_load_state(self, context_id: int, state: dict, *, replace: bool = False) -> dict:
        return self.request(
            "POST",
            f"contexts/{context_id}/agentscope/state",
            json_body={"state": state, "replace": replace},
        )

    def agentscope_add(
        self,
        context_id: int,
        msgs: list[dict],
        *,
        marks: list[str] | None = None,
        allow_duplicates: bool = False,
    ) -> dict:
        return self.request(
            "POST",
            f"contexts/{context_id}/agentscope/add",
            json_body={"msgs": msgs, "marks": marks or [], "allow_duplicates": allow_duplicates},
        )

    def agentscope_delete(self, context_id: int, msg_ids: list[str]) -> int:
        return self.request(
            "POST", f"contexts/{context_id}/agentscope/delete", json_body={"msg_ids": msg_ids}
        )["count"]

    def agentscope_delete_by_mark(self, context_id: int, marks: list[str]) -> int:
        return self.request(
            "POST", f"contexts/{context_id}/agentscope/delete_by_mark", json_body={"marks": marks}
        )["count"]

    def agentscope_update_messages_mark(
        self,
        context_id: int,
        *,
        new_mark: str | None,
        old_mark: str | None = None,
        msg_ids: list[str] | None = None,
    ) -> int:
        return self.request(
            "POST",
            f"contexts/{context_id}/agentscope/update_messages_mark",
            json_body={"new_mark": new_mark, "old_mark": old_mark, "msg_ids": msg_ids},
        )["count"]

    def agentscope_clear(self, context_id: int) -> int:
        return self.request("POST", f"contexts/{context_id}/agentscope/clear")["count"]

    def agentscope_set_summary(self, context_id: int, summary: str) -> None:
        self.request(
            "PUT", f"contexts/{context_id}/agentscope/summary", json_body={"summary": summary}
        )

    def agentscope_memory(
        self, context_id: int, *, mark: str | None = None, exclude_mark: str | None = None
    ) -> dict:
        return self.request(
            "GET",
            f"contexts/{context_id}/agentscope/memory",
            params={"mark": mark, "exclude_mark": exclude_mark},
        )

    # --- AgentKit --------------------------------------------------------------------------------
    def tool_input(
        self, context_id: int, *, run_id: int | None = None, limit: int | None = None
    ) -> dict:
        return self.request(
            "GET", f"contexts/{context_id}/tool-input", params={"run_id": run_id, "limit": limit}
        )

    def tool_input_query(
        self, context_id: int, *, run_id: int | None = None, limit: int | None = None
    ) -> str:
        return self.request(
            "GET",
            f"contexts/{context_id}/tool-input/query",
            params={"run_id": run_id, "limit": limit},
            raw=True,
        )

    # --- backup ----------------------------------------------------------------------------------
    def export_lines(
        self,
        *,
        context_ids: list[int] | None = None,
        keys: dict | None = None,
        embeddings: bool = False,
    ) -> Iterator[str]:
        """Stream the backup line by line (the server streams it too)."""
        params = {
            "context_id": context_ids,
            "match_keys": json.dumps(keys) if keys else None,
            "embeddings": embeddings,
        }
        params = {k: v for k, v in params.items() if v is not None}
        with self._http.stream("GET", "export", params=params) as response:
            if response.status_code >= 400:
                response.read()
                self._answer(response, raw=True)
            # Lines end at "\n" only: the export writes text unescaped, and a message may hold
            # characters other splitters end a line at (U+2028, \x85, \x1c), which would cut
            # one record in two.
            pending: list[bytes] = []
            for chunk in response.iter_bytes():
                start = 0
                while (end := chunk.find(b"\n", start)) != -1:
                    pending.append(chunk[start:end])
                    yield b"".join(pending).decode("utf-8")
                    pending, start = [], end + 1
                pending.append(chunk[start:])
            if any(pending):
                yield b"".join(pending).decode("utf-8")

    def import_lines(self, lines: Iterable[str]) -> dict:
        body = "".join(line if line.endswith("\n") else line + "\n" for line in lines).encode()
        return self.request("POST", "import", content=body)
