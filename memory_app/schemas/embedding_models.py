"""The embedding-model registry's shapes: what an admin registers and what readers list."""

from __future__ import annotations

from datetime import datetime

from ninja import Schema
from pydantic import ConfigDict, Field

from memory_app.schemas.fields import Short, _examples

EMBEDDING_MODEL_EXAMPLE = {
    "name": "text-embedding-3-small",
    "dimensions": 1536,
    "created_at": "2026-01-01T12:00:00Z",
    "created_by": "key:ops",
}


class EmbeddingModelIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"name": "text-embedding-3-small", "dimensions": 1536}]}
    )
    name: Short(200) = Field(min_length=1, description="the name vectors are sent under")
    dimensions: int = Field(ge=1, le=16000, description="the length of the model's vectors")


class EmbeddingModelOut(Schema):
    model_config = _examples(EMBEDDING_MODEL_EXAMPLE)
    name: str
    dimensions: int
    created_at: datetime
    created_by: str


class EmbeddingModelListOut(Schema):
    model_config = _examples({"items": [EMBEDDING_MODEL_EXAMPLE]})
    items: list[EmbeddingModelOut]


def embedding_model_out(row) -> dict:
    return {
        "name": row.name,
        "dimensions": row.dimensions,
        "created_at": row.created_at,
        "created_by": row.created_by,
    }
