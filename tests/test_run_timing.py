"""A run's duration agrees with its steps; model, tokens and cost per step and run."""

from __future__ import annotations

import importlib
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import Client, override_settings

from memory_app import framework_io, pricing
from memory_app.models import Run
from memory_app.queries import logbook as logbook_queries
from memory_app.services.runs import run_create, run_finish, steps_append
from tests.api_helpers import make_key, new_context
from tests.builders import action_step, make_context, make_user

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000.0


def timed_steps(*spans: tuple[float, float], **extra) -> list[dict]:
    """A task step, then one action step per (start offset, seconds) after T0."""
    items = [{"kind": "task", "task": "Find the weather"}]
    for number, (offset, seconds) in enumerate(spans, start=1):
        items.append(
            action_step(number, start_time=T0 + offset, end_time=T0 + offset + seconds, **extra)
        )
    return items


def finished_run(items: list[dict], *, metadata: dict | None = None, **finish) -> Run:
    run, _ = run_create(context=make_context(), task="t", metadata=metadata)
    steps_append(run=run, items=items)
    return run_finish(run=run, status="success", **finish)


def test_a_run_written_at_once_lasts_as_long_as_its_steps():
    # The reported case: created, filled and finished within milliseconds of server time, while
    # its steps (timed by the agent) took 374 s. The run used to say a few ms.
    run = finished_run(timed_steps((0, 2.5), (3, 10.0), (14, 360.0)))
    assert run.duration == pytest.approx(374.0)
    assert run.started_at == datetime.fromtimestamp(T0, tz=UTC)
    assert run.finished_at == datetime.fromtimestamp(T0 + 374, tz=UTC)


def test_an_imported_smolagents_run_lasts_as_long_as_its_steps():
    steps = [
        {"task": "Find the weather", "task_images": None},
        {
            "step_number": 1,
            "timing": {"start_time": T0, "end_time": T0 + 1.6, "duration": 1.6},
            "model_input_messages": None,
            "tool_calls": None,
            "error": None,
            "model_output_message": None,
            "model_output": "x",
            "code_action": None,
            "observations": None,
            "observations_images": None,
            "action_output": None,
            "token_usage": {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12},
            "is_final_answer": False,
        },
        {
            "step_number": 2,
            "timing": {"start_time": T0 + 2, "end_time": T0 + 4.6, "duration": 2.6},
            "model_input_messages": None,
            "tool_calls": None,
            "error": None,
            "model_output_message": None,
            "model_output": "y",
            "code_action": None,
            "observations": None,
            "observations_images": None,
            "action_output": "done",
            "token_usage": {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12},
            "is_final_answer": True,
        },
    ]
    run, created = framework_io.smolagents_run_import(context=make_context(), steps=steps)
    assert created and run.duration == pytest.approx(4.6)


def test_times_the_agent_gives_win_over_its_steps():
    start = datetime(2025, 1, 1, 10, 0, tzinfo=UTC)
    run, _ = run_create(context=make_context(), task="t", started_at=start)
    steps_append(run=run, items=timed_steps((0, 1)))
    run = run_finish(run=run, status="success", finished_at=start + timedelta(seconds=90))
    assert (run.started_at, run.duration) == (start, 90.0)


def test_a_run_whose_steps_carry_no_timing_uses_the_servers_clock():
    run = finished_run(
        [{"kind": "task", "task": "t"}, {"kind": "final_answer", "action_output": 1}]
    )
    assert run.started_at == run.created_at
    assert 0 <= run.duration < 60


def test_migration_repairs_runs_that_contradict_their_steps():
    good = finished_run(timed_steps((0, 4)))
    bad = finished_run(timed_steps((0, 2), (2, 2.6)))
    now = datetime.now(tz=UTC)
    Run.objects.filter(pk=bad.pk).update(
        started_at=now, finished_at=now + timedelta(milliseconds=6), duration=0.006
    )
    migration = importlib.import_module("memory_app.migrations.0006_step_model_cost")
    with connection.cursor() as cursor:
        cursor.execute(migration.REPAIR_RUN_SPANS)
    bad.refresh_from_db()
    assert bad.duration == pytest.approx(4.6)
    assert bad.started_at == datetime.fromtimestamp(T0, tz=UTC)
    before = good.started_at, good.duration
    good.refresh_from_db()
    assert (good.started_at, good.duration) == before


