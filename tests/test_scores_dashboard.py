"""Scores, labels and comments in the dashboard: the review panels of a run and its steps (a
curator writes, a viewer reads, everything escaped and audited), the runs table's score column
and filters, review queues saved from a filter, and the scores download."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.test import Client

from memory_app.audit import Actor
from memory_app.models import AuditEvent, Comment, Label, ReviewQueue, Score, Step
from memory_app.services.scores import Target, score_add
from tests.builders import make_context, make_run, make_user

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
XSS = "<img src=x onerror=alert(1)>"


def _client(role: str) -> Client:
    client = Client()
    client.force_login(make_user(role=role))
    return client


@pytest.fixture
def run():
    return make_run(context=make_context(keys={"user": "ada"}), steps=3)


def test_a_curator_scores_labels_and_comments_a_run_and_a_step(run):
    curator = _client("curator")
    url = f"/runs/{run.pk}/review/"
    step = Step.objects.get(run=run, position=2)
    answer = curator.post(
        url, {"action": "score", "name": "correct", "kind": "boolean", "value": "true"}, **HTMX
    )
    assert answer.status_code == 200
    assert 'id="review-run"' in answer.content.decode()
    curator.post(url, {"action": "score", "name": "quality", "kind": "numeric", "value": "4"})
    curator.post(url, {"action": "label", "name": XSS})
    curator.post(url, {"action": "comment", "text": XSS}, **HTMX)
    panel = curator.post(
        url,
        {
            "action": "score",
            "step": step.pk,
            "name": "tool_ok",
            "kind": "categorical",
            "value": XSS,
        },
        **HTMX,
    ).content.decode()
    assert f'id="review-step-{step.pk}"' in panel and XSS not in panel
    assert "&lt;img src=x onerror=alert(1)&gt;" in panel
    assert {(s.name, s.target_type) for s in Score.objects.all()} == {
        ("correct", "run"),
        ("quality", "run"),
        ("tool_ok", "step"),
    }
    assert Label.objects.get().name == XSS and Comment.objects.get().text == XSS
    actions = sorted(AuditEvent.objects.values_list("action", flat=True))
    assert actions == ["comment_add", "label_add", "score_add", "score_add", "score_add"]
    page = curator.get(f"/runs/{run.pk}/steps/2/").content.decode()
    assert XSS not in page and "quality" in page and "tool_ok" in page
    # Bad input is a 400 and writes nothing.
    before = Score.objects.count()
    bad = curator.post(url, {"action": "score", "name": "q", "kind": "numeric", "value": "x"})
    assert bad.status_code == 400
    foreign = make_run(context=make_context(keys={"user": "eve"}), steps=2)
    their_step = Step.objects.get(run=foreign, position=1)
    assert (
        curator.post(url, {"action": "label", "name": "x", "step": their_step.pk}).status_code
        == 404
    )
    assert Score.objects.count() == before
    curator.post(url, {"action": "unlabel", "name": XSS})
    assert not Label.objects.exists()


def test_a_viewer_reads_the_review_but_cannot_write_it(run):
    score_add(
        actor=Actor.system("eval"),
        target=Target.of(run),
        name="correct",
        kind="boolean",
        value=False,
    )
    viewer = _client("viewer")
    page = viewer.get(f"/runs/{run.pk}/steps/1/").content.decode()
    assert "<b>correct</b>=false" in page and 'name="action"' not in page
    refused = viewer.post(f"/runs/{run.pk}/review/", {"action": "label", "name": "x"})
    assert refused.status_code == 403 and not Label.objects.exists()


def test_the_runs_table_shows_and_filters_scores(run):
    other = make_run(context=run.context, steps=2)
    for target, value in ((run, True), (other, False)):
        score_add(
            actor=Actor.system("eval"),
            target=Target.of(target),
            name="correct",
            kind="boolean",
            value=value,
        )
    viewer = _client("viewer")
    page = viewer.get("/runs/", {"score": "correct", "score_value": "false"}).content.decode()
    assert f"#{other.pk}" in page and f"#{run.pk}<" not in page
    assert "<b>correct</b>=false" in page
    assert viewer.get("/runs/", {"score_min": "x"}).status_code == 400
    assert viewer.get("/runs/", {"score_value": "true"}).status_code == 400


def test_a_queue_is_saved_from_the_runs_filters_and_lists_this_reviewers_progress(run):
    curator = _client("curator")
    saved = curator.post(
        "/queues/",
        {
            "name": "Tone check",
            "filters": "status=success",
            "score_name": "tone",
            "score_kind": "categorical",
            "categories": "curt\nfriendly\n",
        },
    )
    queue = ReviewQueue.objects.get()
    assert saved.status_code == 302 and saved["Location"] == f"/queues/{queue.pk}/"
    assert queue.categories == ["curt", "friendly"]
    assert AuditEvent.objects.filter(action="review_queue_create").count() == 1
    page = curator.get(f"/queues/{queue.pk}/").content.decode()
    assert f"Run {run.pk}" in page and "friendly" in page
    answer = curator.post(f"/queues/{queue.pk}/", {"run": run.pk, "key": "2"}, **HTMX)
    assert answer.status_code == 200 and "every run of this queue" in answer.content.decode()
    assert Score.objects.get().value == "friendly"
    assert curator.post(f"/queues/{queue.pk}/", {"run": run.pk, "key": "5"}).status_code == 400
    listing = curator.get("/queues/").content.decode()
    assert "1 of 1" in listing
    bad = curator.post(
        "/queues/",
        {"name": "Bad", "filters": "status=nope", "score_name": "x", "score_kind": "boolean"},
    )
    assert bad.status_code == 400 and ReviewQueue.objects.count() == 1
    viewer = _client("viewer")
    assert (
        viewer.post(
            "/queues/", {"name": "V", "score_name": "x", "score_kind": "boolean"}
        ).status_code
        == 403
    )
    assert viewer.post(f"/queues/{queue.pk}/", {"run": run.pk, "key": "1"}).status_code == 403


def test_the_scores_download_is_jsonl_or_csv(run):
    score_add(
        actor=Actor.system("eval"),
        target=Target.of(run),
        name="tone",
        kind="categorical",
        value="=cmd|' /C calc'!A0",
    )
    viewer = _client("viewer")
    jsonl = viewer.get("/scores/export/")
    rows = [json.loads(line) for line in b"".join(jsonl.streaming_content).splitlines()]
    assert rows[0]["value"] == "=cmd|' /C calc'!A0" and rows[0]["run_id"] == run.pk
    table = viewer.get("/scores/export/", {"format": "csv"})
    assert table["Content-Disposition"] == 'attachment; filename="scores.csv"'
    [row] = csv.DictReader(io.StringIO(b"".join(table.streaming_content).decode()))
    assert row["value"] == "'=cmd|' /C calc'!A0"
    assert viewer.get("/scores/export/", {"format": "xml"}).status_code == 400
    assert Client().get("/scores/export/").status_code == 302
