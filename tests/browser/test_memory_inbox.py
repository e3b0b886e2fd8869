"""The memory review inbox in headless Chromium, driven by its keys: move with j and k, merge a
proposal into its near-duplicate with m, approve with a, reject with r, select with x and
approve in bulk, open the editor with e to edit then approve; agent-written content stays
text."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from memory_app import auth
from memory_app.audit import Actor
from memory_app.memories import Scope
from memory_app.models import AuditEvent, MemoryRecord
from memory_app.services.memories import memories_record
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, make_context, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def inbox():
    make_user(role="curator", username="cura")
    ctx = make_context(keys={"user": "ada", "chat": "7"})
    key = auth.apikey_create(name="agent", scopes=["read", "write"]).key
    key.memory_review = "proposed"
    key.save(update_fields=["memory_review"])
    scope = Scope(context=ctx)
    [live] = memories_record(
        scope=scope, items=[{"content": "Ada lives in Paris, France"}], actor=Actor.system("seed")
    )
    agent = Actor.for_key(key)
    ids = [
        memories_record(scope=scope, items=[{"content": text}], actor=agent)[0].record.pk
        for text in (
            "<img src=x onerror=alert(1)> Ada likes jazz",
            "Ada lives in Paris",
            "Ada hates tea",
            "Ada plays chess",
            "Ada reads poetry",
            "Ada paints",
        )
    ]
    return live.record.pk, ids


def _status(pk: int) -> str:
    return MemoryRecord.objects.get(pk=pk).status


def test_approve_merge_and_reject_with_keys(browser_page, inbox):
    page = browser_page
    live, [jazz, paris, tea, chess, poetry, paints] = inbox
    login(page, "cura", TEST_PASSWORD, next_path="/memories/inbox/")
    cards = page.locator("#inbox article.proposal")
    expect(cards).to_have_count(6)
    expect(page.locator(f"#prop-{jazz} .msg-body")).to_have_text(
        "<img src=x onerror=alert(1)> Ada likes jazz"
    )
    expect(page.locator(f"#prop-{paris} .duplicates")).to_contain_text(f"memory {live}")
    screenshot(page, "memory-inbox")
    # The oldest proposal has the focus; j moves to the next, m merges it into its duplicate.
    expect(page.locator(f"#prop-{jazz}")).to_be_focused()
    page.keyboard.press("j")
    expect(page.locator(f"#prop-{paris}")).to_be_focused()
    page.keyboard.press("k")
    expect(page.locator(f"#prop-{jazz}")).to_be_focused()
    page.keyboard.press("j")
    expect(page.locator(f"#prop-{paris}")).to_be_focused()
    with page.expect_navigation():
        page.keyboard.press("m")
    expect(page.locator(".notice")).to_have_text("Merged 1 memory.")
    assert _status(paris) == "merged"
    assert MemoryRecord.objects.get(pk=paris).metadata["merged_into"] == live
    expect(page.locator(f"#prop-{jazz}")).to_be_focused()
    with page.expect_navigation():
        page.keyboard.press("a")
    expect(page.locator(".notice")).to_have_text("Approved 1 memory.")
    assert _status(jazz) == "live"
    expect(page.locator(f"#prop-{tea}")).to_be_focused()
    with page.expect_navigation():
        page.keyboard.press("r")
    expect(page.locator(".notice")).to_have_text("Rejected 1 memory.")
    assert _status(tea) == "rejected"
    # x selects the focused proposal, j the next; the bulk button approves both.
    page.keyboard.press("x")
    page.keyboard.press("j")
    page.keyboard.press("x")
    with page.expect_navigation():
        page.click("#inbox-bulk button[value=approve]")
    expect(page.locator(".notice")).to_have_text("Approved 2 memories.")
    assert (_status(chess), _status(poetry)) == ("live", "live")
    # e opens the focused proposal's editor; saving edits it, then approves it.
    expect(page.locator(f"#prop-{paints}")).to_be_focused()
    page.keyboard.press("e")
    editor = page.locator(f"#prop-{paints} textarea[name=content]")
    expect(editor).to_be_focused()
    editor.fill("Ada paints in watercolour")
    with page.expect_navigation():
        page.locator(f"#prop-{paints}").get_by_role("button", name="Save and approve").click()
    expect(page.locator(".notice")).to_have_text("Edited and approved 1 memory.")
    paints_now = MemoryRecord.objects.get(pk=paints)
    assert (paints_now.status, paints_now.content) == ("live", "Ada paints in watercolour")
    expect(page.locator("#inbox")).to_contain_text("Nothing waits for review.")
    actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
    assert actions[-6:] == [
        "memory_merge",
        "memory_approve",
        "memory_reject",
        "memory_approve",
        "edit",
        "memory_approve",
    ]
    page.watch.assert_clean()
