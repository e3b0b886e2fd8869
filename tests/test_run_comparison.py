"""Two runs compared: the alignment (a pure function over two step lists: a retry step inserted
in one run leaves the rest paired, the first pair that differs in tool, arguments, output or
error is the first divergence), the deltas, and the dashboard page (`/runs/compare/?a=&b=`, the
runs table's picks, the logbook's link to the previous run, escaping, a 300-step run in a fixed
number of queries with its long texts cut)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from memory_app.queries.run_comparison import StepFacts, align, compare_runs, semantic
from memory_app.services.runs import run_create, run_finish, steps_append
from tests.api_helpers import make_key
from tests.builders import action_step, make_context, make_user

HTMX = {"HTTP_HX_REQUEST": "true"}


def step(position, kind="action", tools=(), arguments=(), output="o", error=None, **extra):
    return StepFacts(
        position=position,
        kind=kind,
        tools=tuple(tools),
        arguments=tuple(arguments),
        output=output,
        error=error,
        **extra,
    )


def trail(*tools):
    """A task step, then one action step a tool name (each with the same arguments, output)."""
    return [step(1, kind="task")] + [
        step(i, tools=[t], arguments=[{"q": "x"}]) for i, t in enumerate(tools, start=2)
    ]


# --- the alignment ------------------------------------------------------------------------------


def test_the_same_steps_pair_off_with_no_divergence():
    rows = align(trail("search", "fetch"), trail("search", "fetch"))
    assert [(r.a.position, r.b.position) for r in rows] == [(1, 1), (2, 2), (3, 3)]
    assert not any(r.differs for r in rows)
    assert not any(r.first for r in rows)


def test_an_inserted_retry_step_leaves_the_rest_aligned():
    a = trail("search", "fetch", "answer")
    b = trail("search", "search", "fetch", "answer")
    rows = align(a, b)
    pairs = [(r.a and r.a.position, r.b and r.b.position) for r in rows]
    # One unpaired step of B (the first of its two searches: the longest run of matching steps
    # wins); every later step is paired with its counterpart, not shifted by one.
    assert pairs == [(1, 1), (None, 2), (2, 3), (3, 4), (4, 5)]
    assert [r.differences for r in rows] == [(), ("missing",), (), (), ()]
    assert [r.first for r in rows] == [False, True, False, False, False]


def test_another_tool_at_the_same_place_is_the_first_divergence():
    rows = align(trail("search", "fetch", "answer"), trail("search", "browse", "answer"))
    assert [r.differences for r in rows] == [(), (), ("tool",), ()]
    assert rows[2].first and rows[2].reasons == ["another tool"]


def test_arguments_compare_as_json_values_not_as_text():
    def one(args):
        return [step(1, tools=["t"], arguments=[args])]

    same = [
        ({"city": "Paris", "days": 2}, {"days": 2, "city": "Paris"}),  # key order
        ({"n": 1}, {"n": 1.0}),  # the same number
        ({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}),
    ]
    for left, right in same:
        assert not align(one(left), one(right))[0].differs, (left, right)
    other = [
        ({"flag": True}, {"flag": 1}),  # a boolean is not a number
        ({"a": [1, 2]}, {"a": [2, 1]}),  # arrays keep their order
        ({"city": "Paris"}, {"city": "Paris", "days": 2}),
        ("print(1)", "print(2)"),  # code, as a code agent sends it
    ]
    for left, right in other:
        assert align(one(left), one(right))[0].differences == ("arguments",), (left, right)
    assert semantic({"x": 1, "y": 2}) == semantic({"y": 2, "x": 1.0})


def test_output_and_error_differences_are_named_and_the_first_one_wins():
    a = [step(1, kind="task"), step(2, tools=["s"], output="A"), step(3, tools=["f"])]
    b = [
        step(1, kind="task"),
        step(2, tools=["s"], output="B"),
        step(3, tools=["f"], error=("TimeoutError", "d1")),
    ]
    rows = align(a, b)
    assert [r.differences for r in rows] == [(), ("output",), ("error",)]
    assert [r.first for r in rows] == [False, True, False]


def test_a_replaced_stretch_pairs_in_order_and_the_extra_step_is_unpaired():
    a = [step(1, kind="task"), step(2, tools=["x"]), step(3, tools=["y"])]
    b = [step(1, kind="task"), step(2, kind="planning")]
    rows = align(a, b)
    assert [(r.a and r.a.position, r.b and r.b.position) for r in rows] == [
        (1, 1),
        (2, 2),
        (3, None),
    ]
    assert rows[1].differences == ("kind", "tool")
    assert rows[2].differences == ("missing",)


def test_per_step_deltas_are_b_minus_a_and_unknown_when_either_side_is():
    a = [step(1, tokens=100, cost=0.5, duration=2.0), step(2, tokens=None, cost=None)]
    b = [step(1, tokens=130, cost=0.25, duration=1.5), step(2, tokens=7, cost=0.1)]
    rows = align(a, b)
    assert (rows[0].tokens_delta, rows[0].cost_delta, rows[0].duration_delta) == (30, -0.25, -0.5)
    assert (rows[1].tokens_delta, rows[1].cost_delta, rows[1].duration_delta) == (None,) * 3


def test_empty_runs_align_to_nothing():
    assert align([], []) == []
    rows = align([], trail("s"))
    assert [r.differences for r in rows] == [("missing",), ("missing",)]


# --- runs in the database and the page ----------------------------------------------------------

pytestmark_db = pytest.mark.django_db


@pytest.fixture
def viewer():
    client = Client()
    client.force_login(make_user(role="viewer"))
    return client


def _run(context, steps, *, task="Find the weather", minutes_ago=0, status="success"):
    started = timezone.now() - timedelta(minutes=minutes_ago)
    run, _ = run_create(context=context, task=task, agent_name="helper", started_at=started)
    steps_append(run=run, items=[{"kind": "task", "task": task}, *steps])
    return run_finish(run=run, status=status, finished_at=started + timedelta(seconds=30))


def _pair_with_divergence_at_step_3():
    """Two runs of one context: B's second action calls the tool with another city."""
    ctx = make_context(title="Weather desk")
    a = _run(ctx, [action_step(1), action_step(2), action_step(3)], minutes_ago=10)
    second = action_step(2)
    second["tool_calls"][0]["arguments"] = {"step": 2, "city": "Lyon"}
    b = _run(ctx, [action_step(1), second, action_step(3)], minutes_ago=1)
    return a, b


