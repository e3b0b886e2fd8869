"""Reading a conversation: it opens at its latest message, long tool output is
folded, a message links to its run and step, copy buttons, the `?` help, loading indicators."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, steps_append
from tests.browser.conftest import WIDTHS, login, screenshot
from tests.builders import (
    TEST_PASSWORD,
    action_step,
    add_messages,
    make_context,
    make_run,
    make_user,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LONG_OUTPUT = "\n".join(f"line {i}: temperature reading {i * 0.1:.1f}C" for i in range(1, 401))


@pytest.fixture
def conversation():
    make_user(role="viewer", username="watcher")
    ctx = make_context(
        keys={"user": "ada", "chat": "long"}, title="A long conversation", messages=118
    )
    run = make_run(context=ctx, steps=3, observations=LONG_OUTPUT)
    step = run.steps.get(position=2)
    messages_append(
        context=ctx,
        items=[
            {
                "role": "tool",
                "name": "get_weather",
                "text": LONG_OUTPUT,
                "run_id": run.pk,
                "step_id": step.pk,
            },
            {
                "role": "assistant",
                "text": "It is sunny in Paris.",
                "run_id": run.pk,
                "step_id": step.pk,
            },
        ],
    )
    return {"context": ctx, "run": run, "step": step}


def in_viewport(page, selector: str) -> bool:
    return page.evaluate(
        """sel => { const r = document.querySelector(sel).getBoundingClientRect();
                    return r.bottom > 0 && r.top < window.innerHeight; }""",
        selector,
    )


def test_a_conversation_opens_at_its_latest_message_or_the_linked_one(browser_page, conversation):
    page = browser_page
    ctx = conversation["context"]
    login(page, "watcher", TEST_PASSWORD, next_path=f"/contexts/{ctx.pk}/")
    page.wait_for_selector("#m-120")
    assert in_viewport(page, "#m-120")
    assert not in_viewport(page, "#m-71")
    screenshot(page, "context-latest", widths=("desktop",), full_page=False)
    # A phone opens it at its latest message too (the page is much longer there).
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{page.base_url}/contexts/{ctx.pk}/")  # a new visit (a reload keeps its scroll)
    page.wait_for_selector("#m-120")
    assert in_viewport(page, "#m-120") and not in_viewport(page, "#m-110")
    screenshot(page, "context-latest", widths=("narrow",), full_page=False)
    page.set_viewport_size({"width": 1280, "height": 860})
    # A link to a message opens at that message.
    page.goto(f"{page.base_url}/contexts/{ctx.pk}/?seq=40")
    page.wait_for_selector("#m-40.is-target")
    assert in_viewport(page, "#m-40") and not in_viewport(page, "#m-15")
    page.goto(f"{page.base_url}/contexts/{ctx.pk}/#m-100")
    page.wait_for_selector("#m-100")
    assert in_viewport(page, "#m-100") and not in_viewport(page, "#m-120")
    page.watch.assert_clean()


def test_long_tool_output_is_folded_and_opens_on_demand(browser_page, conversation):
    page = browser_page
    ctx, run = conversation["context"], conversation["run"]
    login(page, "watcher", TEST_PASSWORD, next_path=f"/contexts/{ctx.pk}/")
    tool = page.locator("#m-119")
    fold = tool.locator("details.fold")
    expect(fold).to_have_count(1)
    assert fold.get_attribute("open") is None
    expect(tool.locator(".fold-show")).to_have_text("Show all 400 lines")
    expect(tool.locator(".fold-show")).to_be_visible()
    expect(tool.locator(".fold-hide")).to_be_hidden()
    assert tool.bounding_box()["height"] < 400
    for width in ("desktop", "narrow"):
        page.set_viewport_size(dict(zip(("width", "height"), WIDTHS[width], strict=True)))
        tool.evaluate("el => el.scrollIntoView({block: 'start'})")
        screenshot(page, "context-fold", widths=(width,), full_page=False)
    page.set_viewport_size(dict(zip(("width", "height"), WIDTHS["desktop"], strict=True)))
    expect(tool.locator(".fold-full")).to_be_hidden()
    tool.locator(".fold-toggle").click()
    expect(tool.locator(".fold-full")).to_be_visible()
    expect(tool.locator(".fold-full")).to_contain_text("line 400: temperature reading 40.0C")
    assert tool.bounding_box()["height"] > 2000
    screenshot(page, "context-fold-open", widths=("desktop",), full_page=False)

    # The message names its run and its step; the step link opens that step.
    answer = page.locator("#m-120")
    expect(answer.locator("a.runref").first).to_have_attribute("href", f"/runs/{run.pk}/")
    expect(answer.locator("a.stepref")).to_have_text("step 2")
    answer.locator("a.stepref").click()
    page.wait_for_selector("#logbook[data-position='2']")
    assert page.url.endswith(f"/runs/{run.pk}/steps/2/")
    # The observations of that step (400 lines) are folded there too.
    observations = page.locator(".step-detail section.block", has_text="Observations")
    expect(observations.locator("details.fold")).to_have_count(1)
    assert observations.locator("details.fold").get_attribute("open") is None
    page.watch.assert_clean()


def test_copy_buttons_copy_message_text_ids_and_tool_arguments(browser_page, conversation):
    page = browser_page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    ctx, run, step = conversation["context"], conversation["run"], conversation["step"]
    login(page, "watcher", TEST_PASSWORD, next_path=f"/contexts/{ctx.pk}/")

    def clipboard() -> str:
        return page.evaluate("navigator.clipboard.readText()")

    message = page.locator("#m-120")
    message.get_by_role("button", name="Copy text").click()
    expect(message.get_by_role("button", name="Copied")).to_be_visible()
    assert clipboard() == "It is sunny in Paris."
    stored_id = ctx.messages.get(seq=120).pk
    message.get_by_role("button", name="Copy id").click()
    assert clipboard() == str(stored_id)
    # A folded message copies whole, not its preview.
    page.locator("#m-119").get_by_role("button", name="Copy text").click()
    assert clipboard() == LONG_OUTPUT

    page.goto(f"{page.base_url}/runs/{run.pk}/steps/2/")
    page.get_by_role("button", name="Copy arguments").click()
    assert '"city": "Paris"' in clipboard() and '"step": 1' in clipboard()
    page.get_by_role("button", name="Copy call id").click()
    assert clipboard() == "call_1"
    page.get_by_role("button", name="Copy step id").click()
    assert clipboard() == str(step.pk)
    page.watch.assert_clean()


def test_question_mark_opens_the_shortcut_help_and_escape_closes_it(browser_page, conversation):
    page = browser_page
    ctx = conversation["context"]
    login(page, "watcher", TEST_PASSWORD, next_path=f"/contexts/{ctx.pk}/")
    help_dialog = page.locator("dialog#shortcuts")
    expect(help_dialog).to_be_hidden()
    # Typing a ? into a field types it; it does not open the help.
    text_field = page.locator("#main input[name=q]")
    text_field.fill("")
    text_field.press("?")
    expect(help_dialog).to_be_hidden()
    assert text_field.input_value() == "?"
    page.locator("body").click(position={"x": 5, "y": 300})
    page.keyboard.press("?")
    expect(help_dialog).to_be_visible()
    expect(help_dialog).to_contain_text("Run logbook: next error")
    screenshot(page, "shortcut-help", full_page=False)
    page.keyboard.press("Escape")
    expect(help_dialog).to_be_hidden()
    page.get_by_role("button", name="Keyboard shortcuts").click()
    expect(help_dialog).to_be_visible()
    help_dialog.get_by_role("button", name="Close").click()
    expect(help_dialog).to_be_hidden()
    page.watch.assert_clean()


def test_htmx_requests_show_a_loading_indicator(browser_page, conversation):
    page = browser_page
    run = conversation["run"]
    login(page, "watcher", TEST_PASSWORD, next_path=f"/runs/{run.pk}/steps/1/")
    page.wait_for_selector("#logbook[data-position='1']")
    page.evaluate(
        """() => { window.indicatorSeen = [];
                   document.body.addEventListener('htmx:beforeSend', () => window.indicatorSeen.push(
                       document.getElementById('loading').classList.contains('htmx-request')));
                   document.body.addEventListener('htmx:afterSettle', () => window.indicatorSeen.push(
                       document.getElementById('loading').classList.contains('htmx-request'))); }"""  # noqa: E501 - the script's text, as written
    )
    page.keyboard.press("j")
    page.wait_for_selector("#logbook[data-position='2']")
    expect(page.locator("#loading")).not_to_have_class("loading-bar htmx-indicator htmx-request")
    # On while the request ran, off once its answer was in place.
    assert page.evaluate("window.indicatorSeen") == [True, False]
    page.watch.assert_clean()


def test_a_live_runs_poll_does_not_flash_the_loading_bar(browser_page):
    make_user(role="viewer", username="watcher")
    run, _ = run_create(context=make_context(), task="t")
    steps_append(run=run, items=[{"kind": "task", "task": "t"}, action_step(1)])
    add_messages(context=run.context, count=1)
    page = browser_page
    login(page, "watcher", TEST_PASSWORD, next_path=f"/runs/{run.pk}/steps/1/")
    page.evaluate(
        """() => { window.barOn = false;
                   document.body.addEventListener('htmx:beforeSend', () => { window.barOn = window.barOn
                       || document.getElementById('loading').classList.contains('htmx-request'); }); }"""  # noqa: E501 - the script's text, as written
    )
    with page.expect_request(lambda r: "/live/" in r.url, timeout=6_000):
        pass
    page.wait_for_timeout(300)
    assert page.evaluate("window.barOn") is False
    page.watch.assert_clean()
