"""A memory's history in headless Chromium: from its card to the history page, the diff of an
agent's edit (its text shown as text), restore of the first version, and the one-click undo on
the card."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from memory_app import auth
from memory_app.audit import Actor
from memory_app.memories import Scope
from memory_app.models import AuditEvent, MemoryRecord, MemoryVersion
from memory_app.services.memories import memories_record, memory_edit
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, make_context, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FIRST = "Ada prefers <b>tea</b>"
EDITED = "Ada prefers <b>coffee</b> <img src=x onerror=alert(1)>"


@pytest.fixture
def memory():
    make_user(role="curator", username="cura")
    ctx = make_context(keys={"user": "ada", "chat": "7"})
    agent = Actor.for_key(auth.apikey_create(name="scribe", scopes=["read", "write"]).key)
    [recorded] = memories_record(scope=Scope(context=ctx), items=[{"content": FIRST}], actor=agent)
    memory_edit(record=recorded.record, actor=agent, content=EDITED)
    return recorded.record.pk


def test_history_then_restore_then_undo(browser_page, memory):
    page = browser_page
    pk = memory
    login(page, "cura", TEST_PASSWORD, next_path=f"/memories/?id={pk}")
    card = page.locator(f"#mem-{pk}")
    expect(card.locator(".msg-body")).to_have_text(EDITED)
    expect(card.locator(".source")).to_contain_text("API key scribe")
    card.get_by_role("link", name="History").click()
    page.wait_for_url(f"**/memories/{pk}/history/")

    latest = page.locator("#version-2")
    expect(latest.locator(".content-diff del")).to_have_text(["<b>tea</b>"])
    expect(latest.locator(".content-diff ins")).to_have_text(
        ["<b>coffee</b> <img src=x onerror=alert(1)>"]
    )
    expect(latest).to_contain_text("edit")
    screenshot(page, "memory-history")

    with page.expect_navigation():
        page.locator("#version-1").get_by_role("button", name="Restore version 1").click()
    expect(page.locator("#version-3")).to_contain_text("restore_version")
    expect(page.locator("#version-3")).to_contain_text("user:cura")
    expect(page.locator("#version-3 .content-diff ins")).to_have_text(["<b>tea</b>"])
    assert MemoryRecord.objects.get(pk=pk).content == FIRST
    assert AuditEvent.objects.filter(action="memory_restore_version", target_ids=[pk]).count() == 1

    # Back on the card, the restore is undone in one click (htmx swaps the card in place).
    page.goto(f"{page.base_url}/memories/?id={pk}")
    card = page.locator(f"#mem-{pk}")
    card.get_by_role("button", name="Undo restore_version").click()
    expect(card.locator(".msg-body")).to_have_text(EDITED)
    expect(card.locator(".history-line")).to_contain_text("version 4, undo by user:cura")
    assert MemoryRecord.objects.get(pk=pk).content == EDITED
    assert MemoryVersion.objects.filter(memory_id=pk).count() == 4
    page.watch.assert_clean()