@pytestmark_db
def test_compare_runs_reads_steps_tool_calls_and_costs_from_the_database():
    a, b = _pair_with_divergence_at_step_3()
    cmp = compare_runs(a, b)
    assert len(cmp.rows) == 4
    assert cmp.first == 2 and cmp.first_row.differences == ("arguments",)
    # Shown as written: B's arguments in the key order the agent sent.
    assert cmp.first_row.b.arguments_text == '{"step": 2, "city": "Lyon"}'
    assert cmp.first_row.a.arguments_text == '{"city": "Paris", "step": 2}'
    assert cmp.rows[1].tokens_delta == 0 and cmp.tokens_delta == 0
    assert cmp.counts == {"arguments": 1}


@pytestmark_db
def test_the_page_shows_the_first_divergence_and_the_deltas(viewer):
    a, b = _pair_with_divergence_at_step_3()
    response = viewer.get(reverse("run-compare"), {"a": a.pk, "b": b.pk})
    assert response.status_code == 200
    html = response.content.decode()
    first = re.search(r'<tr id="first-divergence"[^>]*data-row="(\d+)"', html)
    assert first and first.group(1) == "3"
    assert 'data-differences="arguments"' in html
    assert "other arguments" in html
    assert html.count('class="differs') == 1
    assert 'id="total-tokens-delta">±0<' in html
    # Every step links to its place in its own logbook.
    assert reverse("run-step", args=[b.pk, 3]) in html


@pytestmark_db
def test_runs_of_different_contexts_compare_and_the_totals_differ(viewer):
    one, two = make_context(), make_context()
    a = _run(one, [action_step(1, input_tokens=100, output_tokens=10)], minutes_ago=5)
    b = _run(
        two,
        [
            action_step(1, input_tokens=300, output_tokens=10),
            action_step(2, error_type="ValueError", error_message="no such city"),
        ],
        status="failed",
    )
    response = viewer.get(reverse("run-compare"), {"a": a.pk, "b": b.pk})
    html = response.content.decode()
    assert response.status_code == 200
    first = re.search(r'<tr id="first-divergence"[^>]*data-row="(\d+)"', html)
    assert first and first.group(1) == "3"  # the token difference alone is no divergence
    assert 'data-differences="missing"' in html
    added = b.total_tokens - a.total_tokens
    assert added > 0 and f'id="total-tokens-delta">+{added}<' in html
    assert "ValueError: no such city" in html


