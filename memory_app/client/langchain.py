"""LangChain chat history backed by the server: a `BaseChatMessageHistory` over `MemoryClient`.

    history = AgentMemoryChatMessageHistory(client, context_id)
    chain = RunnableWithMessageHistory(
        model, lambda session_id: AgentMemoryChatMessageHistory.for_keys(
            client, {"user": "ada", "session": session_id}
        )
    )

Each LangChain message is one message of the context. The message itself, as LangChain writes
it (`message_to_dict`: content, tool calls, tool call id, usage and response metadata,
additional kwargs, id, name), is kept under `metadata["langchain"]`, which the server gives back
as written, key order included; reading the history rebuilds the messages from it, so a model
sees the same prompt after a reload. The server's own fields are filled from it too, so the
dashboard, search and the selectors see a normal conversation: the role (human → user, ai →
assistant, ...), the text, the name, and content blocks (text, a `tool_use` per tool call, a
`tool_result` for a tool message, an `image` per image URL). A message written by something
else (no `metadata["langchain"]`) is read as the LangChain message of its role and text.

`clear()` prunes the context's live messages: the history forgets them, the dashboard can
restore them. The async methods run the sync ones in a thread (`MemoryClient` is synchronous).
langchain-core is the `langchain` extra of this package.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)

from memory_app.client.client import MemoryClient

KEY = "langchain"
# A LangChain message type -> the server's role. Chunks are stored as the message they add up to.
ROLES = {
    "human": "user",
    "HumanMessageChunk": "user",
    "ai": "assistant",
    "AIMessageChunk": "assistant",
    "system": "system",
    "SystemMessageChunk": "system",
    "tool": "tool",
    "ToolMessageChunk": "tool",
    "function": "function",
    "FunctionMessageChunk": "function",
}
SERVER_ROLES = {"system", "user", "assistant", "tool", "function"}
PAGE = 1000  # the server's largest page and batch


class AgentMemoryChatMessageHistory(BaseChatMessageHistory):
    def __init__(self, client: MemoryClient, context_id: int):
        self.client = client
        self.context_id = context_id

    @classmethod
    def for_keys(cls, client: MemoryClient, keys: dict[str, Any]) -> AgentMemoryChatMessageHistory:
        """The history of the context named by `keys` (created on first use)."""
        return cls(client, client.context(keys=keys)["id"])

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return [to_langchain(row) for row in self._rows()]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        items = [to_server(m) for m in messages]
        for start in range(0, len(items), PAGE):
            self.client.append_messages(self.context_id, items[start : start + PAGE])

    def clear(self) -> None:
        ids = [row["id"] for row in self._rows()]
        for start in range(0, len(ids), PAGE):
            self.client.prune_messages(self.context_id, ids[start : start + PAGE])

    async def aget_messages(self) -> list[BaseMessage]:
        return await asyncio.to_thread(lambda: self.messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await asyncio.to_thread(self.add_messages, list(messages))

    async def aclear(self) -> None:
        await asyncio.to_thread(self.clear)

    def _rows(self) -> list[dict[str, Any]]:
        """The context's live messages, oldest first."""
        rows: list[dict[str, Any]] = []
        after = None
        while True:
            page = self.client.list_messages(self.context_id, after=after, limit=PAGE)
            rows += page["items"]
            if not page["has_more"]:
                return rows
            after = page["next_cursor"]


def to_server(message: BaseMessage) -> dict[str, Any]:
    """A LangChain message as the server's message: its own fields, and the whole message kept
    under `metadata["langchain"]`."""
    role = ROLES.get(message.type)
    if role is None:
        own = getattr(message, "role", None)  # a ChatMessage names its own
        role = own if own in SERVER_ROLES else "user"
    item: dict[str, Any] = {
        "role": role,
        "text": message.text,
        "name": message.name or "",
        "metadata": {KEY: message_to_dict(message)},
    }
    blocks = _blocks(message)
    if blocks:
        item["content"] = blocks
    return item


def _blocks(message: BaseMessage) -> list[dict[str, Any]]:
    """The server's content blocks of a message: what the dashboard and the selectors show."""
    blocks: list[dict[str, Any]] = []
    if isinstance(message, ToolMessage):
        block = {"type": "tool_result", "id": message.tool_call_id, "output": message.content}
        return [block | {"name": message.name} if message.name else block]
    parts = [message.content] if isinstance(message.content, str) else message.content
    for part in parts:
        if isinstance(part, str):
            if part:
                blocks.append({"type": "text", "text": part})
        elif part.get("type") == "text" and isinstance(part.get("text"), str):
            blocks.append({"type": "text", "text": part["text"]})
        elif (url := _image_url(part)) is not None:
            blocks.append({"type": "image", "url": url})
    for call in getattr(message, "tool_calls", None) or []:
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "",
                "name": call["name"],
                "input": call["args"],
            }
        )
    return blocks


def _image_url(part: dict[str, Any]) -> str | None:
    """The URL of an image part in OpenAI's (`image_url`) or LangChain's (`image`) shape."""
    if part.get("type") == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
    elif part.get("type") == "image":
        url = part.get("url")
    else:
        return None
    return url if isinstance(url, str) else None


def to_langchain(row: dict[str, Any]) -> BaseMessage:
    """A stored message as LangChain's: the message kept whole when this class wrote it, else
    the message of its role, text and name."""
    kept = (row.get("metadata") or {}).get(KEY)
    if isinstance(kept, dict) and "type" in kept and "data" in kept:
        return messages_from_dict([kept])[0]
    text, name = row["text"], row["name"] or None
    role = row["role"]
    if role == "user":
        return HumanMessage(text, name=name)
    if role == "assistant":
        return AIMessage(text, name=name)
    if role == "system":
        return SystemMessage(text, name=name)
    if role == "tool":
        results = [b for b in row.get("content") or [] if b.get("type") == "tool_result"]
        call_id = results[0]["id"] if results else ""
        return ToolMessage(text, tool_call_id=call_id, name=name)
    if role == "function" and name:
        return FunctionMessage(text, name=name)
    return ChatMessage(text, role=role, name=name)
