"""A run being written while its logbook is open: steps stream in through the API (over HTTP to
the live server) and appear in the open page without a reload; the operator's place stays."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from memory_app import auth
from memory_app.services.runs import run_create, run_finish, steps_append
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, action_step, make_user
from tests.otlp_queue import map_queued

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def api(live_server):
    issued = auth.apikey_create(name="agent", scopes=["read", "write"])
    with httpx.Client(
        base_url=f"{live_server.url}/api/v1",
        headers={"Authorization": f"Bearer {issued.secret}"},
        timeout=10,
    ) as client:
        yield client


def post(api, path: str, body: dict) -> dict:
    response = api.post(path, json=body)
    assert response.status_code in (200, 201), response.text
    return response.json()


def stream(api, run_id: int, *numbers: int) -> None:
    for number in numbers:
        post(api, f"/runs/{run_id}/steps", {"steps": [action_step(number)]})


def step_positions(page) -> list[int]:
    return [int(p) for p in page.locator("#step-list li .pos").all_inner_texts()]


def test_new_steps_appear_in_order_and_the_operator_keeps_their_place(browser_page, api):
    make_user(role="viewer", username="watcher")
    context = post(api, "/contexts", {"keys": {"user": "ada", "chat": "live"}})
    run = post(api, f"/contexts/{context['id']}/runs", {"task": "Find the weather in Paris"})
    post(api, f"/runs/{run['id']}/steps", {"steps": [{"kind": "task", "task": "Find the weather"}]})
    stream(api, run["id"], 1, 2)

    page = browser_page
    live_polls = []
    page.on("request", lambda r: "/live/" in r.url and live_polls.append(r.url))
    login(page, "watcher", TEST_PASSWORD, next_path=f"/runs/{run['id']}/steps/2/")
    page.wait_for_selector("#logbook[data-position='2']")
    assert step_positions(page) == [1, 2, 3]
    expect(page.locator("#run-live")).to_be_visible()

    # The operator opens what the model saw at step 2 and scrolls down to read it.
    page.locator("details.lazy summary", has_text="What the model saw").click()
    page.wait_for_selector("details.lazy[open] .chat")
    page.evaluate("window.scrollTo(0, 250)")
    scroll_before = page.evaluate("window.scrollY")
    assert scroll_before > 0

    stream(api, run["id"], 3, 4)
    expect(page.locator("#step-item-5")).to_be_attached(timeout=8_000)
    stream(api, run["id"], 5)
    expect(page.locator("#step-item-6")).to_be_attached(timeout=8_000)

    assert step_positions(page) == [1, 2, 3, 4, 5, 6]
    # Same step selected, same URL, the opened details still open with their content.
    assert page.url.endswith(f"/runs/{run['id']}/steps/2/")
    assert page.locator("#step-list li.current .pos").inner_text() == "2"
    assert page.locator(".step-detail h2").inner_text().startswith("Step 2")
    opened = page.locator("details.lazy[open]")
    assert opened.count() == 1 and "What the model saw" in opened.inner_text()
    assert "You are a careful agent." in opened.inner_text()
    assert abs(page.evaluate("window.scrollY") - scroll_before) < 5
    # Header and stepper follow the run.
    expect(page.locator("#run-stats")).to_contain_text("6")
    expect(page.locator("#stepper .where")).to_have_text("Step 2 of 6")
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, "run-live")

    # The keyboard cursor still works on the refreshed stepper.
    page.keyboard.press("j")
    page.wait_for_selector("#logbook[data-position='3']")
    assert page.url.endswith("/steps/3/")

    # Finishing the run stops the polling.
    post(api, f"/runs/{run['id']}/finish", {"status": "success", "final_answer": "Sunny"})
    expect(page.locator("#run-status")).to_have_text("Success", timeout=8_000)
    expect(page.locator("#run-live")).to_have_count(0)
    polls = len(live_polls)
    page.wait_for_timeout(4_500)
    assert len(live_polls) == polls, "the page kept polling a finished run"
    page.watch.assert_clean()


def test_a_traced_run_keeps_the_operators_step_when_its_task_step_arrives_last(
    browser_page, live_server
):
    """OpenTelemetry spans stream in as smolagents ends them; the root span comes last and brings
    the task step, which starts first and takes position 1: every step moves down one, under the
    open page."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from memory_app.models import Run
    from tests.otel_agents import protobuf_body, traced_run

    make_user(role="viewer", username="watcher")
    _, spans = traced_run("tool_calling", resource={"agentmemory.context.user": "ada"})
    assert [s.name for s in spans][6:] == [
        "Step 2",
        "ScriptedModel.generate",
        "FinalAnswerTool",
        "Step 3",
        "ToolCallingAgent.run",
    ]
    secret = auth.apikey_create(name="otel", scopes=["write"]).secret

    def export(batch):
        body = protobuf_body(batch)
        ExportTraceServiceRequest.FromString(body)  # what an exporter sends
        response = httpx.post(
            f"{live_server.url}/v1/traces",
            content=body,
            timeout=10,
            headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/x-protobuf"},
        )
        assert response.status_code == 200, response.content
        map_queued()

    export(spans[:7])  # the planning call, steps 1 and 2
    run = Run.objects.get()
    assert list(run.steps.order_by("position").values_list("kind", "step_number")) == [
        ("planning", None),
        ("action", 1),
        ("action", 2),
    ]

    page = browser_page
    login(page, "watcher", TEST_PASSWORD, next_path=f"/runs/{run.pk}/steps/2/")
    page.wait_for_selector("#logbook[data-position='2']")
    expect(page.locator("#run-live")).to_be_visible()
    page.locator("details.lazy summary", has_text="What the model saw").click()
    page.wait_for_selector("details.lazy[open] .chat .chat-msg")
    seen = page.locator("details.lazy[open]").inner_text()
    page.evaluate("window.scrollTo(0, 200)")
    scroll_before = page.evaluate("window.scrollY")

    export(spans[7:10])  # step 3 ends: it joins the end of the list
    expect(page.locator("#step-item-4")).to_be_attached(timeout=8_000)
    assert step_positions(page) == [1, 2, 3, 4]

    export(spans[10:])  # the root: the task step takes position 1, the run is finished
    page.wait_for_url(re.compile(rf"/runs/{run.pk}/steps/3/$"), timeout=8_000)
    expect(page.locator("#run-status")).to_have_text("Success")
    assert step_positions(page) == [1, 2, 3, 4, 5]
    assert page.locator("#step-list li .kind").first.inner_text() == "Task"
    # The same step, under its new number, with the details the operator opened.
    # (waited for: once under a full suite's load the list was read between two swaps)
    expect(page.locator("#step-list li.current .pos")).to_have_text("3")
    assert page.locator(".step-detail h2").inner_text().startswith("Step 3")
    assert "(step_number 1)" in page.locator(".step-detail h2").inner_text()
    opened = page.locator("details.lazy[open]")
    assert opened.count() == 1 and opened.inner_text() == seen
    assert abs(page.evaluate("window.scrollY") - scroll_before) < 5
    expect(page.locator("#run-live")).to_have_count(0)
    # A detail opened now loads this step's (by id), not the one the old number named.
    page.locator("details.lazy summary", has_text="Transcript after this step").click()
    page.wait_for_selector("details.lazy[open] #transcript-3")
    page.keyboard.press("j")
    page.wait_for_selector("#logbook[data-position='4']")
    assert "(step_number 2)" in page.locator(".step-detail h2").inner_text()
    page.watch.assert_clean()