@pytestmark_db
def test_the_runs_table_sends_two_picks_and_gets_the_deep_link(viewer):
    ctx = make_context()
    older = _run(ctx, [action_step(1)], minutes_ago=30)
    newer = _run(ctx, [action_step(1)], minutes_ago=1)
    page = viewer.get(reverse("runs")).content.decode()
    assert 'id="compare-form"' in page
    assert f'name="run" value="{older.pk}" form="compare-form"' in page
    response = viewer.get(reverse("run-compare"), {"run": [newer.pk, older.pk]})
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('run-compare')}?a={older.pk}&b={newer.pk}"


@pytestmark_db
@pytest.mark.parametrize(
    "params, message",
    [
        ({"run": ["1"]}, "pick exactly two runs"),
        ({"run": ["1", "2", "3"]}, "pick exactly two runs"),
        ({"a": "1"}, "name the two runs"),
        ({"a": "1", "b": "1"}, "two different runs"),
        ({"a": "x", "b": "1"}, "whole number"),
        ({"a": "0", "b": "1"}, "at least 1"),
        ({"a": str(2**63), "b": "1"}, "less than or equal"),
        ({"a": "1\x00", "b": "2"}, "whole number"),
    ],
)
def test_bad_picks_are_a_400_that_says_why(viewer, params, message):
    response = viewer.get(reverse("run-compare"), params)
    assert response.status_code == 400
    assert message in response.content.decode()


@pytestmark_db
def test_a_run_that_is_not_there_is_a_404(viewer):
    ctx = make_context()
    run = _run(ctx, [])
    assert viewer.get(reverse("run-compare"), {"a": run.pk, "b": run.pk + 999}).status_code == 404
    response = viewer.get(reverse("run-compare"), {"run": [run.pk, run.pk + 999]})
    assert response.status_code == 404


@pytestmark_db
def test_only_users_who_may_see_runs_compare_them():
    a, b = _pair_with_divergence_at_step_3()
    url = f"{reverse('run-compare')}?a={a.pk}&b={b.pk}"
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]
    nobody = Client()
    nobody.force_login(make_user(role=None))
    assert nobody.get(url).status_code == 403
    outputs = reverse("step-outputs", args=[a.pk, 2])
    assert nobody.get(outputs).status_code == 403


@pytestmark_db
def test_agent_written_content_is_escaped(viewer):
    ctx = make_context()
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    a = _run(ctx, [action_step(1)], minutes_ago=3)
    b = _run(
        ctx,
        [
            action_step(
                1,
                observations=evil,
                error_type="E<b>",
                error_message=evil,
                tool_calls=[{"name": "t<i>", "arguments": {"k": evil}, "output": evil}],
            )
        ],
        task=evil,
    )
    html = viewer.get(reverse("run-compare"), {"a": a.pk, "b": b.pk}).content.decode()
    outputs = viewer.get(reverse("step-outputs", args=[b.pk, 2]), **HTMX).content.decode()
    for page in (html, outputs):
        assert "<script>alert" not in page and "<img src=x" not in page
        assert "&lt;script&gt;" in page
    assert "t&lt;i&gt;" in html and "E&lt;b&gt;" in html


@pytestmark_db
def test_the_logbook_links_to_a_comparison_with_the_previous_run_of_its_context(viewer):
    ctx, other = make_context(), make_context()
    first = _run(ctx, [action_step(1)])
    _run(other, [action_step(1)])  # another context's run is never "previous"
    second = _run(ctx, [action_step(1)])
    page = viewer.get(reverse("run-step", args=[second.pk, 1])).content.decode()
    link = f"{reverse('run-compare')}?a={first.pk}&amp;b={second.pk}"
    assert link in page and "Compare with the previous run of this context" in page
    first_page = viewer.get(reverse("run-step", args=[first.pk, 1])).content.decode()
    assert "Compare with the previous run" not in first_page
    # Stepping under htmx redraws the logbook alone and looks for no previous run.
    with CaptureQueriesContext(connection) as partial:
        viewer.get(reverse("run-step", args=[second.pk, 2]), **HTMX)
    with CaptureQueriesContext(connection) as whole:
        viewer.get(reverse("run-step", args=[second.pk, 2]))

    def previous_lookups(queries):
        return [q for q in queries if 'ORDER BY "memory_app_run"."created_at" DESC' in q["sql"]]

    assert len(previous_lookups(whole)) == 1 and previous_lookups(partial) == []