# --- prices ---------------------------------------------------------------------------------


def test_model_prices_match_dated_and_provider_prefixed_names():
    assert pricing.model_price("gpt-4o") == (2.50, 10.00)
    assert pricing.model_price("gpt-4o-2024-08-06") == (2.50, 10.00)
    assert pricing.model_price("openai/gpt-4o-mini") == (0.15, 0.60)
    assert pricing.model_price("gpt-4o-mini-2024-07-18") == (0.15, 0.60)
    assert pricing.model_price("my-own-model") is None
    assert pricing.model_price("") is None
    assert pricing.tokens_cost(
        model="gpt-4o", input_tokens=1000, output_tokens=100
    ) == pytest.approx(0.0035)


@override_settings(AGENTMEMORY_MODEL_PRICES='{"my-own-model": [1, 2], "gpt-4o": null}')
def test_prices_from_the_environment_add_and_remove_models():
    assert pricing.model_price("my-own-model") == (1.0, 2.0)
    assert pricing.model_price("gpt-4o") is None


@pytest.mark.parametrize("value", ["{", "[1, 2]", '{"m": [1]}', '{"m": [-1, 2]}', '{"m": "cheap"}'])
def test_a_bad_price_table_is_refused_clearly(value):
    with override_settings(AGENTMEMORY_MODEL_PRICES=value):
        with pytest.raises(ImproperlyConfigured, match="AGENTMEMORY_MODEL_PRICES"):
            pricing.model_price("gpt-4o")


def test_run_cost_adds_reported_and_priced_steps_per_model():
    items = timed_steps((0, 1), (1, 1), (2, 1))
    items[1].update(model="gpt-4o", input_tokens=1000, output_tokens=100)  # priced: 0.0035
    items[2].update(model="gpt-4o", cost=0.25)  # the agent's own figure wins
    items[3].update(model="gpt-4o-mini", input_tokens=2000, output_tokens=0)  # 0.0003
    cost = logbook_queries.run_cost(run=finished_run(items))
    assert not cost.partial
    assert cost.total == pytest.approx(0.0035 + 0.25 + 0.0003)
    by_model = {m.model: m for m in cost.models}
    assert by_model["gpt-4o"].steps == 2 and by_model["gpt-4o"].cost == pytest.approx(0.2535)
    assert by_model["gpt-4o-mini"].input_tokens == 2000


def test_run_cost_is_unknown_or_a_floor_when_a_model_has_no_price():
    unknown = logbook_queries.run_cost(run=finished_run(timed_steps((0, 1), model="my-own-model")))
    assert unknown.total is None and unknown.partial
    mixed = timed_steps((0, 1), (1, 1))
    mixed[1]["model"] = "gpt-4o"
    mixed[2]["model"] = "my-own-model"
    floor = logbook_queries.run_cost(run=finished_run(mixed))
    assert floor.partial and floor.total == pytest.approx(
        pricing.tokens_cost(model="gpt-4o", input_tokens=101, output_tokens=21)
    )


def test_steps_without_a_model_take_the_runs_model_from_its_metadata():
    cost = logbook_queries.run_cost(
        run=finished_run(timed_steps((0, 1)), metadata={"model": "gpt-4o-mini"})
    )
    assert [m.model for m in cost.models] == ["gpt-4o-mini"] and cost.total is not None


# --- the page -------------------------------------------------------------------------------


@pytest.fixture
def client():
    c = Client()
    c.force_login(make_user(role="viewer"))
    return c


def stats(html: str, name: str) -> list[str]:
    """Every `<dt>name</dt><dd>…</dd>` on the page, as text: the run header's first."""
    found = re.findall(rf"<dt>{name}</dt><dd[^>]*>(.*?)</dd>", html, re.S)
    assert found, name
    return [re.sub(r"<[^>]+>", "", f).strip() for f in found]


def stat(html: str, name: str) -> str:
    return stats(html, name)[0]