def test_a_run_without_steps_shows_its_first_step_when_it_arrives(browser_page, api):
    make_user(role="viewer", username="watcher")
    context = post(api, "/contexts", {"keys": {"user": "ada", "chat": "empty"}})
    run = post(api, f"/contexts/{context['id']}/runs", {"task": "Plan a trip"})
    page = browser_page
    login(page, "watcher", TEST_PASSWORD, next_path=f"/runs/{run['id']}/")
    expect(page.locator("#logbook")).to_contain_text("This run has no steps yet.")
    post(api, f"/runs/{run['id']}/steps", {"steps": [{"kind": "task", "task": "Plan a trip"}]})
    page.wait_for_selector("#logbook[data-position='1']", timeout=8_000)
    page.wait_for_url(re.compile(rf"/runs/{run['id']}/steps/1/$"))
    assert step_positions(page) == [1]
    page.watch.assert_clean()


def test_run_page_shows_steps_on_the_runs_clock_with_model_and_cost(browser_page):
    from tests.builders import make_context

    make_user(role="viewer", username="watcher")
    run, _ = run_create(
        context=make_context(title="Timing"),
        task="Find the weather in Paris",
        metadata={"model": "gpt-4o"},
    )
    start = 1_700_000_000.0
    items = [{"kind": "task", "task": "Find the weather in Paris"}]
    for number, (offset, seconds) in enumerate([(0, 2.5), (3, 10.0), (14, 360.0)], start=1):
        items.append(
            action_step(number, start_time=start + offset, end_time=start + offset + seconds)
        )
    steps_append(run=run, items=items)
    run_finish(run=run, status="success", final_answer="Sunny")

    page = browser_page
    login(page, "watcher", TEST_PASSWORD, next_path=f"/runs/{run.pk}/steps/4/")
    page.wait_for_selector("#logbook[data-position='4']")
    header = page.locator("#run-stats")
    expect(header).to_contain_text("6 min 14 s")
    expect(header).to_contain_text("gpt-4o")
    expect(page.locator(".step-detail .facts")).to_contain_text("+14.0 s")
    expect(page.locator("#run-timeline .tl-axis")).to_contain_text("+6 min 14 s")
    # The long step's bar spans most of the timeline: it is drawn on the clock, not per slot.
    widths = [
        float(w)
        for w in page.locator("svg.tl rect.tl-dur").evaluate_all(
            "els => els.map(e => e.getAttribute('width'))"
        )
    ]
    assert max(widths) > 900
    screenshot(page, "run-timeline")
    page.watch.assert_clean()