@pytestmark_db
@pytest.mark.slow
def test_a_300_step_run_compares_in_a_fixed_number_of_queries_with_long_texts_cut(viewer):
    ctx = make_context()
    long_output = "line of tool output\n" * 2000
    steps = [action_step(i, observations=None) for i in range(1, 300)]
    for s in steps:
        s["tool_calls"][0]["output"] = long_output
    a = _run(ctx, steps, minutes_ago=5)
    b = _run(ctx, [action_step(i, observations=None) for i in range(1, 300)])
    small = [_run(ctx, [action_step(1)], minutes_ago=9) for _ in range(2)]
    url = reverse("run-compare")
    with CaptureQueriesContext(connection) as few:
        viewer.get(url, {"a": small[0].pk, "b": small[1].pk})
    with CaptureQueriesContext(connection) as many:
        response = viewer.get(url, {"a": a.pk, "b": b.pk})
    assert response.status_code == 200
    assert len(many) == len(few)
    html = response.content.decode()
    assert html.count("<tr id=") == 300
    # Each long output shows as its head with a "Show all" that loads the step's outputs.
    assert long_output not in html and len(html) < 2_500_000
    assert html.count('class="cmp-more"') == 299
    outputs = viewer.get(reverse("step-outputs", args=[a.pk, 2]), **HTMX)
    assert outputs.status_code == 200 and "Show all 2001 lines" in outputs.content.decode()


# --- the Agent API ------------------------------------------------------------------------------


@pytestmark_db
def test_the_api_answers_the_alignment_within_the_keys_confinement():
    ada = make_context(keys={"user": "ada"})
    eve = make_context(keys={"user": "eve"})
    a = _run(ada, [action_step(1), action_step(2), action_step(3)], minutes_ago=5)
    second = action_step(2, error_type="TimeoutError", error_message="slow")
    second["tool_calls"][0]["name"] = "browse"
    b = _run(ada, [action_step(1, input_tokens=200), second])
    other = _run(eve, [action_step(1)])

    api = make_key(scopes=("read",))
    answer = api.get("/api/v1/runs/compare", {"a": a.pk, "b": b.pk})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["a"]["id"], body["b"]["id"]) == (a.pk, b.pk)
    assert body["first_divergence"] == 2
    assert [r["differences"] for r in body["rows"]] == [[], [], ["tool", "error"], ["missing"]]
    assert body["rows"][1]["tokens_delta"] == 99
    assert body["rows"][2]["b"] == {
        "position": 3,
        "kind": "action",
        "tools": ["browse"],
        "tokens": b.steps.get(position=3).total_tokens,
        "cost": None,
        "duration": b.steps.get(position=3).duration,
        "error_type": "TimeoutError",
    }
    assert body["rows"][3]["b"] is None and body["rows"][3]["a"]["position"] == 4
    assert body["tokens_delta"] == b.total_tokens - a.total_tokens
    # Runs of two contexts compare; a key confined to one context sees only its runs.
    assert api.get("/api/v1/runs/compare", {"a": a.pk, "b": other.pk}).status_code == 200
    confined = make_key(scopes=("read",), context_keys={"user": "ada"})
    assert confined.get("/api/v1/runs/compare", {"a": a.pk, "b": b.pk}).status_code == 200
    hidden = confined.get("/api/v1/runs/compare", {"a": a.pk, "b": other.pk})
    assert hidden.status_code == 404 and str(other.pk) in hidden.json()["detail"]
    assert (
        make_key(scopes=("write",)).get("/api/v1/runs/compare", {"a": 1, "b": 2}).status_code == 403
    )
    for bad in ({"a": a.pk}, {"a": "x", "b": b.pk}, {"a": 0, "b": b.pk}, {"a": 2**63, "b": 1}):
        assert api.get("/api/v1/runs/compare", bad).status_code == 422, bad
