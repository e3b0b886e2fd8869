"""Two runs compared in headless Chromium: picked with the keyboard in the runs table, the first
divergence highlighted and reached by its link, a long output shown whole on demand, the
logbook's "Compare with the previous run of this context". Screenshots at 1440 and 390 px in
test-artifacts/screenshots/."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from memory_app.services.runs import run_create, run_finish, steps_append
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, action_step, make_context, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LONG_OUTPUT = "".join(f"row {i}: <b>not bold</b>\n" for i in range(400))


@pytest.fixture
def browser_page(browser_page):
    # The live server's first answer waits for its database connection, which takes more than
    # the default ten seconds on a loaded machine.
    browser_page.set_default_navigation_timeout(30_000)
    return browser_page


def _run(context, steps, *, task, minutes_ago, status="success"):
    started = timezone.now() - timedelta(minutes=minutes_ago)
    run, _ = run_create(context=context, task=task, agent_name="helper", started_at=started)
    steps_append(run=run, items=[{"kind": "task", "task": task}, *steps])
    return run_finish(run=run, status=status, finished_at=started + timedelta(seconds=20))


def _tool(step, name, arguments, output="Sunny, 22C"):
    step["tool_calls"][0].update(name=name, arguments=arguments, output=output)
    return step


@pytest.fixture
def two_runs():
    make_user(role="viewer", username="vera")
    ctx = make_context(keys={"user": "ada"}, title="Weather desk")
    good = _run(
        ctx,
        [
            _tool(action_step(1), "search", {"q": "weather Paris"}, LONG_OUTPUT),
            _tool(action_step(2), "fetch", {"url": "https://example.test/paris"}),
            _tool(action_step(3), "final_answer", {"answer": "Sunny"}),
        ],
        task="What is the weather in Paris?",
        minutes_ago=60,
    )
    bad = _run(
        ctx,
        [
            _tool(action_step(1, input_tokens=401), "search", {"q": "weather Paris"}, LONG_OUTPUT),
            _tool(action_step(2), "browse", {"url": "https://example.test/paris"}),
            _tool(
                action_step(3, error_type="TimeoutError", error_message="browse took too long"),
                "browse",
                {"url": "https://example.test/paris", "retry": True},
            ),
            _tool(action_step(4), "final_answer", {"answer": "I could not tell"}),
        ],
        task="What is the weather in Paris?",
        minutes_ago=5,
        status="failed",
    )
    return good, bad


def test_pick_two_runs_by_keyboard_and_see_where_they_part(browser_page, two_runs):
    good, bad = two_runs
    page = browser_page
    login(page, "vera", TEST_PASSWORD, next_path="/runs/")
    for run in (bad, good):
        box = page.locator(f'input[name=run][value="{run.pk}"]')
        box.focus()
        page.keyboard.press("Space")
        expect(box).to_be_checked()
    expect(page.locator("[data-compare-count]")).to_have_text("Two runs picked: press Compare.")
    page.locator("[data-compare-button]").focus()
    with page.expect_navigation():
        page.keyboard.press("Enter")
    # The earlier run is the baseline, whatever the order of the picks.
    expect(page).to_have_url(re.compile(rf"/runs/compare/\?a={good.pk}&b={bad.pk}$"))

    first = page.locator("#first-divergence")
    expect(first).to_have_attribute("data-row", "3")
    expect(first).to_have_attribute("data-differences", "tool")
    expect(first.locator(".why")).to_have_text("another tool")
    expect(first.locator("td.side").nth(0)).to_contain_text("fetch")
    expect(first.locator("td.side").nth(1)).to_contain_text("browse")
    expect(page.locator("#divergence-summary h2")).to_have_text("First divergence: row 3")
    # Rows before it are the same; the extra step of the failed run is a step only it has.
    expect(page.locator("tr.differs")).to_have_count(3)
    expect(page.locator('tr[data-row="2"]')).not_to_have_class(re.compile("differs"))
    expect(page.locator('tr[data-row="4"]')).to_have_attribute("data-differences", "missing")
    expect(page.locator('tr[data-row="5"]')).to_have_attribute(
        "data-differences", "arguments output"
    )
    expect(page.locator('tr[data-row="2"] td[data-label="Δ tokens"]')).to_have_text("+300")

    page.click("text=Go to the first divergence")
    expect(page).to_have_url(re.compile(r"#first-divergence$"))
    expect(first).to_be_in_viewport()

    # A long output shows its head; "Show all" loads it whole (escaped, folded).
    more = page.locator('tr[data-row="2"] td.side').nth(0).locator("details.cmp-more")
    more.locator("summary").click()
    expect(more.locator(".fold")).to_contain_text("Show all 401 lines")
    expect(more.locator(".cmp-more-body")).to_contain_text("row 0: <b>not bold</b>")
    assert page.locator(".cmp-more-body b").count() == 0

    screenshot(page, "run-compare", widths=("wide", "narrow"))
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    page.watch.assert_clean()


def test_the_logbook_compares_with_the_previous_run_of_its_context(browser_page, two_runs):
    good, bad = two_runs
    page = browser_page
    login(page, "vera", TEST_PASSWORD, next_path=f"/runs/{bad.pk}/")
    page.click("text=Compare with the previous run of this context")
    expect(page).to_have_url(re.compile(rf"/runs/compare/\?a={good.pk}&b={bad.pk}$"))
    expect(page.locator("#first-divergence")).to_have_attribute("data-row", "3")
    # Swapping makes the failed run the baseline: the deltas change sign.
    page.click("text=Swap the runs")
    expect(page).to_have_url(re.compile(rf"\?a={bad.pk}&b={good.pk}$"))
    expect(page.locator('tr[data-row="2"] td[data-label="Δ tokens"]')).to_have_text("−300")
    page.watch.assert_clean()
