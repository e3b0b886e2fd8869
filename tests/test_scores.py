"""Scores from the Agent API and the MCP tool: authored by the key (never by the body),
idempotent by client id, confined to the key's contexts, audited; the runs table filtered by
score and label; the export as JSON lines and CSV."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory_app.audit import Actor
from memory_app.models import AuditEvent, Label, Message, Score, Step
from memory_app.queries.runs_table import BadQuery, RunFilters, runs_table
from memory_app.services.scores import (
    Target,
    label_add,
    label_remove,
    score_delete,
    score_set,
)
from tests.api_helpers import make_key
from tests.builders import make_context, make_run, make_user, without_their_context

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme():
    return make_key(context_keys={"tenant": "acme"}, name="acme-eval")


@pytest.fixture
def runs():
    mine = make_context(keys={"tenant": "acme", "user": "ada"}, messages=2)
    theirs = make_context(keys={"tenant": "globex", "user": "eve"}, messages=1)
    return make_run(context=mine, steps=3), make_run(context=theirs, steps=2)


def _body(**overrides):
    return {"name": "correct", "kind": "boolean", "value": True, **overrides}


def test_a_score_is_authored_by_the_key_and_idempotent_by_client_id(acme, runs):
    run, _ = runs
    url = f"/api/v1/runs/{run.pk}/scores"
    first = acme.post(url, _body(client_id="eval-1", comment="matches the reference"))
    assert first.status_code == 201, first.content
    score = first.json()
    assert score["author"] == f"key:{acme.key.prefix}"
    assert (score["target"], score["target_id"], score["value"]) == ("run", run.pk, True)
    again = acme.post(url, _body(client_id="eval-1", comment="matches the reference"))
    assert again.status_code == 200 and again.json() == score
    changed = acme.post(url, _body(client_id="eval-1", value=False))
    assert changed.status_code == 409
    assert changed.json()["differences"]["value"] == {"stored": True, "sent": False}
    # The same client id from another key is that key's own score.
    other = make_key(context_keys={"tenant": "acme"}, name="other-eval")
    assert other.post(url, _body(client_id="eval-1", value=False)).status_code == 201
    assert Score.objects.filter(run=run).count() == 2
    events = AuditEvent.objects.filter(action="score_add", target_type="score")
    assert events.count() == 2
    assert events.filter(actor=f"key:{acme.key.prefix}").get().after["comment"] == (
        "matches the reference"
    )


def test_the_body_cannot_name_an_author_and_the_value_must_fit_its_kind(acme, runs):
    run, _ = runs
    url = f"/api/v1/runs/{run.pk}/scores"
    assert acme.post(url, _body(author="user:admin")).status_code == 422
    assert acme.post(url, _body(value=1)).status_code == 422
    assert acme.post(url, _body(kind="numeric", value="high")).status_code == 422
    assert acme.post(url, _body(kind="categorical", value=3)).status_code == 422
    assert acme.post(url, _body(name="  ")).status_code == 422
    assert acme.post(url, _body(kind="stars")).status_code == 422
    assert acme.post(url, raw='{"name": "q", "kind": "numeric", "value": NaN}').status_code == 400
    assert not Score.objects.exists()
    numeric = acme.post(url, _body(name="quality", kind="numeric", value=4.5))
    assert numeric.status_code == 201 and numeric.json()["value"] == 4.5
    category = acme.post(url, _body(name="tone", kind="categorical", value="<b>curt</b>"))
    assert category.json()["value"] == "<b>curt</b>"


def test_steps_and_messages_are_scored_and_a_run_lists_them_all(acme, runs):
    run, _ = runs
    step = Step.objects.get(run=run, position=2)
    message = Message.objects.filter(context_id=run.context_id).first()
    assert acme.post(f"/api/v1/steps/{step.pk}/scores", _body(name="tool_ok")).status_code == 201
    scored = acme.post(f"/api/v1/messages/{message.pk}/scores", _body(name="helpful"))
    assert scored.status_code == 201
    assert scored.json()["run_id"] is None and scored.json()["target"] == "message"
    acme.post(f"/api/v1/runs/{run.pk}/scores", _body())
    listed = acme.get(f"/api/v1/runs/{run.pk}/scores").json()["items"]
    assert [(s["target"], s["target_id"]) for s in listed] == [("step", step.pk), ("run", run.pk)]


def test_a_confined_key_neither_scores_nor_sees_another_tenants_runs(acme, runs):
    mine, theirs = runs
    their_step = Step.objects.get(run=theirs, position=1)
    their_message = Message.objects.filter(context_id=theirs.context_id).first()
    for url in (
        f"/api/v1/runs/{theirs.pk}/scores",
        f"/api/v1/steps/{their_step.pk}/scores",
        f"/api/v1/messages/{their_message.pk}/scores",
    ):
        response = acme.post(url, _body())
        assert response.status_code == 404, url
    assert acme.get(f"/api/v1/runs/{theirs.pk}/scores").status_code == 404
    assert not Score.objects.exists()
    reader = make_key(scopes=("read",), context_keys={"tenant": "acme"})
    assert reader.post(f"/api/v1/runs/{mine.pk}/scores", _body()).status_code == 403
    # An operator's score on the other tenant's run stays out of the key's export.
    score_set(
        actor=Actor.for_user(make_user(role="curator")),
        target=Target.of(theirs),
        name="correct",
        kind="boolean",
        value=False,
    )
    acme.post(f"/api/v1/runs/{mine.pk}/scores", _body())
    exported = acme.get("/api/v1/scores/export")
    lines = [json.loads(line) for line in b"".join(exported.streaming_content).splitlines()]
    assert [row["run_id"] for row in lines] == [mine.pk]
    unconfined = make_key()
    everything = b"".join(unconfined.get("/api/v1/scores/export").streaming_content)
    assert len(everything.splitlines()) == 2


def test_the_export_writes_json_lines_and_csv_as_scored(acme, runs):
    run, _ = runs
    acme.post(f"/api/v1/runs/{run.pk}/scores", _body(comment='says "no", then =SUM(A1)'))
    acme.post(f"/api/v1/runs/{run.pk}/scores", _body(name="tone", kind="categorical", value="é"))
    jsonl = acme.get("/api/v1/scores/export", {"format": "jsonl"})
    assert jsonl["Content-Type"] == "application/x-ndjson"
    rows = [json.loads(line) for line in b"".join(jsonl.streaming_content).splitlines()]
    assert [(r["name"], r["value"]) for r in rows] == [("correct", True), ("tone", "é")]
    assert rows[0]["comment"] == 'says "no", then =SUM(A1)'
    response = acme.get("/api/v1/scores/export", {"format": "csv", "name": "correct"})
    assert response["Content-Disposition"] == 'attachment; filename="scores.csv"'
    table = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(table) == 1
    assert table[0]["value"] == "true" and table[0]["author"] == f"key:{acme.key.prefix}"
    # Text a spreadsheet would run as a formula is written as text.
    assert table[0]["comment"] == 'says "no", then =SUM(A1)'
    assert acme.get("/api/v1/scores/export", {"format": "xml"}).status_code == 422


def test_the_runs_table_filters_by_score_and_label_and_lists_them(acme, runs):
    good, _ = runs
    ctx = good.context
    bad, middling = make_run(context=ctx, steps=2), make_run(context=ctx, steps=2)
    step = Step.objects.get(run=middling, position=2)
    acme.post(f"/api/v1/runs/{good.pk}/scores", _body())
    acme.post(f"/api/v1/runs/{bad.pk}/scores", _body(value=False))
    for run, quality in ((good, 5), (bad, 1), (middling, 3)):
        acme.post(
            f"/api/v1/runs/{run.pk}/scores", _body(name="quality", kind="numeric", value=quality)
        )
    # A step's score is not its run's.
    acme.post(f"/api/v1/steps/{step.pk}/scores", _body())
    label_add(actor=Actor.system("test"), target=Target.of(bad), name="regression")

    def ids(**filters):
        return {r.pk for r in runs_table(filters=RunFilters(**filters)).runs}

    assert ids(score="correct") == {good.pk, bad.pk}
    assert ids(score="correct", score_value="true") == {good.pk}
    assert ids(score="correct", score_value="false") == {bad.pk}
    assert ids(score="quality", score_min=2) == {good.pk, middling.pk}
    assert ids(score="quality", score_min=2, score_max=4) == {middling.pk}
    assert ids(score="quality", score_value="5") == {good.pk}
    assert ids(label="regression") == {bad.pk}
    with pytest.raises(BadQuery):
        RunFilters(score_value="true")
    page = acme.get("/api/v1/runs", {"score": "quality", "score_max": 3}).json()
    by_id = {row["id"]: row for row in page["items"]}
    assert set(by_id) == {bad.pk, middling.pk}
    assert {s["name"]: s["value"] for s in by_id[bad.pk]["scores"]} == {
        "correct": False,
        "quality": 1.0,
    }
    assert by_id[bad.pk]["labels"] == ["regression"]
    assert acme.get("/api/v1/runs", {"label": "regression"}).json()["items"][0]["id"] == bad.pk
    assert acme.get("/api/v1/runs", {"score_value": "true"}).status_code == 422


def test_a_reviewer_keeps_one_score_per_name_and_its_change_is_audited(runs):
    run, _ = runs
    reviewer = Actor.for_user(make_user(role="curator"))
    first = score_set(
        actor=reviewer, target=Target.of(run), name="correct", kind="boolean", value=True
    )
    again = score_set(
        actor=reviewer, target=Target.of(run), name="correct", kind="boolean", value=False
    )
    assert again.pk == first.pk and Score.objects.get().value is False
    change = AuditEvent.objects.get(action="score_set")
    assert (change.before["value"], change.after["value"]) == (True, False)
    assert change.context_id == run.context_id


def test_a_score_and_a_label_are_removed_in_their_context(runs):
    """A score's deletion and a label's removal name their context (on Citus, its shard
    alone): they went by the row's id alone."""
    run, other = runs
    reviewer = Actor.for_user(make_user(role="curator"))
    kept = score_set(actor=reviewer, target=Target.of(other), name="ok", kind="boolean", value=True)
    score = score_set(actor=reviewer, target=Target.of(run), name="ok", kind="boolean", value=True)
    label_add(actor=reviewer, target=Target.of(run), name="seen")
    label_add(actor=reviewer, target=Target.of(other), name="seen")
    with CaptureQueriesContext(connection) as queries:
        score_delete(actor=reviewer, context_id=run.context_id, score_id=score.pk)
        label_remove(actor=reviewer, target=Target.of(run), name="seen")
    statements = [q["sql"] for q in queries.captured_queries]
    assert sum(s.startswith("DELETE") for s in statements) == 2
    assert without_their_context(statements) == []
    assert list(Score.objects.values_list("pk", flat=True)) == [kept.pk]
    assert list(Label.objects.values_list("run_id", flat=True)) == [other.pk]
