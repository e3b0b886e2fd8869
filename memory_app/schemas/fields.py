"""Field types the REST API and the MCP tools share: bounded integers, text without NUL or lone
surrogates, JSON values, vectors, and the helpers that document examples."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from memory_app.json_values import check_json as _check_json
from memory_app.json_values import check_text as _check_text
from memory_app.models import MessageRole, RunStatus

# PostgreSQL integer ranges: larger values would fail in the database, so they answer 422 here.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


Text = Annotated[str, AfterValidator(_check_text)]


def Short(max_length: int):  # noqa: N802 - reads as a type in schemas
    """A string limited to a model column's max_length."""
    return Annotated[str, StringConstraints(max_length=max_length), AfterValidator(_check_text)]


JsonValue = Annotated[Any, AfterValidator(_check_json)]
JsonObject = Annotated[dict[str, Any], AfterValidator(_check_json)]
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
Int64 = Annotated[int, Field(ge=0, le=INT64_MAX)]
# Ids in URLs and bodies: positive bigint.
Id = Annotated[int, Field(ge=1, le=INT64_MAX)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# A client-computed embedding (its model's dimensions are checked by the write path).
Vector = Annotated[list[FiniteFloat], Field(min_length=1, max_length=16000)]
VECTOR_MODEL_DESCRIPTION = (
    "the embedding model `vector` comes from; default: the configured model "
    "(required when no embedding provider is configured)"
)


ClientId = Short(200)
Role = Literal[tuple(MessageRole.values)]  # type: ignore[valid-type]
FinishStatus = Literal[tuple(s for s in RunStatus.values if s != RunStatus.RUNNING)]  # type: ignore[valid-type]
Tag = Short(200)
# Times (unix epoch seconds) and durations: finite and within a sane range.
Seconds = Annotated[float, Field(ge=-1e12, le=1e12, allow_inf_nan=False)]


def _examples(*examples: dict) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": list(examples)})


class PlainIn(BaseModel):
    """Bodies that arrive by the thousand (messages, steps) or on every turn of an agent (a
    selection): plain pydantic models. ninja's `Schema` wraps every object in a root validator
    made for reading ORM objects, which cost about a third of a 1,000-message batch's
    validation, and more than the rest of a selection body's."""
