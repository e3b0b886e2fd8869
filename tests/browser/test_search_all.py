"""Search everything in headless Chromium: "/" puts the cursor in the top bar's box, the results
page groups hits by context and run with the matched words marked (agent text escaped), the
filters land in the URL, and a hit's link opens the step in its run's logbook. Screenshots at
1440 and 390 px in test-artifacts/screenshots/."""

from __future__ import annotations

import re
import urllib.request

import pytest
from playwright.sync_api import expect

from memory_app.services.runs import run_create, run_finish, steps_append
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, action_step, add_messages, make_context, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def store(live_server):
    # The server's first page imports and renders what every later one reuses: on a loaded
    # shared machine that alone can outlast a navigation's timeout.
    urllib.request.urlopen(live_server.url + "/accounts/login/", timeout=300).read()
    make_user(role="viewer", username="vera")
    ada = make_context(keys={"user": "ada"}, title="Ada's chat")
    eve = make_context(keys={"user": "eve"}, title="Eve's chat")
    add_messages(context=ada, count=1, text="Can you check the flamingo booking?")
    run, _ = run_create(context=ada, task="Book the flamingo tour", agent_name="helper")
    steps_append(
        run=run,
        items=[
            {"kind": "task", "task": "Book the flamingo tour"},
            action_step(1),
            action_step(
                2,
                observations="<img src=x onerror=alert(1)> flamingo tour sold out",
                error_type="AgentExecutionError",
                error_message="booking API refused the flamingo request",
            ),
        ],
    )
    run_finish(run=run, status="failed")
    other, _ = run_create(context=eve, task="Plan the trip", agent_name="helper")
    steps_append(
        run=other,
        items=[
            action_step(
                1,
                tool_calls=[{"name": "web_search", "arguments": {"query": "flamingo lagoon"}}],
            )
        ],
    )
    run_finish(run=other, status="success")
    return run, other


def test_search_groups_hits_and_a_hit_opens_its_step(browser_page, store):
    run, other = store
    page = browser_page
    # A search page reads several tables: give a loaded shared machine room before failing.
    page.set_default_timeout(30_000)
    login(page, "vera", TEST_PASSWORD, next_path="/runs/")
    page.keyboard.press("/")
    expect(page.locator("#top-search")).to_be_focused()
    page.keyboard.type("flamingo")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert re.search(r"/search/\?q=flamingo$", page.url)

    groups = page.locator(".search-group")
    expect(groups).to_have_count(2)
    ada = groups.filter(has_text="Ada's chat")
    expect(ada.locator(".search-run")).to_have_count(2)  # its messages, then its run
    expect(ada.locator(".search-run h3").first).to_have_text("Messages")
    expect(ada.locator(".hit")).to_have_count(3)
    expect(groups.filter(has_text="Eve's chat").locator(".hit.kind-tool")).to_have_count(1)
    expect(page.locator(".hit mark").first).to_have_text(re.compile("flamingo", re.I))
    # Agent-written markup shows as text.
    expect(page.locator(".hit.kind-output .snippet")).to_contain_text("<img src=x")
    assert page.locator(".hit img").count() == 0
    screenshot(page, "search-all", widths=("wide", "narrow"))

    # A filter narrows on top of the query, in the URL.
    page.locator("input[name=kind][value=error]").check()
    page.click(".search-filters button[type=submit]")
    expect(page.locator(".hit")).to_have_count(1)
    assert "kind=error" in page.url

    # The hit's link opens the step in its run's logbook.
    page.locator(".hit.kind-error a.hit-link").click()
    page.wait_for_url(re.compile(rf"/runs/{run.pk}/steps/3/"))
    expect(page.locator("#step-3")).to_contain_text("booking API refused the flamingo request")
    page.watch.assert_clean()


def test_empty_and_no_match_states(browser_page, store):
    page = browser_page
    page.set_default_timeout(30_000)
    login(page, "vera", TEST_PASSWORD, next_path="/search/")
    expect(page.locator("#search-results .empty")).to_contain_text("Search the messages")
    page.fill("#search-results input[name=q]", "okapi")
    page.click(".search-filters button[type=submit]")
    expect(page.locator("#search-results .empty")).to_contain_text("Nothing matches")
    assert page.url.endswith("/search/?q=okapi")
    page.watch.assert_clean()
