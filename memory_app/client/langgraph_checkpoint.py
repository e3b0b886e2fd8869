"""A LangGraph checkpointer on the agentmemory server: `AgentMemorySaver(BaseCheckpointSaver)`.

    from memory_app.client import MemoryClient
    from memory_app.client.langgraph_checkpoint import AgentMemorySaver
    saver = AgentMemorySaver(MemoryClient("http://localhost:8000", api_key="am_..."),
                             keys={"user": "ada"})
    graph = builder.compile(checkpointer=saver)
    graph.invoke(inputs, {"configurable": {"thread_id": "42"}})

A thread is the context whose keys are `keys` plus `{"langgraph_thread": thread_id}`. The
checkpoints, the channel values they hold and the tasks' pending writes are kept on the server
as this saver's serializer wrote them (a type name and bytes, as LangGraph's own savers keep
them); the server never decodes them. Beside the bytes the saver sends what the logbook shows:
the checkpoint's metadata as JSON (which `list` filters on), a summary of each write (messages
with their tool calls and usage, other values as JSON), an input's task, and whether a task
runs after the checkpoint. The server makes each invocation a run of the thread's context and
each super-step a step of it.

The async methods run the sync ones in a worker thread (the client is httpx's sync client).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)

from memory_app.client.client import MemoryClient

THREAD_KEY = "langgraph_thread"
# Channels whose presence in a checkpoint means a task runs next (LangGraph 1.x triggers every
# node through a `branch:to:<node>` channel; `__start__` holds an input, `__pregel_tasks` sends).
_NEXT_PREFIXES = ("branch:to:", "__start__", "__pregel_tasks")


def _typed(value: tuple[str, bytes]) -> dict[str, Any]:
    return {"type": value[0], "data": base64.b64encode(value[1]).decode("ascii")}


def _untyped(value: dict[str, Any]) -> tuple[str, bytes]:
    return value["type"], base64.b64decode(value["data"])


def _default(value: Any) -> Any:
    for attr in ("model_dump", "_asdict"):
        if callable(getattr(value, attr, None)):
            return getattr(value, attr)()
    if hasattr(value, "value") and type(value).__name__ == "Interrupt":
        return {"interrupt": value.value}
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


def jsonable(value: Any) -> Any:
    """`value` as strict JSON the server accepts (key order kept); what JSON cannot say, as the
    value's repr."""
    try:
        return json.loads(json.dumps(value, default=_default, allow_nan=False))
    except (TypeError, ValueError):
        return repr(value)


def _message(m: BaseMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"type": m.type, "content": jsonable(m.content)}
    for name in ("id", "name", "tool_call_id"):
        if getattr(m, name, None):
            out[name] = getattr(m, name)
    calls = getattr(m, "tool_calls", None)
    if calls:
        out["tool_calls"] = [
            {"id": c.get("id"), "name": c.get("name"), "args": jsonable(c.get("args"))}
            for c in calls
        ]
    usage = getattr(m, "usage_metadata", None)
    if usage:
        out["usage"] = jsonable(dict(usage))
    model = (getattr(m, "response_metadata", None) or {}).get("model_name")
    if model:
        out["model"] = str(model)
    return out


def _all_messages(values: Sequence[Any]) -> bool:
    return all(isinstance(v, BaseMessage) for v in values)


def summarise(value: Any) -> dict[str, Any]:
    """What the logbook shows of a written value."""
    if isinstance(value, BaseMessage):
        return {"message": _message(value)}
    if isinstance(value, (list, tuple)) and value and _all_messages(value):
        return {"messages": [_message(v) for v in value]}
    return {"value": jsonable(value)}


def _task(values: dict[str, Any]) -> str:
    given = values.get("__start__")
    if isinstance(given, dict) and isinstance(given.get("messages"), list) and given["messages"]:
        last = given["messages"][-1]
        content = last.content if isinstance(last, BaseMessage) else last
        return content if isinstance(content, str) else json.dumps(jsonable(content))
    return json.dumps(jsonable(given), ensure_ascii=False)


def _answer(values: dict[str, Any]) -> Any:
    messages = values.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], BaseMessage):
        return jsonable(messages[-1].content)
    return jsonable({k: v for k, v in values.items() if not k.startswith(("__", "branch:"))})


def _epoch(ts: str | None) -> float | None:
    try:
        return datetime.fromisoformat(ts).timestamp() if ts else None
    except ValueError:
        return None


