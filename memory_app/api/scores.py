"""Scores from evaluators and agents: on a run, a step or a message the key may see; a run's
scores; every score the key may see, exported as JSON lines or CSV."""

from __future__ import annotations

import json

from django.http import StreamingHttpResponse
from ninja import Query, Router, Status

from memory_app import auth
from memory_app.api.common import (
    WRITE_ERRORS,
    MessageId,
    RunId,
    StepId,
    actor_for,
    message_for,
    require_scope,
    responses,
    run_for,
    step_for,
)
from memory_app.queries.scores import as_csv, as_jsonl, score_row, scores_export
from memory_app.schemas.scores import (
    SCORE_EXAMPLE,
    ScoreExportQuery,
    ScoreIn,
    ScoreList,
    ScoreOut,
)
from memory_app.services import scores as scores_service
from memory_app.services.scores import Target

router = Router(tags=["scores"])
CSV_EXAMPLE = "".join(as_csv([SCORE_EXAMPLE]))
SCORED = responses({200: ScoreOut, 201: ScoreOut}, WRITE_ERRORS)


def _score(request, target: Target, body: ScoreIn):
    score, created = scores_service.score_add(
        actor=actor_for(request), target=target, **body.model_dump()
    )
    return Status(201 if created else 200, score_row(score))


# The author is the key that sends the score, never a field of the body.
@router.post("/runs/{run_id}/scores", response=SCORED, summary="Score a run")
def run_score(request, run_id: RunId, body: ScoreIn):
    """Idempotent by `client_id` (per key): the same id and content answers the stored score
    (200), other content is a 409."""
    require_scope(request, "write")
    return _score(request, Target.of(run_for(request, run_id)), body)


@router.post("/steps/{step_id}/scores", response=SCORED, summary="Score a step")
def step_score(request, step_id: StepId, body: ScoreIn):
    require_scope(request, "write")
    return _score(request, Target.of(step_for(request, step_id)), body)


@router.post("/messages/{message_id}/scores", response=SCORED, summary="Score a message")
def message_score(request, message_id: MessageId, body: ScoreIn):
    require_scope(request, "write")
    return _score(request, Target.of(message_for(request, message_id)), body)


@router.get(
    "/runs/{run_id}/scores",
    response=responses({200: ScoreList}),
    summary="List a run's scores (the run's, its steps' and its messages')",
)
def run_scores(request, run_id: RunId):
    require_scope(request, "read")
    run = run_for(request, run_id)
    rows = scores_export(contexts=None, run_id=run.pk, context_id=run.context_id)
    return Status(200, {"items": list(rows)})


@router.get(
    "/scores/export",
    response=responses({200: None}),
    summary="Export every score the key may see, as JSON lines or CSV",
    openapi_extra={
        "responses": {
            200: {
                "description": "OK",
                "content": {
                    "application/x-ndjson": {"example": json.dumps(SCORE_EXAMPLE) + "\n"},
                    "text/csv": {"example": CSV_EXAMPLE},
                },
            }
        }
    },
)
def scores_download(request, params: Query[ScoreExportQuery]):
    """One score a line (JSONL) or a row (CSV, with a header), in id order."""
    key = require_scope(request, "read")
    contexts = auth.visible_contexts(key) if key.context_keys else None
    rows = scores_export(contexts=contexts, name=params.name, run_id=params.run_id)
    if params.format == "csv":
        response = StreamingHttpResponse(as_csv(rows), content_type="text/csv; charset=utf-8")
    else:
        response = StreamingHttpResponse(as_jsonl(rows), content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="scores.{params.format}"'
    return response
