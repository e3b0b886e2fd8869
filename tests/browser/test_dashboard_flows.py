"""Walk the dashboard in headless Chromium: contexts -> history -> run logbook, with keys."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, make_context, make_run, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def demo():
    user = make_user(role="curator", username="ops")
    ada = make_context(
        keys={"user": "ada", "chat": "42"},
        title="Ada asks about the weather",
        messages=120,
        tags=["weather"],
    )
    for i in range(6):
        make_context(keys={"user": f"user{i}", "chat": str(i)}, messages=3)
    run = make_run(context=ada, steps=30, error_at=(12, 25), status="failed")
    make_run(context=ada, steps=4, task="Summarise the conversation")
    return {"user": user, "context": ada, "run": run}


def step_shown(page, position: int) -> None:
    page.wait_for_selector(f"#logbook[data-position='{position}']")
    assert page.url.endswith(f"/steps/{position}/")
    assert page.locator(".step-detail h2").inner_text().startswith(f"Step {position}")


def test_operator_walks_from_a_context_key_to_the_failing_step(browser_page, demo):
    page = browser_page
    run = demo["run"]
    page.goto(f"{page.base_url}/")
    assert "/accounts/login/" in page.url
    screenshot(page, "login")
    login(page, "ops", TEST_PASSWORD)
    page.wait_for_selector("#context-results")
    assert "embeddings:" in page.locator(".runtime").inner_text()
    screenshot(page, "contexts")

    # Find a context by key.
    page.fill("input[name=add]", "user=ada")
    page.click("#context-results button[type=submit]")
    page.wait_for_selector(".chip")
    assert "key=user%3Dada" in page.url
    rows = page.locator("table.contexts tbody tr")
    assert rows.count() == 1
    screenshot(page, "contexts-filtered")

    # Open it: the latest 50 messages, then 50 more on demand.
    page.click("text=Ada asks about the weather")
    page.wait_for_selector("#history")
    assert page.locator("article.msg").count() == 50
    assert page.locator("article.msg").last.locator(".seq").inner_text() == "#120"
    page.click("#history-earlier a")
    expect(page.locator("article.msg")).to_have_count(100)
    assert page.locator("article.msg").first.locator(".seq").inner_text() == "#21"
    screenshot(page, "context", full_page=False)

    # Jump to a seq.
    page.fill("input[name=seq]", "7")
    page.click("#history button[type=submit]")
    page.wait_for_selector("#m-7.is-target")

    # Open the run and step through it with keys.
    page.goto(f"{page.base_url}/contexts/{demo['context'].pk}/")
    page.click(f"a.run-card[href='/runs/{run.pk}/']")
    step_shown(page, 1)
    screenshot(page, "run-step", full_page=False)
    page.keyboard.press("j")
    step_shown(page, 2)
    page.keyboard.press("ArrowRight")
    step_shown(page, 3)
    page.keyboard.press("k")
    step_shown(page, 2)

    # Next error lands on the failing step, highlighted.
    page.click("[data-shortcut='next-error']")
    step_shown(page, 12)
    assert page.locator(".error-block").inner_text().startswith("Error: AgentExecutionError")
    assert page.locator(".step-list li.current.has-error").count() == 1
    page.keyboard.press("e")
    step_shown(page, 25)
    page.keyboard.press("E")
    step_shown(page, 12)

    # What the model saw: folded, loaded when opened.
    assert page.locator("details.lazy").first.get_attribute("open") is None
    page.click("details.lazy >> nth=0 >> summary")
    page.wait_for_selector("#model-input-12 .chat-msg")
    screenshot(page, "run-error-step", full_page=False)
    page.click("details.lazy >> nth=1 >> summary")
    page.wait_for_selector("#transcript-12 .chat-msg")
    assert "Now let's retry" in page.locator("#transcript-12").inner_text()

    # A reload on a step URL shows that step; back goes to the previous one.
    page.reload()
    step_shown(page, 12)
    page.go_back()
    step_shown(page, 25)
    page.go_back()
    step_shown(page, 12)
    page.go_back()
    step_shown(page, 2)
    page.go_forward()
    step_shown(page, 12)

    # Clicking a bar of the timeline opens that step.
    page.locator("svg.tl a").nth(4).locator("rect.tl-hit").click()
    page.wait_for_url(re.compile(r"/steps/5/$"))
    step_shown(page, 5)
    page.watch.assert_clean()


def test_a_viewer_sees_no_prune_button(browser_page, demo):
    make_user(role="viewer", username="watcher")
    page = browser_page
    login(page, "watcher", TEST_PASSWORD, next_path=f"/contexts/{demo['context'].pk}/")
    page.wait_for_selector("#history")
    assert page.locator("article.msg").count() == 50
    assert page.locator("form.inline-action").count() == 0
    page.goto(f"{page.base_url}/runs/{demo['run'].pk}/steps/3/")
    step_shown(page, 3)
    assert page.locator("form.inline-action").count() == 0
    page.watch.assert_clean()


def test_a_curator_prunes_a_message_and_sees_it_greyed(browser_page, demo):
    page = browser_page
    login(page, "ops", TEST_PASSWORD, next_path=f"/contexts/{demo['context'].pk}/")
    page.wait_for_selector("#m-120")
    page.click("#m-120 form.inline-action button")
    page.wait_for_selector("#m-120.pruned")
    assert page.locator("#m-120 form.inline-action button").inner_text() == "Restore"
    # Hidden by default after a reload, back in view (greyed) with "show pruned".
    page.reload()
    assert page.locator("#m-120").count() == 0
    page.check("input[name=pruned]")
    page.click("#history button[type=submit]")
    page.wait_for_selector("#m-120.pruned")
    screenshot(page, "context-pruned", widths=("desktop",), full_page=False)
    page.watch.assert_clean()
