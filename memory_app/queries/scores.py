"""Reading scores, labels and comments: a run's review (the logbook), a runs-table page's scores
and labels, and the scores export. Every read names the context of the rows it reads."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q, QuerySet

from memory_app.models import Comment, Context, Label, Run, Score

EXPORT_BATCH = 1000
EXPORT_FIELDS = (
    "id",
    "context_id",
    "run_id",
    "target",
    "target_id",
    "name",
    "kind",
    "value",
    "comment",
    "author",
    "client_id",
    "created_at",
    "updated_at",
)


@dataclass
class Review:
    """What was said about a run, split by target: the run itself, and each step by id."""

    scores: list[Score] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)
    comments: list[Comment] = field(default_factory=list)
    step_scores: dict[int, list[Score]] = field(default_factory=dict)
    step_labels: dict[int, list[Label]] = field(default_factory=dict)
    step_comments: dict[int, list[Comment]] = field(default_factory=dict)


def run_review(*, run: Run) -> Review:
    """The scores, labels and comments of a run and its steps, oldest first."""
    review = Review()
    where = {"context_id": run.context_id, "run_id": run.pk, "message__isnull": True}
    for model, own, per_step in (
        (Score, review.scores, review.step_scores),
        (Label, review.labels, review.step_labels),
        (Comment, review.comments, review.step_comments),
    ):
        for row in model.objects.filter(**where).order_by("id"):
            if row.step_id is None:
                own.append(row)
            else:
                per_step.setdefault(row.step_id, []).append(row)
    return review


def attach_run_scores(runs: list[Run]) -> list[Run]:
    """Give each run of a page `scores` and `labels`: those on the run itself."""
    by_run: dict[int, dict[str, list]] = {r.pk: {"scores": [], "labels": []} for r in runs}
    if runs:
        where = Q(
            context_id__in={r.context_id for r in runs},
            run_id__in=list(by_run),
            step__isnull=True,
            message__isnull=True,
        )
        for score in Score.objects.filter(where).order_by("name", "id"):
            by_run[score.run_id]["scores"].append(score)
        for label in Label.objects.filter(where).order_by("name"):
            by_run[label.run_id]["labels"].append(label)
    for run in runs:
        run.scores, run.labels = by_run[run.pk]["scores"], by_run[run.pk]["labels"]
    return runs


def score_row(score: Score) -> dict[str, Any]:
    """A score as the export and the API write it."""
    return {
        "id": score.pk,
        "context_id": score.context_id,
        "run_id": score.run_id,
        "target": score.target_type,
        "target_id": score.target_id,
        "name": score.name,
        "kind": score.kind,
        "value": score.value,
        "comment": score.comment,
        "author": score.author,
        "client_id": score.client_id,
        "created_at": score.created_at.isoformat(),
        "updated_at": score.updated_at.isoformat(),
    }


def scores_export(
    *,
    contexts: QuerySet[Context] | None = None,
    name: str = "",
    run_id: int | None = None,
    context_id: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Every score (of the contexts given, of `name`, of one run), in id order, a batch at a
    time: each batch names the contexts it reads (all of them, the key's, or `context_id`)."""
    context_ids = None if contexts is None else list(contexts.values_list("pk", flat=True))
    after = 0
    while True:
        qs = Score.objects.filter(pk__gt=after)
        if context_ids is not None:
            qs = qs.filter(context_id__in=context_ids)
        if context_id is not None:
            qs = qs.filter(context_id=context_id)
        if name:
            qs = qs.filter(name=name)
        if run_id is not None:
            qs = qs.filter(run_id=run_id)
        batch = list(qs.order_by("pk")[:EXPORT_BATCH])
        for score in batch:
            yield score_row(score)
        if len(batch) < EXPORT_BATCH:
            return
        after = batch[-1].pk


def as_jsonl(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    for row in rows:
        yield json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"


def _cell(value: Any) -> Any:
    """A CSV cell: booleans as true/false (as in JSON), None empty; a text a spreadsheet would
    read as a formula gets a leading quote."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def as_csv(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(EXPORT_FIELDS)
    yield buffer.getvalue()
    for row in rows:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([_cell(row[f]) for f in EXPORT_FIELDS])
        yield buffer.getvalue()
