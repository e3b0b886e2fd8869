"""BCG-X AgentKit tool input: `ToolInputSchema.json()` and `standard_query_format`, exactly.

AgentKit (LangChain 0.1, pydantic v1) serialises each chat message as
`{"content", "additional_kwargs": {}, "type": "human"|"ai", "example": false}` and
`user_settings` as `{"data": {...}, "version": n}` or null. `standard_query_format` glues its
sections together with no separator: "...AI: There are 14 albums.Latest user question: ...".
"""

from __future__ import annotations

from typing import Any

# AgentKit's formatter drops this tool's output: it is small talk, not evidence.
IGNORED_TOOL = "entertainer_tool"
DROPPED_LINE_PREFIXES = ("action:", "signal:")


def chat_message(kind: str, content: str) -> dict[str, Any]:
    if kind not in ("human", "ai"):
        raise ValueError(f"chat history messages are 'human' or 'ai', got {kind!r}")
    return {"content": content, "additional_kwargs": {}, "type": kind, "example": False}


def settings_object(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("data", {}), dict):
        raise ValueError("user_settings must be an object {data: {...}, version: int|null}")
    return {"data": value.get("data", {}), "version": value.get("version")}


def tool_input(
    *,
    chat_history: list[tuple[str, str]],
    latest_human_message: str,
    user_settings: Any = None,
    intermediate_steps: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The dict whose `json.dumps` equals AgentKit's `ToolInputSchema(...).json()`."""
    return {
        "chat_history": [chat_message(kind, text) for kind, text in chat_history],
        "latest_human_message": latest_human_message,
        "user_settings": settings_object(user_settings),
        "intermediate_steps": dict(intermediate_steps or {}),
    }


def _clean(content: Any) -> str:
    if not isinstance(content, str):
        # AgentKit raises here too: its formatter only knows string contents.
        raise ValueError("chat message content must be a string")
    return "\n".join(
        line for line in content.split("\n") if not line.startswith(DROPPED_LINE_PREFIXES)
    )


def standard_query_format(tool_input: dict[str, Any]) -> str:
    """AgentKit's `helpers/query_formatting.standard_query_format`, same text."""
    steps = {
        k: v for k, v in (tool_input.get("intermediate_steps") or {}).items() if k != IGNORED_TOOL
    }
    history = tool_input.get("chat_history") or []
    lines = [
        ("Human: " if m["type"] == "human" else "AI: ") + _clean(m["content"]) for m in history
    ]
    text = ("\nChat history: \n" + "\n".join(lines)) if history else ""
    if steps:
        text += "\nIntermediate tool outputs: " + "\n".join(f"{k}: {v}" for k, v in steps.items())
    return text + "Latest user question: " + str(tool_input.get("latest_human_message", ""))
