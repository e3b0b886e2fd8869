"""Search everything: the query's parameters and its hits."""

from __future__ import annotations

from typing import Any, Literal

from ninja import Schema
from pydantic import Field

from memory_app.queries.dashboard import MAX_QUERY_CHARS
from memory_app.queries.search_all import KINDS, Hit, SearchPage, hit_api_path, hit_link
from memory_app.schemas.fields import _examples

HitKind = Literal[tuple(KINDS)]  # type: ignore[valid-type]


class SearchQuery(Schema):
    """The parameters of `GET /search`, those of the dashboard's search page."""

    q: str = Field(
        ...,
        min_length=1,
        max_length=MAX_QUERY_CHARS,
        description='web-search syntax: words (all of them), "a phrase", -excluded, or',
    )
    kind: list[HitKind] = Field(
        default_factory=list,
        description="message, output (step outputs), tool (tool calls) or error; repeat the"
        " parameter; none: all",
    )
    keys: str | None = Field(
        None,
        description='JSON object; hits in contexts whose keys contain it, e.g. {"user": "ada"}',
    )
    cursor: str | None = Field(None, max_length=500, description="the last page's `next_cursor`")
    limit: int = Field(20, ge=1, le=100)


HIT_EXAMPLE = {
    "kind": "tool",
    "score": 0.1,
    "context_id": 7,
    "context_keys": {"user": "ada"},
    "run_id": 42,
    "step_id": 310,
    "step_position": 3,
    "message_id": None,
    "message_seq": None,
    "tool_call_id": 512,
    "tool_name": "web_search",
    "snippet": 'web_search {"query": "Paris weather"} Sunny, 21°C',
    "highlights": [[22, 27]],
    "path": "/api/v1/contexts/7/steps/310",
    "dashboard_path": "/runs/42/steps/3/#step-3",
}


class SearchHitOut(Schema):
    model_config = _examples(HIT_EXAMPLE)
    kind: HitKind
    score: float = Field(..., description="ts_rank_cd of the hit's text for the query")
    context_id: int
    context_keys: dict[str, Any]
    run_id: int | None
    step_id: int | None = Field(..., description="the step (of an output, error or tool call)")
    step_position: int | None
    message_id: int | None
    message_seq: int | None
    tool_call_id: int | None
    tool_name: str | None
    snippet: str = Field(..., description="the text around the match, as the agent wrote it")
    highlights: list[tuple[int, int]] = Field(
        ..., description="[start, end) character offsets of the matched words in `snippet`"
    )
    path: str = Field(..., description="the Agent API route of the message or step")
    dashboard_path: str = Field(..., description="the dashboard page showing it")


class SearchPageOut(Schema):
    model_config = _examples(
        {"items": [HIT_EXAMPLE], "has_more": True, "next_cursor": "WzIwXQ", "capped": []}
    )
    items: list[SearchHitOut]
    has_more: bool
    next_cursor: str | None
    capped: list[HitKind] = Field(
        ...,
        description="kinds with more matches than one query ranks: their best hits are the best"
        " of the matches read (narrow the query to read them all)",
    )


def hit_out(hit: Hit) -> dict:
    message = hit.kind == "message"
    return {
        "kind": hit.kind,
        "score": hit.rank,
        "context_id": hit.context_id,
        "context_keys": hit.context.keys if hit.context else {},
        "run_id": hit.run_id,
        "step_id": hit.step_id,
        "step_position": None if message else hit.step_position,
        "message_id": hit.ref_id if message else None,
        "message_seq": hit.message_seq,
        "tool_call_id": hit.ref_id if hit.kind == "tool" else None,
        "tool_name": hit.tool_name or None,
        "snippet": hit.snippet,
        "highlights": hit.highlights,
        "path": hit_api_path(hit),
        "dashboard_path": hit_link(hit),
    }


def page_out(found: SearchPage) -> dict:
    """A page of hits as `SearchPageOut` (the REST route's and the MCP tool's answer)."""
    return {
        "items": [hit_out(h) for h in found.hits],
        "has_more": found.next_cursor is not None,
        "next_cursor": found.next_cursor,
        "capped": found.capped,
    }
