"""AgentScope 1.x adapters backed by the server: working memory and long-term memory.

    memory = ServerMemory(client, context_id)          # agentscope.memory.MemoryBase semantics
    agent = ReActAgent(
        ..., memory=memory, long_term_memory=ServerLongTermMemory(client, context_id)
    )

`ServerMemory` follows `InMemoryMemory` (v1.0.12+) over the whole `MemoryBase` surface a
`ReActAgent` uses: `add` skips ids already stored unless `allow_duplicates`, `delete(msg_ids)`
removes every entry with those ids and `delete_by_mark(mark)` every entry with any of the marks
(restorable prunes on the server), `update_messages_mark(new_mark, old_mark, msg_ids)` adds,
changes or removes a mark (the agent's hint and compression marks),
`update_compressed_summary(summary)` keeps the compression summary on the context, and
`get_memory(mark, exclude_mark, prepend_summary)` filters by marks and prepends that summary
as a fresh user Msg. agentscope itself is imported lazily, only when Msg objects are built.
"""

from __future__ import annotations

import asyncio
from typing import Any

from memory_app.client.client import ApiError, MemoryClient


def _plain(mark: str | None) -> str | None:
    # ReActAgent passes str-Enum marks (`_MemoryMark.HINT`), whose str() is "_MemoryMark.HINT".
    return None if mark is None else str.__str__(mark)


def _marks(marks: str | list[str] | None) -> list[str]:
    if marks is None:
        return []
    if isinstance(marks, str):
        return [marks]
    if not isinstance(marks, list) or not all(isinstance(m, str) for m in marks):
        raise TypeError(
            f"The mark should be a string, a list of strings, or None, but got {type(marks)}."
        )
    return marks


class ServerMemory:
    def __init__(self, client: MemoryClient, context_id: int):
        self.client = client
        self.context_id = context_id

    async def add(
        self, memories, marks: str | list[str] | None = None, allow_duplicates: bool = False, **kw
    ) -> None:
        if memories is None:
            return
        if not isinstance(memories, list):
            memories = [memories]
        msgs = [m.to_dict() for m in memories]
        await asyncio.to_thread(
            self.client.agentscope_add,
            self.context_id,
            msgs,
            marks=[_plain(m) for m in _marks(marks)],
            allow_duplicates=allow_duplicates,
        )

    async def delete(self, msg_ids: list[str], **kw) -> int:
        return await asyncio.to_thread(
            self.client.agentscope_delete, self.context_id, list(msg_ids)
        )

    async def delete_by_mark(self, mark: str | list[str], *args, **kw) -> int:
        if isinstance(mark, str):
            mark = [mark]
        if not isinstance(mark, list) or not all(isinstance(m, str) for m in mark):
            raise TypeError(
                f"The mark should be a string or a list of strings, but got {type(mark)}."
            )
        return await asyncio.to_thread(
            self.client.agentscope_delete_by_mark, self.context_id, [_plain(m) for m in mark]
        )

    async def update_messages_mark(
        self, new_mark: str | None, old_mark: str | None = None, msg_ids: list[str] | None = None
    ) -> int:
        return await asyncio.to_thread(
            self.client.agentscope_update_messages_mark,
            self.context_id,
            new_mark=_plain(new_mark),
            old_mark=_plain(old_mark),
            msg_ids=None if msg_ids is None else list(msg_ids),
        )

    async def size(self) -> int:
        memory = await asyncio.to_thread(self.client.agentscope_memory, self.context_id)
        return len(memory["content"])

    async def clear(self) -> None:
        await asyncio.to_thread(self.client.agentscope_clear, self.context_id)

    async def update_compressed_summary(self, summary: str) -> None:
        await asyncio.to_thread(self.client.agentscope_set_summary, self.context_id, summary)

    async def get_memory(
        self,
        mark: str | None = None,
        exclude_mark: str | None = None,
        prepend_summary: bool = True,
        **kw,
    ) -> list:
        from agentscope.message import Msg

        if not (mark is None or isinstance(mark, str)):
            raise TypeError(f"The mark should be a string or None, but got {type(mark)}.")
        if not (exclude_mark is None or isinstance(exclude_mark, str)):
            raise TypeError(
                f"The exclude_mark should be a string or None, but got {type(exclude_mark)}."
            )
        memory = await asyncio.to_thread(
            self.client.agentscope_memory,
            self.context_id,
            mark=_plain(mark),
            exclude_mark=_plain(exclude_mark),
        )
        msgs = [Msg.from_dict(m) for m, _ in memory["content"]]
        if prepend_summary and memory["summary"]:
            return [Msg("user", memory["summary"], "user"), *msgs]
        return msgs

    def state_dict(self) -> dict:
        return self.client.agentscope_state(self.context_id, format="marks")

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        if strict and "content" not in state_dict:
            raise KeyError(
                "The state_dict does not contain 'content' keys required for InMemoryMemory."
            )
        state = {
            "_compressed_summary": state_dict.get("_compressed_summary", ""),
            "content": state_dict.get("content", []),
        }
        self.client.agentscope_load_state(self.context_id, state, replace=True)


