"""Scores, labels and comments in the dashboard: the review panels of a run and its steps, the
review queues (a saved runs-table filter plus "not yet scored by me", worked through with the
keyboard), and the scores download."""

from __future__ import annotations

from dataclasses import replace

from django.core.exceptions import PermissionDenied, ValidationError
from django.http import QueryDict, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from memory_app.audit import Actor
from memory_app.errors import Invalid, NotFound
from memory_app.models import ReviewQueue, Run, ScoreKind, Step
from memory_app.queries.runs_table import BadQuery, RunFilters, runs_count, runs_table
from memory_app.queries.scores import as_csv, as_jsonl, run_review, scores_export
from memory_app.roles import require, user_can
from memory_app.services import scores as scores_service
from memory_app.services.scores import Target
from memory_app.views.common import (
    bad_request,
    htmx_partial,
    invalid_form,
    page,
    private,
    query_string,
    replica_page,
    wants_fragment,
)
from memory_app.views.forms import RunTableForm
from memory_app.views.score_forms import QueueForm, QueuePageForm, QueueScoreForm, ReviewForm


def review_blocks(run: Run, step: Step | None) -> dict:
    """The review panels of a run and of its step on screen (`review.html`)."""
    review = run_review(run=run)
    blocks = {
        "review_run": {
            "target": "run",
            "scores": review.scores,
            "labels": review.labels,
            "comments": review.comments,
        }
    }
    if step is not None:
        blocks["review_step"] = {
            "target": "step",
            "step_id": step.pk,
            "scores": review.step_scores.get(step.pk, []),
            "labels": review.step_labels.get(step.pk, []),
            "comments": review.step_comments.get(step.pk, []),
        }
    return blocks


def _review_change(form: ReviewForm, actor: Actor, target: Target) -> None:
    data = form.cleaned_data
    action = data["action"]
    if action == "score":
        scores_service.score_set(
            actor=actor,
            target=target,
            name=data["name"],
            kind=data["kind"],
            value=form.score_value(),
            comment=data["text"],
        )
    elif action == "unscore":
        scores_service.score_delete(
            actor=actor, context_id=target.context_id, score_id=data["score"]
        )
    elif action == "label":
        scores_service.label_add(actor=actor, target=target, name=data["name"])
    elif action == "unlabel":
        scores_service.label_remove(actor=actor, target=target, name=data["name"])
    else:
        scores_service.comment_add(actor=actor, target=target, text=data["text"])


@require("curate")
@require_POST
def run_review_change(request, run_id: int):
    """Score, label or comment on the run or one of its steps; under htmx the panel comes back."""
    run = get_object_or_404(Run.objects.select_related("context"), pk=run_id)
    form = ReviewForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    step = None
    if form.cleaned_data["step"]:
        step = get_object_or_404(
            Step.objects.only("id", "run_id", "context_id", "position"),
            context_id=run.context_id,
            run=run,
            pk=form.cleaned_data["step"],
        )
    try:
        target = Target.of(step or run)
        _review_change(form, Actor.for_user(request.user), target)
    except (Invalid, NotFound) as exc:
        return bad_request(request, exc)
    except ValidationError as exc:
        return bad_request(request, "; ".join(exc.messages))
    if not wants_fragment(request):
        return redirect(request.POST.get("next") or reverse("run", args=[run.pk]))
    blocks = review_blocks(run, step)
    block = blocks["review_step" if step else "review_run"]
    return page(request, "memory_app/review.html", {"run": run, "block": block})


@require("view")
@require_GET
@replica_page
def scores_download(request):
    """Every score, as JSON lines or CSV (`?format=csv`), optionally of one name."""
    fmt = request.GET.get("format", "jsonl")
    if fmt not in ("jsonl", "csv"):
        return bad_request(request, "format is jsonl or csv")
    name = request.GET.get("name", "")[:100]
    rows = scores_export(name=name)
    if fmt == "csv":
        response = StreamingHttpResponse(as_csv(rows), content_type="text/csv; charset=utf-8")
    else:
        response = StreamingHttpResponse(as_jsonl(rows), content_type="application/x-ndjson")
    response["Content-Disposition"] = f'attachment; filename="scores.{fmt}"'
    return private(response)


def _queue_filters(queue: ReviewQueue) -> RunFilters:
    form = RunTableForm(QueryDict(queue.filters))
    if not form.is_valid():
        raise BadQuery(f"the queue's saved filters are no longer valid: {form.errors.as_text()}")
    return form.filters()


