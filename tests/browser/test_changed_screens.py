"""Screens that changed with the reading work, in headless Chromium at desktop and narrow width
(screenshots in test-artifacts/screenshots/): key chips and live counts on the contexts list, a
message that only calls a tool, memories read by a viewer, the styled 403/404/500 pages, the
favicon and the link to the API docs."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from memory_app.audit import Actor
from memory_app.models import AuditEvent, Message
from memory_app.services.curation import messages_set_pruned
from memory_app.services.memories import memory_promote
from memory_app.services.messages import message_edit, messages_append
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, make_context, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def styled(page) -> bool:
    """The site's stylesheet is loaded (a styled page, not the browser's bare default)."""
    return page.evaluate(
        """() => [...document.styleSheets].some(
               s => s.href && s.href.includes('/app.css') && s.cssRules.length > 0)"""
    )


@pytest.fixture
def viewer():
    return make_user(role="viewer", username="vera")


def test_key_chips_filter_by_what_they_show_and_counts_leave_out_pruned(browser_page, viewer):
    page = browser_page
    demo = make_context(keys={"demo": True, "user": "ada"}, title="Demo chat", messages=5)
    make_context(keys={"demo": "True", "user": "bob"}, title="Not a demo", messages=1)
    first_two = (
        Message.objects.filter(context=demo).order_by("seq").values_list("pk", flat=True)[:2]
    )
    messages_set_pruned(context=demo, ids=list(first_two), pruned=True, actor=Actor.system("t"))
    login(page, "vera", TEST_PASSWORD, next_path="/contexts/")
    row = page.locator("table.contexts tbody tr", has_text="Demo chat")
    expect(row.locator("td[data-label=Messages]")).to_have_text("3 +2 pruned")
    chip = row.locator("a.kv", has_text="demo=true")
    expect(chip).to_have_text("demo=true")
    chip.click()
    expect(page.locator(".chips a.chip")).to_contain_text("demo=true")
    expect(page.locator("table.contexts tbody tr")).to_have_count(1)
    expect(page.locator("table.contexts tbody tr")).to_contain_text("Demo chat")
    screenshot(page, "contexts-key-chip")
    page.watch.assert_clean()


def test_a_message_that_only_calls_a_tool_shows_the_call_and_its_result(browser_page, viewer):
    page = browser_page
    context = make_context(keys={"user": "ada", "chat": "tools"}, title="Tools", messages=1)
    messages_append(
        context=context,
        items=[
            {
                "role": "assistant",
                "text": "",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "call_7",
                        "name": "get_weather",
                        "input": {"city": "Kyoto", "unit": "celsius"},
                    },
                ],
            },
            {
                "role": "tool",
                "text": "",
                "content": [
                    {
                        "type": "tool_result",
                        "id": "call_7",
                        "name": "get_weather",
                        "output": "Kyoto: 18C, light rain",
                    },
                ],
            },
        ],
    )
    login(page, "vera", TEST_PASSWORD, next_path=f"/contexts/{context.pk}/")
    call = page.locator("#m-2")
    expect(call.locator(".content-block")).to_contain_text("get_weather")
    expect(call.locator(".content-block")).to_contain_text('"Kyoto"')
    expect(page.locator("#m-3 .content-block")).to_contain_text("Kyoto: 18C, light rain")
    assert call.bounding_box()["height"] > 60  # not an empty card
    screenshot(page, "context-tool-call")
    page.watch.assert_clean()


def test_a_viewer_reads_memories_without_the_controls_to_change_them(browser_page, viewer):
    page = browser_page
    context = make_context(keys={"user": "ada"}, messages=2, text="Ada prefers window seats {i}")
    for message in Message.objects.filter(context=context):
        memory_promote(actor=Actor.system("t"), message=message)
    login(page, "vera", TEST_PASSWORD)
    page.click("nav a:has-text('Memories')")
    expect(page.locator("article.memory")).to_have_count(2)
    expect(page.locator("article.memory").first).to_contain_text("Ada prefers window seats")
    expect(page.get_by_role("button", name="Merge selected")).to_have_count(0)
    expect(page.locator("article.memory input[name=ids]")).to_have_count(0)
    screenshot(page, "memories-viewer")
    page.watch.assert_clean()


def test_403_404_and_500_are_styled_pages_with_the_navigation(browser_page, viewer, settings):
    page = browser_page
    login(page, "vera", TEST_PASSWORD)
    for url, status, title, name in (
        ("/keys/", 403, "Not allowed", "error-403"),
        ("/contexts/987654/", 404, "Not found", "error-404"),
    ):
        response = page.goto(page.base_url + url)
        assert response.status == status
        expect(page.locator("h1")).to_have_text(title)
        expect(page.locator(".topbar")).to_be_visible()
        expect(page.locator("a:has-text('Back to contexts')")).to_be_visible()
        assert styled(page)
        screenshot(page, name)

    settings.ROOT_URLCONF = "tests.browser.failing_urls"
    response = page.goto(page.base_url + "/fail/")
    assert response.status == 500
    expect(page.locator("h1")).to_contain_text("Something went wrong on the server")
    expect(page.locator(".topbar")).to_be_visible()
    assert styled(page)
    screenshot(page, "error-500")
    assert not page.watch.page_errors and not page.watch.outside_requests


def test_the_favicon_loads_and_the_nav_links_to_the_api_docs(browser_page, viewer):
    page = browser_page
    login(page, "vera", TEST_PASSWORD)
    icon = page.locator("link[rel=icon]").get_attribute("href")
    answer = page.request.get(page.base_url + icon)
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml")
    assert b"<svg" in answer.body()
    # Pages that name no icon (the API's JSON) make the browser ask for /favicon.ico.
    fallback = page.request.get(page.base_url + "/favicon.ico")
    assert fallback.status == 200 and fallback.body() == answer.body()
    page.click("nav a:has-text('API docs')")
    page.wait_for_url(lambda url: url.endswith("/api/docs"))
    # Swagger UI renders the whole API's schema (~1.8 MB of script, then ~200 operations) in
    # the browser: on busy cores that alone can outlast the suite's default wait.
    page.wait_for_selector(".opblock-summary", state="visible", timeout=60_000)
    page.watch.assert_clean()


def test_an_edit_event_shows_the_changed_lines_only(browser_page):
    page = browser_page
    make_user(role="curator", username="cura")
    context = make_context(messages=1)
    message = Message.objects.get(context=context)
    lines = [f"line {i}: the forecast for day {i}" for i in range(1, 9)]
    message_edit(message=message, actor=Actor.system("t"), text="\n".join(lines))
    lines[4] = "line 5: rain expected, <b>take an umbrella</b>"
    message_edit(message=message, actor=Actor.system("t"), text="\n".join(lines))
    event = AuditEvent.objects.filter(action="edit").latest("pk")
    login(page, "cura", TEST_PASSWORD, next_path=f"/audit/{event.pk}/")
    diff = page.locator(".change-diff")
    expect(diff.locator(".del")).to_have_text("-line 5: the forecast for day 5")
    expect(diff.locator(".ins")).to_have_text("+line 5: rain expected, <b>take an umbrella</b>")
    expect(diff.locator(".ctx")).to_have_text(
        [" line 4: the forecast for day 4", " line 6: the forecast for day 6"]
    )
    expect(diff).not_to_contain_text("day 2")
    screenshot(page, "audit-event-edit")
    page.watch.assert_clean()
