"""The runs table across contexts: the counters the write path keeps on runs, every filter and
order with its cursor pages, the dashboard page (URL-held filters, htmx, escaping, the home
page's failed and running runs) and `GET /api/v1/runs` within an API key's confinement."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from memory_app import audit, scale_out
from memory_app.models import Run
from memory_app.queries.logbook import run_cost
from memory_app.queries.runs_table import BadQuery, RunFilters, runs_table
from memory_app.services.curation import PURGE_CONFIRMATION, selected_purge
from memory_app.services.runs import run_create, run_finish, steps_append
from tests.api_helpers import make_key
from tests.builders import (
    action_step,
    load_fleet,
    make_context,
    make_run,
    make_user,
    plan_nodes,
)

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def viewer():
    c = Client()
    c.force_login(make_user(role="viewer"))
    return c


def _ids(**kwargs) -> list[int]:
    return [r.pk for r in runs_table(filters=RunFilters(**kwargs.pop("f", {})), **kwargs).runs]


def _all_pages(order: str, **filters) -> list[Run]:
    seen, cursor = [], None
    while True:
        page = runs_table(filters=RunFilters(**filters), order=order, cursor=cursor, limit=3)
        seen += page.runs
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


def test_the_write_path_keeps_tool_calls_models_and_cost_on_the_run():
    ctx = make_context()
    run, _ = run_create(context=ctx, task="t", metadata={"model": "gpt-4o-mini"})
    steps_append(
        run=run,
        items=[
            {"kind": "task", "task": "t"},
            action_step(1),  # priced with the run's model: 101 in, 21 out
            action_step(2, model="gpt-4o", cost=0.5, tool_calls=[]),
            action_step(3, model="unpriced-x", error_type="E", error_message="boom"),
        ],
    )
    run.refresh_from_db()
    assert run.step_count == 4 and run.error_count == 1 and run.tool_call_count == 2
    assert run.model_names == ["gpt-4o", "gpt-4o-mini", "unpriced-x"]
    expected = (101 * 0.15 + 21 * 0.60) / 1_000_000 + 0.5
    assert run.cost == pytest.approx(expected)
    assert run.cost == pytest.approx(run_cost(run=run).total)

    # A purge takes back what the purged steps brought.
    erroneous = run.steps.get(position=4)
    priced = run.steps.get(position=2)
    selected_purge(
        step_ids=[erroneous.pk, priced.pk],
        confirmation=PURGE_CONFIRMATION,
        actor=audit.Actor.system("test"),
    )
    run.refresh_from_db()
    assert (run.step_count, run.error_count, run.tool_call_count) == (2, 0, 0)
    assert run.model_names == ["gpt-4o", "gpt-4o-mini"]
    assert run.cost == pytest.approx(0.5)


def test_the_migration_fills_the_columns_from_the_stored_steps():
    ctx = make_context()
    run = make_run(context=ctx, steps=4, error_at=(3,), model="gpt-4o")
    run.refresh_from_db()
    kept = (run.tool_call_count, run.model_names, run.cost)
    assert kept[0] == 3 and kept[1] == ["gpt-4o"] and kept[2] > 0
    Run.objects.filter(pk=run.pk).update(tool_call_count=0, model_names=[], cost=None)
    migration = importlib.import_module("memory_app.migrations.0022_run_table_columns")
    with connection.schema_editor(atomic=False) as editor:
        # As the migration found it: the run's metadata was jsonb until migration 0028 (the
        # deferred key checks run first: a table with pending ones cannot be altered).
        editor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        editor.execute("ALTER TABLE memory_app_run ALTER COLUMN metadata TYPE jsonb")
        migration.fill(None, editor)
        editor.execute("ALTER TABLE memory_app_run ALTER COLUMN metadata TYPE json")
    run.refresh_from_db()
    assert (run.tool_call_count, run.model_names) == kept[:2]
    assert run.cost == pytest.approx(kept[2])


@pytest.fixture
def fleet():
    """Runs in three contexts: statuses, errors, models, starts, durations and costs apart."""
    ada = make_context(keys={"user": "ada", "team": "red"})
    bob = make_context(keys={"user": "bob", "team": "red"})
    eve = make_context(keys={"user": "eve", "team": "blue"})
    now = timezone.now()
    made = {}
    specs = [
        ("ok", ada, "success", (), "gpt-4o", 3, 10),
        ("failed", ada, "failed", (2,), "gpt-4o-mini", 2, 20),
        ("maxsteps", bob, "max_steps_error", (), "gpt-4o", 5, 30),
        ("running", bob, "running", (), "claude-sonnet-4", 4, 40),
        ("timeout", eve, "failed", (3,), "gpt-4o", 3, 50),
    ]
    for name, ctx, status, errors, model, steps, hours_ago in specs:
        run, _ = run_create(
            context=ctx, task=f"task {name}", started_at=now - timedelta(hours=hours_ago)
        )
        items = [{"kind": "task", "task": name}]
        for n in range(1, steps):
            extra = {"model": model}
            if n + 1 in errors:
                message = "TimeoutError: tool took too long" if name == "timeout" else "bad input"
                extra.update(error_type="AgentExecutionError", error_message=message)
            items.append(action_step(n, **extra))
        steps_append(run=run, items=items)
        if status != "running":
            run = run_finish(
                run=run, status=status, finished_at=run.started_at + timedelta(seconds=steps * 10)
            )
        made[name] = run.pk
    return made


def test_every_filter_narrows_the_table(fleet):
    f = fleet
    assert _ids() == [f["ok"], f["failed"], f["maxsteps"], f["running"], f["timeout"]]
    assert _ids(f={"statuses": ["failed", "max_steps_error"]}) == [
        f["failed"],
        f["maxsteps"],
        f["timeout"],
    ]
    assert _ids(f={"has_error": True}) == [f["failed"], f["timeout"]]
    assert _ids(f={"error": "timeouterror"}) == [f["timeout"]]
    assert _ids(f={"error": "nowhere"}) == []
    assert _ids(f={"model": "gpt-4o"}) == [f["ok"], f["maxsteps"], f["timeout"]]
    assert _ids(f={"keys": [("team", "red")]}) == [
        f["ok"],
        f["failed"],
        f["maxsteps"],
        f["running"],
    ]
    assert _ids(f={"keys": [("team", "red"), ("user", "bob")]}) == [f["maxsteps"], f["running"]]
    assert _ids(f={"keys_contain": {"team": "blue"}}) == [f["timeout"]]
    now = timezone.now()
    window = {
        "started_after": now - timedelta(hours=35),
        "started_before": now - timedelta(hours=15),
    }
    assert _ids(f=window) == [f["failed"], f["maxsteps"]]
    assert _ids(f={"min_duration": 40}) == [f["maxsteps"]]
    costs = {pk: Run.objects.get(pk=pk).cost for pk in fleet.values()}
    threshold = sorted(c for c in costs.values())[-2]
    assert set(_ids(f={"min_cost": threshold})) == {pk for pk, c in costs.items() if c >= threshold}
    with pytest.raises(BadQuery):
        RunFilters(statuses=["exploded"])


@pytest.mark.parametrize("order", ["started", "oldest", "duration", "cost"])
def test_cursor_pages_cover_every_run_once_in_order(order):
    ctx = make_context()
    same_start = timezone.now() - timedelta(hours=1)
    for i in range(8):
        # Ties in every order: the cursor's id keeps pages apart.
        run, _ = run_create(context=ctx, task=f"t{i}", started_at=same_start if i % 2 else None)
        if i % 3:
            steps_append(run=run, items=[action_step(1, cost=0.25 * (i % 2))])
            run_finish(
                run=run,
                status="success",
                finished_at=run.started_at + timedelta(seconds=i % 2) if run.started_at else None,
            )
    rows = _all_pages(order)
    assert sorted(r.pk for r in rows) == sorted(Run.objects.values_list("pk", flat=True))
    assert len({r.pk for r in rows}) == len(rows) == 8
    keys = [(r.sort_key, r.pk) for r in rows]
    assert keys == sorted(keys, reverse=order != "oldest")


def test_a_broken_cursor_is_refused():
    with pytest.raises(BadQuery):
        runs_table(filters=RunFilters(), cursor="not-a-cursor")
    with pytest.raises(BadQuery):
        runs_table(filters=RunFilters(), order="duration", cursor="WyJ4IiwxXQ")


def test_the_page_holds_its_filters_in_the_url_and_answers_htmx_with_the_results(viewer, fleet):
    url = reverse("runs")
    page = viewer.get(url, {"status": "failed", "key": "team=red"})
    html = page.content.decode()
    assert page.status_code == 200 and "<h1>Runs</h1>" in html
    assert "task failed" in html and "task timeout" not in html and "task ok" not in html
    assert 'value="team=red"' in html and 'value="failed" checked' in html

    part = viewer.get(url, {"add": "user=eve", "sort": "cost"}, **HTMX)
    body = part.content.decode()
    assert "<html" not in body and 'id="run-results"' in body and "task timeout" in body
    assert part["HX-Push-Url"] == f"{url}?sort=cost&key=user%3Deve"

    first = viewer.get(url, {"sort": "oldest"})
    assert "Next page" not in first.content.decode()
    assert viewer.get(url, {"cursor": "garbage"}).status_code == 400
    assert viewer.get(url, {"min_cost": "-1"}).status_code == 400
    assert viewer.get(url, {"status": "exploded"}).status_code == 400
    assert viewer.get(url, {"started_after": "yesterday"}).status_code == 400


def test_next_page_links_carry_every_filter(viewer):
    ctx = make_context(keys={"user": "ada"})
    for i in range(53):
        run, _ = run_create(context=ctx, task=f"t{i}")
        run_finish(run=run, status="failed")
    html = viewer.get(
        reverse("runs"), {"status": "failed", "key": "user=ada", "error": ""}
    ).content.decode()
    assert html.count('<tr class="status-failed">') == 50
    nxt = html.split('rel="next" href="')[1].split('"')[0].replace("&amp;", "&")
    assert "status=failed" in nxt and "key=user%3Dada" in nxt and "cursor=" in nxt
    second = viewer.get(nxt).content.decode()
    assert second.count('<tr class="status-failed">') == 3 and 'rel="next"' not in second


def test_empty_states(viewer):
    html = viewer.get(reverse("runs")).content.decode()
    assert "No runs yet" in html
    assert (
        "No run matches these filters"
        in viewer.get(reverse("runs"), {"has_error": "1"}).content.decode()
    )


def test_agent_written_values_are_escaped(viewer):
    evil = "<script>alert(1)</script>"
    ctx = make_context(keys={evil: evil})
    run, _ = run_create(context=ctx, task=evil, agent_name=evil, metadata={"model": evil})
    steps_append(run=run, items=[action_step(1, model=evil, error_type=evil, error_message=evil)])
    for response in (viewer.get(reverse("runs")), viewer.get(reverse("home"))):
        html = response.content.decode()
        assert evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_home_page_leads_with_failed_and_running_runs(viewer, fleet):
    html = viewer.get(reverse("home")).content.decode()
    assert html.index("Runs that need a look") < html.index("<h1>Contexts</h1>")
    failed = html.split('id="failed-runs"')[1].split('id="running-runs"')[0]
    running = html.split('id="running-runs"')[1].split("<h1>Contexts</h1>")[0]
    assert "task failed" in failed and "task maxsteps" in failed and "task timeout" in failed
    assert "task ok" not in failed and "task running" not in failed
    assert "task running" in running and "task failed" not in running
    # The contexts' htmx answers stay the contexts alone.
    part = viewer.get(reverse("home"), **HTMX).content.decode()
    assert "Runs that need a look" not in part


def test_the_home_page_says_when_nothing_needs_a_look(viewer):
    html = viewer.get(reverse("home")).content.decode()
    assert "No failed runs." in html and "No run is running." in html


def test_the_api_lists_runs_across_contexts_with_the_same_filters(fleet):
    api = make_key(scopes=("read",))
    every = api.get("/api/v1/runs").json()
    assert [r["id"] for r in every["items"]] == list(fleet.values())
    row = every["items"][4]
    assert row["context_keys"] == {"user": "eve", "team": "blue"} and row["error_count"] == 1
    assert row["model_names"] == ["gpt-4o"] and row["tool_call_count"] == 2
    assert row["task"] == "task timeout" and row["status"] == "failed"
    failed = api.get("/api/v1/runs?status=failed&status=max_steps_error&has_error=true").json()
    assert [r["id"] for r in failed["items"]] == [fleet["failed"], fleet["timeout"]]
    keyed = api.get("/api/v1/runs", {"keys": '{"team": "red"}', "error": "bad input"}).json()
    assert [r["id"] for r in keyed["items"]] == [fleet["failed"]]
    pages, cursor = [], None
    while True:
        got = api.get(
            "/api/v1/runs",
            {"limit": 2, "sort": "duration", **({"cursor": cursor} if cursor else {})},
        ).json()
        pages += [r["id"] for r in got["items"]]
        assert got["has_more"] == (got["next_cursor"] is not None)
        if not got["has_more"]:
            break
        cursor = got["next_cursor"]
    assert sorted(pages) == sorted(fleet.values()) and len(pages) == 5
    assert api.get("/api/v1/runs", {"cursor": "garbage"}).status_code == 422
    assert api.get("/api/v1/runs", {"status": "exploded"}).status_code == 422
    assert api.get("/api/v1/runs", {"keys": "[1]"}).status_code == 422
    assert api.get("/api/v1/runs", {"min_cost": -1}).status_code == 422


def test_a_confined_key_lists_only_its_contexts_runs(fleet):
    red = make_key(scopes=("read",), context_keys={"team": "red"})
    listed = [r["id"] for r in red.get("/api/v1/runs").json()["items"]]
    assert listed == [fleet["ok"], fleet["failed"], fleet["maxsteps"], fleet["running"]]
    # Asking for another tenant's keys finds nothing rather than widening the confinement.
    assert red.get("/api/v1/runs", {"keys": '{"team": "blue"}'}).json()["items"] == []
    assert red.get("/api/v1/runs", {"error": "TimeoutError"}).json()["items"] == []
    eve = make_key(scopes=("read",), context_keys={"user": "eve"})
    assert [r["id"] for r in eve.get("/api/v1/runs").json()["items"]] == [fleet["timeout"]]
    assert make_key(scopes=("write",)).get("/api/v1/runs").status_code == 403


# The tables whose reads must stay on an index at any size (a scan of one is seconds at the
# 100,000 runs and 1,000,000 steps the benchmark's fleet area measures).
SCANNED = {"memory_app_run", "memory_app_step", "memory_app_score", "memory_app_label"}


def test_every_page_reads_runs_on_an_index_in_a_bounded_number_of_queries(viewer):
    with connection.cursor() as cursor:
        if scale_out.is_distributed(cursor, "memory_app_run"):
            pytest.skip("the single node's plans (a Citus coordinator plans for the shards)")
    load_fleet(runs=1000, steps_per_run=5, messages=0, contexts=10)
    second = runs_table(filters=RunFilters(), limit=50).next_cursor
    urls = [
        "/runs/",
        f"/runs/?cursor={second}",
        "/runs/?status=failed&has_error=1",
        "/runs/?status=running",
        "/runs/?key=tenant%3Dt3",
        "/runs/?model=gpt-4o-mini&min_duration=100",
        "/runs/?sort=cost",
        "/runs/?sort=duration",
        "/runs/?score=correct&score_value=false",
        "/runs/?label=needs-review",
        "/runs/?error=timeout",
        "/runs/?error=timeout+4242",
        "/",
    ]
    for url in urls:
        with CaptureQueriesContext(connection) as queries:
            response = viewer.get(url)
        assert response.status_code == 200, url
        assert len(queries) <= 10, url
        reads = [q["sql"] for q in queries.captured_queries if any(t in q["sql"] for t in SCANNED)]
        assert reads, url
        for sql in reads:
            scans = [n for n in plan_nodes(sql) if n.get("Relation Name") in SCANNED]
            assert not [n for n in scans if n["Node Type"] == "Seq Scan"], (url, sql)


@pytest.mark.parametrize("offset", ["+22:33", "-20:00"])
def test_a_time_with_an_offset_postgresql_cannot_hold_is_compared_in_utc(fleet, viewer, offset):
    """Python takes offsets up to ±23:59, PostgreSQL up to ±15:59: the API and the dashboard
    compare the instant (in UTC), so such a time is a filter like any other, not a 500."""
    api = make_key(scopes=("read",))
    answer = api.get("/api/v1/runs", {"started_after": f"2000-05-09T16:14:49{offset}"})
    assert answer.status_code == 200, answer.content
    assert len(answer.json()["items"]) == len(fleet)
    # The request after it still answers: nothing was left half-done.
    assert api.get("/api/v1/runs", {"min_cost": "1.5"}).status_code == 200
    out_of_range = api.get("/api/v1/runs", {"started_after": f"0001-01-01T00:00:00{offset}"})
    assert out_of_range.status_code in (200, 422), out_of_range.content
    page = viewer.get(reverse("runs"), {"started_after": f"2000-05-09T16:14{offset}"})
    assert page.status_code == 200


def _truth(filters: RunFilters) -> list[int]:
    """The runs `filters` hold, newest first, worked out in Python from every row."""
    from memory_app.models import Label, Score, Step

    def run_scores(name, author=None):
        scores = Score.objects.filter(name=name, step__isnull=True, message__isnull=True)
        return scores.filter(author=author) if author else scores

    keep = set(Run.objects.values_list("pk", flat=True))
    if filters.score:
        scored = run_scores(filters.score)
        false = {s.run_id for s in scored if s.kind == "boolean" and not s.number}
        keep &= false if filters.score_value == "false" else set()
    if filters.label:
        keep &= set(
            Label.objects.filter(
                name=filters.label, step__isnull=True, message__isnull=True
            ).values_list("run_id", flat=True)
        )
    if filters.unscored_by:
        author, name = filters.unscored_by
        keep -= {s.run_id for s in run_scores(name, author)}
    if filters.error:
        text = filters.error.lower()
        keep &= {
            s.run_id
            for s in Step.objects.filter(error_type__isnull=False)
            if text in s.error_type.lower() or text in (s.error_message or "").lower()
        }
    runs = Run.objects.filter(pk__in=keep)
    return [r.pk for r in sorted(runs, key=lambda r: (r.started_at or r.created_at, r.pk))][::-1]


@pytest.mark.django_db
def test_filters_on_other_rows_answer_the_same_runs_walked_or_read_first(monkeypatch):
    """A page walks the next runs in its order and probes each, then reads the matching rows
    first for the runs beyond the walk: whatever the walk's length, every page of every such
    filter holds the runs the filter names, each once, in order."""
    from memory_app.queries import runs_table as table

    load_fleet(runs=240, steps_per_run=3, messages=0, contexts=6)
    cases = [
        RunFilters(score="correct", score_value="false"),
        RunFilters(score="correct", score_value="maybe"),
        RunFilters(error="TimeOut"),
        RunFilters(error="no error says this"),
        RunFilters(label="needs-review"),
        RunFilters(unscored_by=("user:benchmark", "correct")),
        RunFilters(error="timeout", unscored_by=("user:benchmark", "correct")),
    ]
    truths = [_truth(filters) for filters in cases]
    assert all(truths[i] for i in (0, 2, 4, 5, 6)) and not truths[1] and not truths[3]
    for walk, order in ((1, "started"), (7, "started"), (7, "oldest"), (10_000, "oldest")):
        monkeypatch.setattr(table, "WALK", walk)
        for filters, truth in zip(cases, truths, strict=True):
            listed, cursor = [], None
            for _ in range(100):
                page = runs_table(filters=filters, order=order, cursor=cursor, limit=9)
                listed += [r.pk for r in page.runs]
                if not (cursor := page.next_cursor):
                    break
            assert listed == (truth if order == "started" else truth[::-1]), (walk, filters)
