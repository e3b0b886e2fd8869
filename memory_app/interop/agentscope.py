"""AgentScope 1.x <-> context messages: pure mappings of `Msg.to_dict()` and memory state dicts.

A `Msg` becomes one Message: its id is the message's client id, its marks are tags, its content
(a string or a list of blocks, tool_use / tool_result included) is kept verbatim in `content`,
its text blocks joined into `text` (for search and token counts), its metadata verbatim, and its
local-time timestamp string verbatim in `source_timestamp`.

AgentScope allows the same id twice (`add(..., allow_duplicates=True)`) while a context allows a
client id once, so a repeat occurrence is stored under `<id>#dup<n>`; export strips the suffix.
Any id must round-trip and distinct ids must never share a client id, so the id is escaped
first (`%` -> `%25`, `#` -> `%23`): an escaped id holds no `#`, the suffix is unambiguous, and an
id that itself ends in `#dup1` is a different client id from the second copy of its prefix.

Two state-dict formats (both 1.x):
- legacy (v1.0.0-v1.0.11): `{"content": [msg_dict, ...]}`
- marks (v1.0.12+): `{"_compressed_summary": str, "content": [[msg_dict, [marks...]], ...]}`
The compressed summary lives on the context (`Context.compressed_summary`).
"""

from __future__ import annotations

import re
from typing import Any

from memory_app.interop import key_order
from memory_app.new_message import NewMessage

FRAMEWORK = "agentscope"
DUP_SEPARATOR = "#dup"
ROLES = ("user", "assistant", "system")
FORMATS = ("marks", "legacy")


class StateFormatError(ValueError):
    """A state dict or Msg dict AgentScope itself would not load."""


def msg_text(content: Any) -> str:
    """The searchable text of a Msg: AgentScope's `get_text_content()` (text blocks,
    newline-joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "\n".join(parts)


MAX_CLIENT_ID = 200  # Message.client_id
_DUP_SUFFIX = re.compile(r"#dup(\d+)\Z")


def escape_id(msg_id: str) -> str:
    """The client id of a Msg id's first copy (no `#` in it, see the module notes)."""
    return msg_id.replace("%", "%25").replace("#", "%23")


def _unescape(text: str) -> str:
    # Every `%` of an escaped id starts `%25` or `%23`, so decoding left to right is exact.
    return re.sub(r"%2[35]", lambda m: "#" if m.group() == "%23" else "%", text)


def split_client_id(client_id: str) -> tuple[str, int]:
    """A stored client id -> (Msg id, copy number); 0 for the first copy."""
    escaped, n = client_id, 0
    match = _DUP_SUFFIX.search(client_id)
    if match and "#" not in client_id[: match.start()]:
        escaped, n = client_id[: match.start()], int(match.group(1))
    return _unescape(escaped), n


def base_id(client_id: str | None) -> str | None:
    if client_id is None:
        return None
    return split_client_id(client_id)[0]


def dup_client_id(msg_id: str, n: int) -> str:
    escaped = escape_id(msg_id)
    client_id = escaped if n == 0 else f"{escaped}{DUP_SEPARATOR}{n}"
    if len(client_id) > MAX_CLIENT_ID:
        raise StateFormatError(f"message id {msg_id[:40]!r}... is too long to store")
    return client_id


def validate_msg(msg: Any) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise StateFormatError(f"a message must be an object, got {type(msg).__name__}")
    for key in ("id", "name", "role"):
        if not isinstance(msg.get(key), str) or not msg.get(key):
            raise StateFormatError(f"message field {key!r} must be a non-empty string")
    if msg["role"] not in ROLES:
        raise StateFormatError(f"message role must be one of {list(ROLES)}, got {msg['role']!r}")
    content = msg.get("content")
    if not (content is None or isinstance(content, str) or isinstance(content, list)):
        raise StateFormatError("message content must be a string or a list of blocks")
    if isinstance(content, list) and not all(isinstance(b, dict) and "type" in b for b in content):
        raise StateFormatError("each content block must be an object with a 'type'")
    if msg.get("metadata") is not None and not isinstance(msg["metadata"], dict):
        raise StateFormatError("message metadata must be an object")
    return msg


