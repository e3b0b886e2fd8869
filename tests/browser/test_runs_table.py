"""The runs table in headless Chromium: filters set on the page land in the URL (a view is
shared by its address), key chips come and go, pages follow, and the home page leads with the
failed and running runs. Screenshots at 1440 and 390 px in test-artifacts/screenshots/."""

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

ROWS = "table.runs-table tbody tr"


@pytest.fixture
def fleet():
    make_user(role="viewer", username="vera")
    ada = make_context(keys={"user": "ada", "team": "red"}, title="Ada's chat")
    eve = make_context(keys={"user": "eve", "team": "blue"}, title="Eve's chat")
    now = timezone.now()
    specs = [
        ("Summarise the quarterly report", ada, "success", None, "gpt-4o"),
        (
            "Book a table for two",
            ada,
            "failed",
            "TimeoutError: booking API took too long",
            "gpt-4o-mini",
        ),
        ("Plan a trip to Lisbon", eve, "failed", "ValueError: no such airport", "gpt-4o"),
        ("Answer the support ticket", eve, "running", None, "claude-sonnet-4"),
        ("Translate the menu", eve, "max_steps_error", None, "gpt-4o-mini"),
    ]
    for i, (task, ctx, status, error, model) in enumerate(specs):
        run, _ = run_create(
            context=ctx, task=task, agent_name="helper", started_at=now - timedelta(minutes=10 * i)
        )
        extra = {"model": model}
        if error:
            extra.update(error_type="AgentExecutionError", error_message=error)
        steps_append(run=run, items=[{"kind": "task", "task": task}, action_step(1, **extra)])
        if status != "running":
            run_finish(run=run, status=status, finished_at=run.started_at + timedelta(seconds=42))
    # Enough older runs for a second page.
    for i in range(55):
        run, _ = run_create(
            context=ada, task=f"Routine check {i}", started_at=now - timedelta(days=2)
        )
        run_finish(run=run, status="success", finished_at=run.started_at + timedelta(seconds=1))


def no_sideways_scroll(page) -> bool:
    return page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")


def test_filters_go_into_the_url_and_the_url_gives_the_same_view(browser_page, fleet):
    page = browser_page
    login(page, "vera", TEST_PASSWORD, next_path="/runs/")
    expect(page.locator(ROWS)).to_have_count(50)
    expect(page.locator(ROWS).first).to_contain_text("Summarise the quarterly report")

    page.locator("input[name=status][value=failed]").check()
    page.fill("input[name=add]", "team=blue")
    page.click(".run-filters button[type=submit]")
    expect(page.locator(".chips a.chip")).to_have_text(re.compile(r"team=blue"))
    expect(page.locator(ROWS)).to_have_count(1)
    expect(page.locator(ROWS)).to_contain_text("Plan a trip to Lisbon")
    assert "status=failed" in page.url and "key=team%3Dblue" in page.url
    shared = page.url
    screenshot(page, "runs-table-filtered", widths=("wide", "narrow"))

    # Error text, typed and sent with Enter, narrows on top of the rest.
    page.locator(".chips a.chip").click()
    expect(page.locator(ROWS)).to_have_count(2)
    page.fill("input[name=error]", "timeouterror")
    page.press("input[name=error]", "Enter")
    expect(page.locator(ROWS)).to_have_count(1)
    expect(page.locator(ROWS)).to_contain_text("Book a table for two")
    assert "error=timeouterror" in page.url

    # The shared address opens the same view in a fresh load.
    page.goto(shared)
    expect(page.locator(ROWS)).to_have_count(1)
    expect(page.locator(ROWS)).to_contain_text("Plan a trip to Lisbon")
    expect(page.locator("input[name=status][value=failed]")).to_be_checked()
    page.watch.assert_clean()


def test_pages_sorts_and_the_narrow_layout(browser_page, fleet):
    page = browser_page
    login(page, "vera", TEST_PASSWORD, next_path="/runs/")
    page.click("a[rel=next]")
    expect(page.locator(ROWS)).to_have_count(10)
    assert "cursor=" in page.url
    page.click("text=First page")
    expect(page.locator(ROWS)).to_have_count(50)

    page.select_option("select[name=sort]", "duration")
    page.click(".run-filters button[type=submit]")
    expect(page).to_have_url(re.compile(r"sort=duration"))
    expect(page.locator(ROWS).first.locator("td[data-label=Duration]")).to_have_text("42.0 s")
    expect(page.locator(ROWS).last.locator("td[data-label=Duration]")).to_have_text("1.0 s")
    # The model chip of a row, and a click on a context key filters by it.
    page.locator(ROWS).first.locator("a.kv", has_text="team=").click()
    expect(page.locator(".chips a.chip")).to_have_count(1)
    screenshot(page, "runs-table", widths=("wide", "narrow"))
    page.set_viewport_size({"width": 390, "height": 844})
    assert no_sideways_scroll(page)
    page.watch.assert_clean()


def test_home_leads_with_failed_and_running_runs(browser_page, fleet):
    page = browser_page
    login(page, "vera", TEST_PASSWORD, next_path="/")
    failed = page.locator("#failed-runs + table " + "tbody tr")
    expect(failed).to_have_count(3)
    expect(page.locator("#running-runs + table tbody tr")).to_have_text(
        re.compile("Answer the support ticket")
    )
    screenshot(page, "home-failed-and-running", widths=("wide", "narrow"))
    page.set_viewport_size({"width": 390, "height": 844})
    assert no_sideways_scroll(page)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.click("text=all failed runs")
    expect(page.locator(ROWS)).to_have_count(3)
    assert "status=failed" in page.url and "status=max_steps_error" in page.url
    page.locator(ROWS, has_text="Plan a trip to Lisbon").locator("a.run-link").click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/steps/1/$"))
    page.watch.assert_clean()