def test_run_page_header_timeline_and_step_agree(client):
    items = timed_steps((0, 2.5), (3, 10.0), (14, 360.0), model="gpt-4o")
    run = finished_run(items)
    html = client.get(f"/runs/{run.pk}/steps/4/").content.decode()
    assert stat(html, "Duration") == "6 min 14 s"
    assert "run 6 min 14 s, steps busy 6 min 12 s" in html
    assert stat(html, "At") == "+14.0 s" and stat(html, "Model") == "gpt-4o"
    assert run.steps.get(position=4).input_tokens == 103
    step_cost = pricing.tokens_cost(model="gpt-4o", input_tokens=103, output_tokens=23)
    run_cost = sum(
        pricing.tokens_cost(model="gpt-4o", input_tokens=100 + n, output_tokens=20 + n % 5)
        for n in (1, 2, 3)
    )
    assert stats(html, "Cost") == [f"${run_cost:.4f}", f"${step_cost:.4f}"]
    # The step list shows each step's offset; the axis runs from +0 to the run's length.
    assert re.search(r'<span class="at">\+3\.0 s</span>', html)
    assert 'class="tl-axis"' in html and "<span>+6 min 14 s</span>" in html


def test_run_page_says_unknown_cost_with_a_dash(client):
    run = finished_run(timed_steps((0, 1), model="my-own-model"))
    html = client.get(f"/runs/{run.pk}/steps/2/").content.decode()
    assert stats(html, "Cost") == ["—", "—"]


def test_a_running_runs_header_counts_so_far(client):
    run, _ = run_create(context=make_context(), task="t")
    steps_append(run=run, items=timed_steps((0, 2), (5, 1)))
    html = client.get(f"/runs/{run.pk}/steps/1/").content.decode()
    assert stat(html, "Duration") == "6.0 s so far"
    assert stat(html, "Tokens").endswith("so far")


def test_the_api_takes_a_steps_model_and_cost_and_refuses_a_negative_one():
    api = make_key()
    context_id = new_context(api)
    run = api.post(f"/api/v1/contexts/{context_id}/runs", {"task": "t"}).json()
    step = {"kind": "action", "model": "gpt-4o-mini", "cost": 0.0123}
    out = api.post(f"/api/v1/runs/{run['id']}/steps", {"steps": [step]})
    assert out.status_code == 201, out.content
    assert (out.json()["steps"][0]["model"], out.json()["steps"][0]["cost"]) == (
        "gpt-4o-mini",
        0.0123,
    )
    bad = api.post(f"/api/v1/runs/{run['id']}/steps", {"steps": [{"kind": "action", "cost": -1}]})
    assert bad.status_code == 422
    assert Run.objects.get(pk=run["id"]).step_count == 1


@override_settings(AGENTMEMORY_MODEL_PRICES='{"m": [1]}')
def test_a_bad_price_table_fails_the_system_checks():
    from memory_app.checks import check_model_prices

    errors = check_model_prices(None)
    assert [e.id for e in errors] == ["memory_app.E002"]
    assert "AGENTMEMORY_MODEL_PRICES" in errors[0].msg


def test_a_timeline_bar_never_spans_an_idle_gap():
    # 302 one-second steps back to back, but the agent waited 200 s after step 153 (the task is
    # step 1): with more steps than bars, steps are drawn in pairs, and step 153 shares its bar
    # with step 154. That bar must not bridge the wait.
    spans = [(float(i), 1.0) for i in range(152)] + [(352.0 + i, 1.0) for i in range(150)]
    run = finished_run(timed_steps(*spans))
    timeline = logbook_queries.run_timeline(run=run)
    scale = timeline.width / timeline.span
    idle = (152 * scale, 352 * scale)  # from step 153's end to step 154's start
    assert idle[1] - idle[0] > 100
    for bar in timeline.bars:
        assert bar.x + bar.width <= idle[0] + 0.01 or bar.x >= idle[1] - 0.01, (
            f"steps {bar.start}-{bar.end} drawn from {bar.x} to {bar.x + bar.width}: across the "
            f"idle time {idle}"
        )
    # Still grouped (not one bar per step), and every step in exactly one bar.
    assert len(timeline.bars) <= 205
    covered = [p for bar in timeline.bars for p in range(bar.start, bar.end + 1)]
    assert covered == list(range(1, run.last_position + 1))
