"""Selector requests and answers, and the call that answers one (REST and MCP give the same
answer)."""

from __future__ import annotations

from typing import Literal

from ninja import Schema
from pydantic import ConfigDict, Field

from memory_app import errors, selectors
from memory_app.errors import Invalid
from memory_app.schemas.fields import FiniteFloat, PlainIn, Short, Text, Vector, _examples
from memory_app.schemas.messages import MESSAGE_EXAMPLE, MessageOut, message_out
from memory_app.search.messages import MAX_QUERY_CHARS


class WindowOptionsIn(PlainIn):
    """The composite selector's recent window: a `window` or a `token_window`."""

    kind: Literal["window", "token_window"] = "window"
    k: int | None = Field(None, ge=1, le=selectors.MAX_K)
    semantics: Literal["plain", "steamship"] = "steamship"
    max_tokens: int | None = Field(None, ge=1, le=10_000_000)
    policy: Literal["contiguous", "skip"] = "contiguous"
    tokenizer: Short(50) | None = None

    def to_spec(self) -> selectors.WindowSpec | selectors.TokenWindowSpec:
        if self.kind == "window":
            return selectors.WindowSpec(k=self.k or 2, semantics=self.semantics)
        if self.max_tokens is None:
            raise Invalid("a token_window needs max_tokens")
        return selectors.TokenWindowSpec(
            max_tokens=self.max_tokens,
            policy=self.policy,
            tokenizer=self.tokenizer,
            semantics=self.semantics,
        )


class SelectIn(PlainIn):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"selector": "window", "k": 10},
                {"selector": "window", "k": 2, "semantics": "steamship"},
                {"selector": "token_window", "max_tokens": 2000, "policy": "skip"},
                {"selector": "search", "query": "weather in Paris", "k": 5, "mode": "hybrid"},
                {"selector": "composite", "window": {"kind": "window", "k": 2}, "search_k": 3},
            ]
        }
    )
    selector: Literal["window", "token_window", "search", "composite"]
    k: int | None = Field(
        None, ge=1, le=selectors.MAX_K, description="window size or number of search hits"
    )
    semantics: Literal["plain", "steamship"] = Field(
        "plain", description="`steamship`: turn semantics of Steamship's selectors (k counts turns)"
    )
    max_tokens: int | None = Field(
        None, ge=1, le=10_000_000, description="token_window budget (strictly below)"
    )
    policy: Literal["contiguous", "skip"] = "contiguous"
    tokenizer: Short(50) | None = Field(
        None, description="tiktoken encoding name; default cl100k_base"
    )
    query: Text | None = Field(None, max_length=MAX_QUERY_CHARS)
    mode: Literal["auto", "keyword", "semantic", "hybrid"] = "auto"
    model: Short(200) | None = Field(None, description="embedding model of `query_vector`")
    query_vector: list[FiniteFloat] | None = Field(None, max_length=16000)
    order: Literal["prompt", "rank"] = Field(
        "prompt",
        description="search: `prompt` lists the hits oldest first (as a prompt takes them), "
        "`rank` best first; each hit's `score` and `reason` give its rank either way",
    )
    window: WindowOptionsIn | None = Field(None, description="composite: the recent window")
    search_k: int = Field(
        3, ge=1, le=100, description="composite: search hits for the last user message"
    )
    search_mode: Literal["auto", "keyword", "semantic", "hybrid", "off"] = "auto"

    def to_spec(self) -> selectors.SelectorSpec:
        if self.selector == "window":
            if self.k is None:
                raise Invalid("the window selector needs k")
            return selectors.WindowSpec(k=self.k, semantics=self.semantics)
        if self.selector == "token_window":
            if self.max_tokens is None:
                raise Invalid("the token_window selector needs max_tokens")
            return selectors.TokenWindowSpec(
                max_tokens=self.max_tokens,
                policy=self.policy,
                tokenizer=self.tokenizer,
                semantics=self.semantics,
            )
        if self.selector == "search":
            if not (self.query and self.query.strip()) and self.query_vector is None:
                raise Invalid("the search selector needs a query (or a query_vector)")
            return selectors.SearchSpec(
                query=self.query or "",
                k=self.k or 5,
                mode=self.mode,
                model=self.model,
                query_vector=tuple(self.query_vector) if self.query_vector is not None else None,
                order=self.order,
            )
        window = (self.window or WindowOptionsIn()).to_spec()
        return selectors.CompositeSpec(
            window=window, search_k=self.search_k, search_mode=self.search_mode
        )


SELECTED_EXAMPLE = {"message": MESSAGE_EXAMPLE, "reason": "window", "tokens": 8, "score": None}


class SelectedOut(Schema):
    model_config = _examples(SELECTED_EXAMPLE)
    message: MessageOut
    reason: str
    tokens: int
    score: float | None = None


class SelectOut(Schema):
    model_config = _examples(
        {
            "selector": "window",
            "items": [SELECTED_EXAMPLE],
            "count": 1,
            "total_tokens": 8,
            "max_tokens": None,
            "tokenizer": "cl100k_base",
            "scanned": 1,
            "notes": [],
        }
    )
    selector: str
    items: list[SelectedOut]
    count: int
    total_tokens: int
    max_tokens: int | None
    tokenizer: str
    scanned: int = Field(description="messages examined")
    notes: list[str]


def select_out(context, body: SelectIn) -> dict:
    """Run the selector `body` names on `context`: the `SelectOut` dict (REST and MCP answer it)."""
    try:
        selection = selectors.select(context=context, spec=body.to_spec())
    except errors.UnknownTokenizer as exc:
        raise Invalid(str(exc)) from exc
    return {
        "selector": selection.selector,
        "items": [
            {
                "message": message_out(i.message),
                "reason": i.reason,
                "tokens": i.tokens,
                "score": i.score,
            }
            for i in selection.items
        ],
        "count": selection.count,
        "total_tokens": selection.total_tokens,
        "max_tokens": selection.max_tokens,
        "tokenizer": selection.tokenizer,
        "scanned": selection.scanned,
        "notes": selection.notes,
    }


class MessageVectorIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"model": "my-model", "vector": [0.1, 0.2, 0.3]}]}
    )
    model: Short(200) = Field(min_length=1, description="the embedding model the vector comes from")
    vector: Vector


class MessageVectorOut(Schema):
    model_config = _examples({"message_id": 101, "model": "my-model", "dimensions": 3})
    message_id: int | None = None
    memory_id: int | None = None
    model: str
    dimensions: int
