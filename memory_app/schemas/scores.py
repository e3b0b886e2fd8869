"""Scores in and out of the Agent API and the MCP tool."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from ninja import Schema
from pydantic import BaseModel, ConfigDict, Field

from memory_app.models import ScoreKind
from memory_app.models.scores import CATEGORY_CHARS, COMMENT_CHARS, NAME_CHARS
from memory_app.schemas.fields import ClientId, Short, Text, _examples

ScoreKindName = Literal[tuple(ScoreKind.values)]  # type: ignore[valid-type]
# A boolean, a finite number or a category (which of them the kind says).
ScoreValue = bool | Annotated[float, Field(allow_inf_nan=False)] | Short(CATEGORY_CHARS)


class ScoreIn(BaseModel):
    """A score: `value` is true/false (boolean), a number (numeric) or a text (categorical)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"name": "correct", "kind": "boolean", "value": True, "client_id": "eval-7-run-3"}
            ]
        },
    )
    name: Annotated[Short(NAME_CHARS), Field(min_length=1)]
    kind: ScoreKindName
    value: ScoreValue
    comment: Annotated[Text, Field(max_length=COMMENT_CHARS)] = ""
    client_id: ClientId | None = Field(
        None, description="your id for this score: sending it again answers the stored score"
    )


SCORE_EXAMPLE = {
    "id": 12,
    "context_id": 7,
    "run_id": 3,
    "target": "run",
    "target_id": 3,
    "name": "correct",
    "kind": "boolean",
    "value": True,
    "comment": "",
    "author": "key:3f2a9c1b7d0e",
    "client_id": "eval-7-run-3",
    "created_at": "2025-01-01T10:00:00Z",
    "updated_at": "2025-01-01T10:00:00Z",
}


class ScoreOut(Schema):
    model_config = _examples(SCORE_EXAMPLE)
    id: int
    context_id: int
    run_id: int | None
    target: Literal["run", "step", "message"]
    target_id: int
    name: str
    kind: str
    value: bool | float | str
    comment: str
    author: str = Field(description="who scored: user:<name> or key:<prefix> (set by the server)")
    client_id: str | None
    created_at: datetime
    updated_at: datetime


class ScoreList(Schema):
    model_config = _examples({"items": [SCORE_EXAMPLE]})
    items: list[ScoreOut]


class ScoreExportQuery(Schema):
    format: Literal["jsonl", "csv"] = Field("jsonl", description="JSON lines or CSV")
    name: str = Field("", max_length=NAME_CHARS, description="only scores of this name")
    run_id: int | None = Field(None, ge=1, le=2**63 - 1, description="only this run's scores")