def _progress(queue: ReviewQueue, filters: RunFilters, author: str) -> dict:
    total = runs_count(filters=filters)
    left = runs_count(filters=replace(filters, unscored_by=(author, queue.score_name)))
    return {"total": total, "done": total - left, "left": left}


@require("view")
@require_http_methods(["GET", "POST"])
def queues(request):
    """The review queues, each with this reviewer's progress; POST saves a new one."""
    if request.method == "POST":
        if not user_can(request.user, "curate"):
            raise PermissionDenied("only a curator saves review queues")
        form = QueueForm(request.POST)
        if not form.is_valid():
            return invalid_form(request, form)
        data = form.cleaned_data
        try:
            _queue_filters(ReviewQueue(filters=data["filters"]))
            queue = scores_service.review_queue_create(actor=Actor.for_user(request.user), **data)
        except (Invalid, BadQuery) as exc:
            return bad_request(request, exc)
        return redirect("queue", queue_id=queue.pk)
    author = Actor.for_user(request.user).label
    listed = []
    for queue in ReviewQueue.objects.order_by("name"):
        try:
            progress = _progress(queue, _queue_filters(queue), author)
        except BadQuery:
            progress = None
        listed.append({"queue": queue, "progress": progress})
    return page(request, "memory_app/queues.html", {"queues": listed, "nav_active": "runs"})


def _digit_value(queue: ReviewQueue, key: str):
    digit = int(key)
    if queue.score_kind == ScoreKind.BOOLEAN:
        if digit not in (0, 1):
            raise Invalid("in this queue 1 is yes and 0 is no")
        return digit == 1
    if queue.score_kind == ScoreKind.NUMERIC:
        return float(digit)
    if not 1 <= digit <= len(queue.categories):
        raise Invalid(f"in this queue the digits 1 to {len(queue.categories)} give a category")
    return queue.categories[digit - 1]


def _queue_context(request, queue: ReviewQueue, cursor: str) -> dict:
    author = Actor.for_user(request.user).label
    filters = _queue_filters(queue)
    waiting = replace(filters, unscored_by=(author, queue.score_name))
    found = runs_table(filters=waiting, cursor=cursor or None, limit=1)
    run = found.runs[0] if found.runs else None
    base = reverse("queue", args=[queue.pk])
    context = {
        "queue": queue,
        "run": run,
        "cursor": cursor,
        "progress": _progress(queue, filters, author),
        "skip_url": base + "?" + query_string(cursor=found.next_cursor)
        if found.next_cursor
        else None,
        "restart_url": base if cursor else None,
        "nav_active": "runs",
    }
    if run is not None:
        full = Run.objects.select_related("context").defer("system_prompt").get(pk=run.pk)
        context.update(full_run=full, **review_blocks(full, None))
    return context


@require("view")
@require_http_methods(["GET", "POST"])
@htmx_partial("queue-item")
def queue(request, queue_id: int):
    """The next run of the queue this reviewer has not scored; POST scores it with a digit key
    and answers the next one (the cursor keeps runs skipped before it behind)."""
    queue = get_object_or_404(ReviewQueue, pk=queue_id)
    if request.method == "POST":
        if not user_can(request.user, "curate"):
            raise PermissionDenied("only a curator scores runs")
        form = QueueScoreForm(request.POST)
        if not form.is_valid():
            return invalid_form(request, form)
        data = form.cleaned_data
        run = get_object_or_404(Run.objects.only("id", "context_id"), pk=data["run"])
        try:
            scores_service.score_set(
                actor=Actor.for_user(request.user),
                target=Target.of(run),
                name=queue.score_name,
                kind=queue.score_kind,
                value=_digit_value(queue, data["key"]),
                comment=data["comment"],
            )
        except Invalid as exc:
            return bad_request(request, exc)
        cursor = data["cursor"]
        if not wants_fragment(request):
            url = reverse("queue", args=[queue.pk])
            return redirect(url + ("?" + query_string(cursor=cursor) if cursor else ""))
    else:
        form = QueuePageForm(request.GET)
        if not form.is_valid():
            return invalid_form(request, form)
        cursor = form.cleaned_data["cursor"]
    try:
        context = _queue_context(request, queue, cursor)
    except BadQuery as exc:
        return bad_request(request, exc)
    return page(request, "memory_app/queue.html", context)