class AgentMemorySaver(BaseCheckpointSaver[int]):
    """LangGraph's checkpointer interface over the agentmemory REST API (see the module doc)."""

    # Checkpoints per request when listing (the server answers at most 1,000).
    page_size = 500

    def __init__(self, client: MemoryClient, *, keys: dict[str, Any] | None = None, serde=None):
        super().__init__(serde=serde)
        self.client = client
        self.keys = dict(keys or {})

    def thread_keys(self, thread_id: Any) -> dict[str, Any]:
        """The context keys of a thread."""
        return {**self.keys, THREAD_KEY: str(thread_id)}

    def _keys_param(self, thread_id: Any) -> str:
        return json.dumps(self.thread_keys(thread_id), ensure_ascii=False)

    # --- sync ------------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        items = self._list_page(
            conf["thread_id"],
            checkpoint_ns=conf.get("checkpoint_ns", ""),
            checkpoint_id=get_checkpoint_id(config),
            limit=1,
        )
        return self._tuple(conf["thread_id"], items[0]) if items else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # noqa: A002 - LangGraph's name
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        if config is None or not config.get("configurable", {}).get("thread_id"):
            raise ValueError("AgentMemorySaver lists one thread's checkpoints: give a thread_id")
        conf = config["configurable"]
        thread_id = conf["thread_id"]
        cursor = get_checkpoint_id(before) if before else None
        left = limit
        while left is None or left > 0:
            size = self.page_size if left is None else min(self.page_size, left)
            items = self._list_page(
                thread_id,
                checkpoint_ns=conf.get("checkpoint_ns"),
                checkpoint_id=conf.get("checkpoint_id"),
                before=cursor,
                metadata_filter=filter,
                limit=size,
            )
            for item in items:
                yield self._tuple(thread_id, item)
            if len(items) < size:
                return
            cursor = items[-1]["checkpoint_id"]
            left = None if left is None else left - len(items)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        rest = dict(checkpoint)
        values: dict[str, Any] = rest.pop("channel_values")  # type: ignore[misc]
        md = get_serializable_checkpoint_metadata(config, metadata)
        blobs = [
            {
                "channel": channel,
                "version": str(version),
                "value": _typed(
                    self.serde.dumps_typed(values[channel]) if channel in values else ("empty", b"")
                ),
            }
            for channel, version in new_versions.items()
        ]
        source = md.get("source")
        body = {
            "keys": self.thread_keys(thread_id),
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": conf.get("checkpoint_id"),
            "checkpoint": _typed(self.serde.dumps_typed(rest)),
            "channel_versions": jsonable(dict(checkpoint["channel_versions"])),
            "metadata": jsonable(md),
            "metadata_typed": _typed(self.serde.dumps_typed(md)),
            "blobs": blobs,
            "ts": _epoch(checkpoint.get("ts")),
            "task": _task(values) if source == "input" else None,
            "finished": source == "loop" and not any(k.startswith(_NEXT_PREFIXES) for k in values),
        }
        if body["finished"]:
            body["answer"] = _answer(values)
        self.client.request("POST", "checkpoints", json_body=body)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        conf = config["configurable"]
        body = {
            "keys": self.thread_keys(conf["thread_id"]),
            "checkpoint_ns": conf.get("checkpoint_ns", ""),
            "checkpoint_id": conf["checkpoint_id"],
            "task_id": task_id,
            "task_path": task_path,
            "writes": [
                {
                    "idx": WRITES_IDX_MAP.get(channel, idx),
                    "channel": channel,
                    "value": _typed(self.serde.dumps_typed(value)),
                    "summary": summarise(value),
                }
                for idx, (channel, value) in enumerate(writes)
            ],
        }
        self.client.request("POST", "checkpoints/writes", json_body=body)

    def delete_thread(self, thread_id: str) -> None:
        self.client.request("DELETE", "checkpoints", params={"keys": self._keys_param(thread_id)})

    # --- async: the sync calls in a worker thread ------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # noqa: A002
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    # --- plumbing --------------------------------------------------------------------------------
    def _list_page(self, thread_id: Any, *, metadata_filter=None, **params: Any) -> list[dict]:
        if metadata_filter:
            params["filter"] = json.dumps(jsonable(metadata_filter), ensure_ascii=False)
        answer = self.client.request(
            "GET", "checkpoints", params={"keys": self._keys_param(thread_id), **params}
        )
        return answer["items"]

    def _tuple(self, thread_id: Any, item: dict[str, Any]) -> CheckpointTuple:
        ns = item["checkpoint_ns"]
        checkpoint = self.serde.loads_typed(_untyped(item["checkpoint"]))
        checkpoint["channel_values"] = {
            b["channel"]: self.serde.loads_typed(_untyped(b["value"])) for b in item["blobs"]
        }
        parent = item["parent_checkpoint_id"]
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": item["checkpoint_id"],
                }
            },
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(_untyped(item["metadata"])),
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": parent,
                    }
                }
                if parent
                else None
            ),
            pending_writes=[
                (w["task_id"], w["channel"], self.serde.loads_typed(_untyped(w["value"])))
                for w in item["writes"]
            ],
        )