def msg_to_message(
    msg: dict[str, Any], marks: list[str] | None = None, *, client_id: str | None = None
) -> NewMessage:
    """A `Msg.to_dict()` (+ marks) -> the message `messages_append` takes."""
    validate_msg(msg)
    marks = list(marks or [])
    if not all(isinstance(m, str) for m in marks):
        raise StateFormatError("marks must be strings")
    metadata = msg.get("metadata") if msg.get("metadata") is not None else {}
    return NewMessage(
        client_id=client_id or dup_client_id(msg["id"], 0),
        role=msg["role"],
        name=msg["name"],
        text=msg_text(msg.get("content")),
        content=msg.get("content"),
        tags=marks,
        metadata=metadata,
        source_timestamp=msg.get("timestamp") or "",
    )


def message_to_msg(
    *,
    client_id: str | None,
    pk: int,
    role: str,
    name: str,
    text: str,
    content: Any,
    metadata: dict | None,
    source_timestamp: str,
    order: dict | None = None,
) -> dict[str, Any]:
    """A stored message -> `Msg.to_dict()` (key order as AgentScope writes it; `order` is the
    `key_order` skeleton of a message stored before its columns kept their key order)."""
    kept = key_order.restore(
        {
            "content": content if content is not None else text,
            "metadata": metadata if metadata is not None else {},
        },
        order,
    )
    return {
        "id": base_id(client_id) or f"am{pk}",
        "name": name or role,
        "role": role if role in ROLES else "assistant",
        "content": kept["content"],
        "metadata": kept["metadata"],
        "timestamp": source_timestamp or None,
    }


def parse_state_dict(state: Any) -> tuple[list[tuple[dict, list[str]]], str | None]:
    """Entries `(msg_dict, marks)` and the summary (None when absent) of either 1.x format."""
    if not isinstance(state, dict) or "content" not in state:
        raise StateFormatError("a state dict is an object with a 'content' list")
    content = state["content"]
    if not isinstance(content, list):
        raise StateFormatError("'content' must be a list")
    entries = []
    for item in content:
        if isinstance(item, list | tuple) and len(item) == 2:
            msg, marks = item
            if not isinstance(marks, list):
                raise StateFormatError("marks must be a list of strings")
            entries.append((validate_msg(msg), list(marks)))
        elif isinstance(item, dict):
            entries.append((validate_msg({k: v for k, v in item.items() if k != "type"}), []))
        else:
            raise StateFormatError(
                "each content item is a message object or a [message, marks] pair"
            )
    summary = state.get("_compressed_summary")
    if summary is not None and not isinstance(summary, str):
        raise StateFormatError("'_compressed_summary' must be a string")
    return entries, summary


def entries_to_messages(entries: list[tuple[dict, list[str]]]) -> list[dict[str, Any]]:
    """Entries -> message items, a repeated id getting `#dup<n>` (n counted within the list)."""
    seen: dict[str, int] = {}
    items = []
    for msg, marks in entries:
        n = seen.get(msg["id"], 0)
        seen[msg["id"]] = n + 1
        items.append(msg_to_message(msg, marks, client_id=dup_client_id(msg["id"], n)))
    return items


def build_state_dict(
    entries: list[tuple[dict, list[str]]], *, summary: str, fmt: str = "marks"
) -> dict:
    if fmt == "legacy":
        return {"content": [msg for msg, _ in entries]}
    if fmt != "marks":
        raise StateFormatError(f"format must be one of {list(FORMATS)}")
    return {
        "_compressed_summary": summary,
        "content": [[msg, list(marks)] for msg, marks in entries],
    }
