"""Live run view on the server: the poll endpoint a running run's logbook asks every 2 s."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client

from memory_app.models import RunStatus
from memory_app.services.runs import run_create, run_finish, steps_append, steps_order_by_start
from tests.builders import action_step, make_context, make_user

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def client():
    c = Client()
    c.force_login(make_user(role="viewer"))
    return c


def running_run(steps: int):
    run, _ = run_create(context=make_context(), task="Find the weather", agent_name="t")
    items = [{"kind": "task", "task": "Find the weather"}]
    items += [action_step(n) for n in range(1, steps)]
    if items[:steps]:
        steps_append(run=run, items=items[:steps])
    return run


def live(client, run, **params):
    return client.get(f"/runs/{run.pk}/live/", params, **HX)


def poller(html: str) -> str | None:
    found = re.search(r'<p id="run-live"[^>]*>', html)
    return found.group(0) if found else None


def test_a_running_runs_page_polls_from_its_last_step(client):
    run = running_run(3)
    html = client.get(f"/runs/{run.pk}/steps/2/").content.decode()
    tag = poller(html)
    assert tag and 'hx-trigger="every 2s"' in tag
    assert "after=3&amp;position=2&amp;tail=1" in tag


def test_a_finished_runs_page_does_not_poll(client):
    run = running_run(3)
    run_finish(run=run, status="success")
    assert poller(client.get(f"/runs/{run.pk}/steps/2/").content.decode()) is None


def test_poll_appends_new_steps_in_order_and_refreshes_header_and_stepper(client):
    run = running_run(3)
    steps_append(
        run=run,
        items=[action_step(3), action_step(4, error_type="ToolError", error_message="boom")],
    )
    html = live(client, run, after=3, position=2, tail=1).content.decode()
    appended = re.search(r'<ol hx-swap-oob="beforeend:#step-list">(.*?)</ol>', html, re.S)
    assert appended, html
    ids = re.findall(r'<li id="step-item-(\d+)"', appended.group(1))
    assert ids == ["4", "5"]
    # The step on screen is not sent again, nor its detail.
    assert "step-item-2" not in html and "step-detail" not in html
    assert re.search(r'<dl id="run-stats" class="stats" hx-swap-oob="true">', html)
    assert re.search(r'<nav id="stepper"[^>]*hx-swap-oob="true"', html)
    assert "Step <b>2</b> of 5" in html and f'href="/runs/{run.pk}/steps/5/"' in html
    # Still running: the next poll asks after the newest step.
    assert "after=5&amp;position=2&amp;tail=1" in poller(html)


def test_poll_with_nothing_new_sends_no_steps(client):
    run = running_run(3)
    html = live(client, run, after=3, position=3, tail=1).content.decode()
    assert "step-item-" not in html
    assert "after=3&amp;position=3" in poller(html)


def test_poll_stops_once_the_run_is_finished(client):
    run = running_run(3)
    steps_append(run=run, items=[action_step(3)])
    run_finish(run=run, status=RunStatus.FAILED)
    html = live(client, run, after=3, position=1, tail=1).content.decode()
    assert poller(html) is None
    assert "step-item-4" in html and 'id="run-status" class="badge status-failed"' in html


def test_poll_of_a_list_that_does_not_reach_the_end_updates_only_the_last_step_link(client):
    run = running_run(40)
    steps_append(run=run, items=[action_step(40)])
    html = live(client, run, after=40, position=1, tail=0).content.decode()
    assert "step-item-" not in html
    assert re.search(r'<li id="step-list-later" class="more" hx-swap-oob="true">', html)
    assert "last step (41)" in html


def test_a_run_without_steps_polls_then_shows_its_first_step(client):
    run = running_run(0)
    page = client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    assert 'hx-target="#logbook"' in poller(page.content.decode())
    html = live(client, run).content.decode()
    assert "This run has no steps yet." in html and poller(html)
    steps_append(run=run, items=[{"kind": "task", "task": "Find the weather"}])
    response = live(client, run)
    html = response.content.decode()
    assert '<section id="logbook" class="logbook" data-position="1"' in html
    assert response.headers["HX-Replace-Url"] == f"/runs/{run.pk}/steps/1/"


def test_a_failed_run_without_steps_shows_no_poller(client):
    run = running_run(0)
    run_finish(run=run, status="failed")
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "This run has no steps yet." in html and poller(html) is None


def test_poll_bad_input(client):
    run = running_run(2)
    assert live(client, run, after="x", position=1).status_code == 400
    assert live(client, run, after=-1, position=1).status_code == 400
    assert live(client, run, after=0, position=3).status_code == 404
    assert client.get("/runs/999999/live/", HX).status_code == 404


def test_poll_needs_a_login():
    run = running_run(2)
    response = Client().get(f"/runs/{run.pk}/live/", {"after": 1, "position": 1})
    assert response.status_code in (302, 401, 403)


def renumbered_run():
    """A traced run as trace ingest writes it: action steps first, then its task step, which
    starts first and so takes position 1 (the root span ends last)."""
    run, _ = run_create(context=make_context(), task="Find the weather", agent_name="t")
    steps_append(run=run, items=[action_step(n) for n in (1, 2, 3)])
    ids = dict(run.steps.values_list("position", "pk"))
    steps_append(
        run=run, items=[{"kind": "task", "task": "Find the weather", "start_time": 1_699_999_999.0}]
    )
    assert steps_order_by_start(run=run)
    return run, ids


def test_a_page_of_a_running_run_names_the_steps_it_holds(client):
    run = running_run(3)
    ids = dict(run.steps.values_list("position", "pk"))
    tag = poller(client.get(f"/runs/{run.pk}/steps/2/").content.decode())
    assert f"after=3&amp;position=2&amp;tail=1&amp;step={ids[2]}&amp;last={ids[3]}" in tag
    steps_append(run=run, items=[action_step(3)])
    html = live(client, run, after=3, position=2, tail=1, step=ids[2], last=ids[3]).content.decode()
    new = run.steps.get(position=4).pk
    assert (
        "step-item-4" in html
        and f"after=4&amp;position=2&amp;tail=1&amp;step={ids[2]}&amp;last={new}" in poller(html)
    )


def test_steps_renumbered_under_the_page_redraw_the_logbook_at_the_same_step(client):
    run, ids = renumbered_run()
    response = live(client, run, after=3, position=2, tail=1, step=ids[2], last=ids[3])
    html = response.content.decode()
    # The step the operator reads is now step 3: the whole logbook comes back there.
    assert response["HX-Retarget"] == "#logbook" and response["HX-Reswap"] == "outerHTML"
    assert response["HX-Replace-Url"] == f"/runs/{run.pk}/steps/3/"
    assert '<section id="logbook" class="logbook" data-position="3"' in html
    assert re.findall(r'<li id="step-item-(\d+)"', html) == ["1", "2", "3", "4"]
    assert 'Step 3 <span class="kind">Action</span>' in html and "(step_number 2)" in html
    # Its lazy details load by step id and are kept by the swap.
    assert f'id="model-input-box-{ids[2]}" class="block lazy" hx-preserve' in html
    assert f"/model-input/?step={ids[2]}" in html
    assert f"step={ids[2]}&amp;last={run.steps.get(position=4).pk}" in poller(html)


def test_a_late_step_after_the_step_on_screen_is_noticed_too(client):
    run, _ = run_create(context=make_context(), task="Find the weather", agent_name="t")
    steps_append(run=run, items=[action_step(n) for n in (1, 2, 4)])
    ids = dict(run.steps.values_list("position", "pk"))
    # Step 3 arrives late and goes between: the step on screen (1) stays, the page's last moves.
    steps_append(run=run, items=[action_step(3)])
    assert steps_order_by_start(run=run)
    response = live(client, run, after=3, position=1, tail=1, step=ids[1], last=ids[3])
    assert response["HX-Replace-Url"] == f"/runs/{run.pk}/steps/1/"
    html = response.content.decode()
    assert re.findall(r"\(step_number (\d)\)", html) == ["1"]
    assert re.findall(r'<li id="step-item-(\d+)"', html) == ["1", "2", "3", "4"]
    # A page whose steps are where it saw them gets the usual answer.
    now = dict(run.steps.values_list("position", "pk"))
    response = live(client, run, after=4, position=1, tail=1, step=now[1], last=now[4])
    assert "HX-Retarget" not in response and "step-item-" not in response.content.decode()


def test_step_details_load_by_step_id_after_renumbering(client):
    run, ids = renumbered_run()
    # The page still says position 2 in the URL, but the step it means is now at 3.
    html = client.get(
        f"/runs/{run.pk}/steps/2/model-input/", {"step": ids[2]}, **HX
    ).content.decode()
    assert 'id="model-input-3"' in html
    html = client.get(
        f"/runs/{run.pk}/steps/2/transcript/", {"step": ids[2]}, **HX
    ).content.decode()
    assert 'id="transcript-3"' in html
    assert (
        client.get(f"/runs/{run.pk}/steps/2/model-input/", {"step": 10**9}, **HX).status_code == 404
    )
    assert (
        client.get(f"/runs/{run.pk}/steps/2/model-input/", {"step": "x"}, **HX).status_code == 400
    )
    other = running_run(2)
    foreign = other.steps.get(position=1).pk
    assert (
        client.get(f"/runs/{run.pk}/steps/1/transcript/", {"step": foreign}, **HX).status_code
        == 404
    )


def poll_url(html: str) -> str:
    return unescape(re.search(r'hx-get="([^"]+)"', poller(html)).group(1))


def test_a_poll_sends_only_the_new_steps_however_long_the_run_grows(client):
    # Every poll used to send the whole timeline picture again: 50 KB at 300 steps, growing.
    run = running_run(1)
    t0 = 1_700_000_000.0
    written = 1
    sizes = {}
    for total in (20, 900):
        items = [
            action_step(n, start_time=t0 + n, end_time=t0 + n + 0.5) for n in range(written, total)
        ]
        steps_append(run=run, items=items)
        written = total
        html = client.get(f"/runs/{run.pk}/steps/{total}/").content.decode()
        assert html.count('class="tl-bar') == total  # one bar per step, laid out by app.js
        url = poll_url(html)
        steps_append(
            run=run,
            items=[action_step(n, start_time=t0 + n, end_time=t0 + n + 0.5) for n in (total,)],
        )
        written += 1
        answer = client.get(url, **HX)
        assert answer.status_code == 200
        body = answer.content.decode()
        # The new step's bar is appended, the picture is not sent again.
        bars = re.search(r'<svg hx-swap-oob="beforeend:#tl-bars">(.*?)</svg>', body, re.S)
        assert bars and re.findall(r'data-p="(\d+)"', bars.group(1)) == [str(total + 1)]
        assert 'id="run-timeline"' not in body
        sizes[total] = len(answer.content)
    assert sizes[900] < 8_000, sizes
    assert sizes[900] - sizes[20] < 500, sizes