class ServerLongTermMemory:
    """AgentScope 1.x `LongTermMemoryBase` backed by `/api/v1/memories`, for each
    `long_term_memory_mode` of a `ReActAgent` ("both" by default).

    The agent's tools (agent_control): `record_to_memory(thinking, content)` records every string
    of `content` in one request (`contents` sharing `thinking`, all or nothing) into the context,
    or into the key subset `scope_keys` when given (seen by every context containing those keys).
    `retrieve_from_memory(keywords, limit)` asks for up to `limit` records *per keyword*
    (AgentScope's semantics since 1.0.9), one line per record. Like AgentScope's own
    implementations (Mem0LongTermMemory), both answer a `ToolResponse` and report failures in its
    text rather than raising into the agent's loop.

    The developer's methods (static_control): `retrieve(msg, limit)` recalls up to `limit`
    records per message by its text (the server's full-text and, with vectors, semantic recall),
    one line per record; `record(msgs)` keeps each message's text as a record (the server
    de-duplicates content already in the scope). The server does not summarise: a message
    longer than a record may be, or the agent's own recalled-memory message, is left out.
    """

    def __init__(
        self,
        client: MemoryClient,
        context_id: int,
        *,
        kind: str = "fact",
        scope_keys: dict[str, Any] | None = None,
    ):
        self.client = client
        self.context_id = context_id
        self.kind = kind
        self.scope_keys = scope_keys

    async def record_to_memory(self, thinking: str, content: list[str], **kw) -> Any:
        """Use this function to record important information that you may need later. The
        target content should be specific and concise, e.g. who, when, where, do what, why, how,
        etc.

        Args:
            thinking (`str`):
                Your thinking and reasoning about what to record.
            content (`list[str]`):
                The content to remember, which is a list of strings.
        """
        try:
            answer = await asyncio.to_thread(
                self.client.record_memory,
                context_id=self.context_id,
                scope_keys=self.scope_keys,
                thinking=thinking,
                contents=list(content),
                kind=self.kind,
            )
        except ApiError as exc:
            return _tool_response(f"Error recording memory: {exc}")
        items = answer["items"]
        new = sum(1 for item in items if item["created"])
        ids = [item["memory"]["id"] for item in items]
        # A reviewed key's records are proposals: the agent is told they are not recalled yet.
        waiting = sum(1 for item in items if item["memory"].get("status") == "proposed")
        return _tool_response(
            f"Successfully recorded content to memory: {new} new, "
            f"{len(items) - new} already known"
            + (f", {waiting} waiting for review" if waiting else "")
            + f" (ids {ids})"
        )

    async def retrieve_from_memory(self, keywords: list[str], limit: int = 5, **kw) -> Any:
        """Retrieve the memory based on the given keywords.

        Args:
            keywords (`list[str]`):
                The keywords to search for in the memory, which should be specific and concise,
                e.g. the person's name, the date, the location, etc.
            limit (`int`, optional):
                The maximum number of memories to retrieve per keyword.
        """
        try:
            answer = await asyncio.to_thread(
                self.client.retrieve_memories,
                context_id=self.context_id,
                keywords=list(keywords),
                limit=limit,
            )
        except ApiError as exc:
            return _tool_response(f"Error retrieving memory: {exc}")
        return _tool_response("\n".join(item["content"] for item in answer["items"]))

    async def record(self, msgs, **kw) -> None:
        msgs = _msg_list(msgs, "The input messages must be a list of Msg objects.")
        texts = [
            text
            for msg in msgs
            if msg.name != RECALLED_NAME
            and (text := (msg.get_text_content() or "").strip())
            and len(text) <= MAX_RECORD_CHARS
        ]
        for i in range(0, len(texts), MAX_RECORD_ITEMS):
            await asyncio.to_thread(
                self.client.record_memory,
                context_id=self.context_id,
                scope_keys=self.scope_keys,
                thinking="recorded from the conversation",
                contents=texts[i : i + MAX_RECORD_ITEMS],
                kind=self.kind,
            )

    async def retrieve(self, msg, limit: int = 5, **kw) -> str:
        msgs = _msg_list(msg, "The input message must be a Msg or a list of Msg objects.")
        lines: list[str] = []
        for m in msgs:
            query = (m.get_text_content() or "").strip()
            if not query:
                continue
            answer = await asyncio.to_thread(
                self.client.retrieve_memories, context_id=self.context_id, query=query, limit=limit
            )
            lines += [item["content"] for item in answer["items"] if item["content"] not in lines]
        return "\n".join(lines)


# The name ReActAgent gives the message holding what `retrieve` recalled (never recorded back).
RECALLED_NAME = "long_term_memory"
MAX_RECORD_CHARS = 20_000  # memories.MAX_CONTENT_CHARS
MAX_RECORD_ITEMS = 200  # memories.MAX_ITEMS


def _msg_list(msgs, error: str) -> list:
    from agentscope.message import Msg

    if msgs is None:
        return []
    if isinstance(msgs, Msg):
        msgs = [msgs]
    if not isinstance(msgs, list):
        raise TypeError(error)
    msgs = [m for m in msgs if m is not None]
    if not all(isinstance(m, Msg) for m in msgs):
        raise TypeError(error)
    return msgs


def _tool_response(text: str) -> Any:
    from agentscope.message import TextBlock
    from agentscope.tool import ToolResponse

    return ToolResponse(content=[TextBlock(type="text", text=text)])
