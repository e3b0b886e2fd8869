"""The tool an evaluator scores with: a run, a step or a message the key may see, under a name,
idempotent by client id, authored by the key (as the REST API's `POST …/scores`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.fastmcp import Context as ToolContext
from pydantic import Field, WithJsonSchema

from memory_app import auth
from memory_app.audit import Actor
from memory_app.mcp_server.app import WRITE, drop_none, run, server
from memory_app.queries.scores import score_row
from memory_app.schemas.fields import INT64_MAX
from memory_app.schemas.scores import ScoreIn, ScoreKindName
from memory_app.services.scores import Target, score_add

FINDERS = {"run": auth.run_for_key, "step": auth.step_for_key, "message": auth.message_for_key}


def _typed(kind: str, value: Any) -> Any:
    """A value some clients can only send as text ("true", "0.8"), as its kind's type."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if kind == "boolean" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if kind == "numeric":
        try:
            return float(text)
        except ValueError:
            return value
    return value


def _score(key, *, target, target_id, **fields) -> dict[str, Any]:
    fields["value"] = _typed(fields["kind"], fields["value"])
    body = ScoreIn(**fields)
    found = FINDERS[target](key, target_id)
    actor = Actor.for_key(key)
    row, created = score_add(actor=actor, target=Target.of(found), **body.model_dump())
    return {"score": score_row(row), "created": created}


@server.tool(annotations=WRITE)
async def score(
    ctx: ToolContext,
    target: Annotated[Literal["run", "step", "message"], Field(description="what is scored")],
    target_id: Annotated[int, Field(ge=1, le=INT64_MAX, description="its id")],
    name: Annotated[str, Field(min_length=1, max_length=100, description="e.g. correct")],
    kind: Annotated[ScoreKindName, Field(description="numeric, boolean or categorical")],
    # Typed "string" for the clients that take one type per parameter; true, 0.8 and "good"
    # are all taken (ScoreIn checks the value against the kind).
    value: Annotated[
        Any,
        WithJsonSchema({"type": "string"}),
        Field(description="true/false (boolean), a number (numeric) or the category's text"),
    ],
    comment: Annotated[str | None, Field(max_length=10_000, description="why")] = None,
    client_id: Annotated[
        str | None,
        Field(max_length=200, description="your id for it: the same id again is the same score"),
    ] = None,
) -> dict[str, Any]:
    """Score a run, step or message under a name (a judgement such as correct=true or
    quality=4). You are its author. With client_id, calling again with the same content
    answers the stored score (created=false); other content is an error. Needs 'write'."""
    return await run(
        ctx,
        "write",
        _score,
        **drop_none(
            target=target,
            target_id=target_id,
            name=name,
            kind=kind,
            value=value,
            comment=comment,
            client_id=client_id,
        ),
    )
