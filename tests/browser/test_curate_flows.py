"""Dashboard II in headless Chromium: prune/undo/restore, edit + audit, bulk prune, playground,
promote + search, API keys used against the live server."""

from __future__ import annotations

import json

import httpx
import pytest
from playwright.sync_api import expect

from memory_app import selectors
from memory_app.audit import Actor
from memory_app.models import ApiKey, AuditEvent, MemoryRecord, Message
from memory_app.services.messages import message_edit
from memory_app.views.playground import api_body, spec_from_params
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, make_context, make_run, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def demo():
    make_user(role="curator", username="cura")
    make_user(role="admin", username="boss")
    ctx = make_context(
        keys={"user": "ada", "chat": "7"}, title="Ada plans a trip", messages=30, tags=["trip"]
    )
    for m in Message.objects.filter(context=ctx, seq__in=[3, 9, 15]):
        message_edit(
            message=m,
            actor=Actor.system("seed"),
            text=f"weather question {m.seq}: will it rain in Lisbon?",
        )
    run = make_run(context=ctx, steps=5)
    return {"context": ctx, "run": run}


def live_ids(ctx) -> set[int]:
    return set(
        Message.objects.filter(context=ctx, pruned_at__isnull=True).values_list("pk", flat=True)
    )


def test_prune_undo_restore_and_edit_with_the_old_text_in_the_audit(browser_page, demo):
    page, ctx = browser_page, demo["context"]
    login(page, "cura", TEST_PASSWORD, next_path=f"/contexts/{ctx.pk}/curate/")
    before = live_ids(ctx)
    rows = page.locator("#curate-list article.curate-row")
    expect(rows).to_have_count(30)
    first_ids = [int(rows.nth(i).get_attribute("id")[3:]) for i in range(2)]
    for pk in first_ids:
        page.check(f"#cm-{pk} input[name=ids]")
    screenshot(page, "curate-history-selected")
    page.click("#curate-form button[name=pruned][value='1']")
    expect(page.locator("#curate-notice")).to_contain_text("prune of 2 messages")
    expect(rows).to_have_count(28)
    assert live_ids(ctx) == before - set(first_ids)
    screenshot(page, "curate-history-pruned-notice")

    # Undo from the notice: the list refreshes itself.
    page.click("#curate-notice button:has-text('Undo')")
    expect(page.locator("#curate-notice .badge.ok")).to_contain_text("undone")
    expect(rows).to_have_count(30)
    assert live_ids(ctx) == before

    # Prune one again and restore it from the pruned view.
    page.click(f"#cm-{first_ids[0]} button:has-text('Prune')")
    expect(rows).to_have_count(29)
    page.click("nav.tabs >> text=Pruned")
    expect(page.locator(f"#cm-{first_ids[0]}")).to_have_class("msg curate-row role-user pruned")
    screenshot(page, "curate-pruned-view")
    page.check(f"#cm-{first_ids[0]} input[name=ids]")
    page.click("#curate-form button:has-text('Restore selected')")
    expect(page.locator("#curate-list .empty")).to_be_visible()
    assert live_ids(ctx) == before

    # Inline edit, then find the old text in the audit log.
    page.click("nav.tabs >> text=Live")
    target = Message.objects.get(context=ctx, seq=30)
    old = target.text
    page.click(f"#cm-{target.pk} a:has-text('Edit')")
    page.fill(
        f"#cm-{target.pk} textarea[name=text]", "a corrected answer <script>alert(1)</script>"
    )
    screenshot(page, "curate-inline-edit")
    page.click(f"#cm-{target.pk} button:has-text('Save')")
    expect(page.locator(f"#cm-{target.pk} .msg-body")).to_have_text(
        "a corrected answer <script>alert(1)</script>"
    )
    page.goto(f"{page.base_url}/audit/?target=message&target_id={target.pk}")
    entry = page.locator("#audit-list article.audit-entry").first
    expect(entry.locator(".change-diff dd del")).to_have_text(json.dumps(old))
    screenshot(page, "audit-log")
    entry.locator("button:has-text('Revert')").click()
    expect(entry.locator(".badge.ok")).to_contain_text("undone")
    target.refresh_from_db()
    assert target.text == old
    page.watch.assert_clean()


def test_bulk_prune_preview_count_equals_what_is_pruned_and_undo_restores_all(browser_page, demo):
    page, ctx = browser_page, demo["context"]
    login(page, "cura", TEST_PASSWORD, next_path=f"/contexts/{ctx.pk}/bulk-prune/")
    page.select_option("select[name=role]", "user")
    page.fill("input[name=text]", "Lisbon")
    page.click("#bulk-filter button[type=submit]")
    count = int(page.locator("[data-testid=preview-count]").inner_text())
    assert count == 3 and page.locator("ol.sample li").count() == 3
    assert live_ids(ctx) == set(
        Message.objects.filter(context=ctx).values_list("pk", flat=True)
    )  # nothing yet
    screenshot(page, "bulk-preview")
    page.click("#bulk-preview button.danger")
    expect(page.locator("[data-testid=pruned-count]")).to_have_text(str(count))
    pruned = Message.objects.filter(context=ctx, pruned_at__isnull=False)
    assert pruned.count() == count
    event = AuditEvent.objects.get(action="bulk_prune")
    assert sorted(event.target_ids) == sorted(pruned.values_list("pk", flat=True))
    screenshot(page, "bulk-done")
    page.click("#bulk-preview button:has-text('Undo')")
    expect(page.locator("#bulk-preview .badge.ok")).to_contain_text("undone")
    assert not Message.objects.filter(context=ctx, pruned_at__isnull=False).exists()
    page.watch.assert_clean()


def _issue_key_in_the_browser(page, name: str, context_keys: str = "") -> str:
    page.goto(f"{page.base_url}/keys/")
    page.fill("input[name=name]", name)
    if context_keys:
        page.fill("input[name=context_keys]", context_keys)
    page.click("#keys-panel form button:has-text('Create key')")
    secret = page.locator("[data-testid=new-key]").inner_text().strip()
    assert secret.startswith("am_")
    return secret


def test_playground_follows_parameters_agrees_with_the_api_and_marks_differences(
    browser_page, demo
):
    page, ctx = browser_page, demo["context"]
    login(page, "boss", TEST_PASSWORD)
    secret = _issue_key_in_the_browser(page, "playground-check")
    page.goto(f"{page.base_url}/contexts/{ctx.pk}/playground/")
    side_a = page.locator("#side-a")
    expect(side_a.locator("[data-testid=count]")).to_have_text("10")
    page.fill(".side-a input[name=k]", "4")  # debounced: results follow the typing
    expect(side_a.locator("[data-testid=count]")).to_have_text("4")
    page.select_option(".side-a select[name=selector]", "token_window")
    page.fill(".side-a input[name=max_tokens]", "20")
    page.wait_for_url(lambda url: "max_tokens=20" in url)
    expect(side_a.locator(".totals")).to_contain_text("of a 20-token budget")
    shown = [
        int(x)
        for x in side_a.locator("li.sel-item").evaluate_all(
            "els => els.map(e => e.dataset.messageId)"
        )
    ]
    params = {
        "selector": "token_window",
        "max_tokens": "20",
        "policy": "contiguous",
        "semantics": "plain",
    }
    expected = selectors.select(context=ctx, spec=spec_from_params(params))
    assert shown == expected.ids and shown
    screenshot(page, "playground")

    # Compare: the token window against window k=2; the items only one side chose are marked.
    page.check("#compare")
    page.select_option(".side-b_ select[name=b_selector]", "window")
    page.fill(".side-b_ input[name=b_k]", "2")
    expect(page.locator("#side-b [data-testid=count]")).to_have_text("2")
    a_ids = set(shown)
    b_ids = {
        int(x)
        for x in page.locator("#side-b li.sel-item").evaluate_all(
            "els => els.map(e => e.dataset.messageId)"
        )
    }
    marked_b = {
        int(x)
        for x in page.locator("#side-b li.diff-only").evaluate_all(
            "els => els.map(e => e.dataset.messageId)"
        )
    }
    marked_a = {
        int(x)
        for x in page.locator("#side-a li.diff-only").evaluate_all(
            "els => els.map(e => e.dataset.messageId)"
        )
    }
    assert marked_b == b_ids - a_ids and marked_a == a_ids - b_ids and (marked_a or marked_b)
    page.click("#side-a details.snippets summary")
    expect(page.locator("#curl-a")).to_contain_text(f"/contexts/{ctx.pk}/select")
    screenshot(page, "playground-compare")
    page.watch.assert_clean()

    # The same settings through the real API (HTTP against the live server).
    body = api_body(spec_from_params(params))
    response = httpx.post(
        f"{page.base_url}/api/v1/contexts/{ctx.pk}/select",
        json=body,
        headers={"Authorization": f"Bearer {secret}"},
    )
    if response.status_code == 404 and "json" not in response.headers.get("content-type", ""):
        pytest.skip("POST /api/v1/contexts/{id}/select has not landed yet")
    assert response.status_code == 200, response.text
    data = response.json()
    items = data.get("items") or data.get("messages")
    api_ids = [i.get("id") or i.get("message", {}).get("id") for i in items]
    assert api_ids == shown


def test_promote_a_message_then_find_it_by_search(browser_page, demo):
    page, ctx = browser_page, demo["context"]
    login(page, "cura", TEST_PASSWORD, next_path=f"/contexts/{ctx.pk}/curate/")
    m = Message.objects.get(context=ctx, seq=9)
    page.click(f"#cm-{m.pk} button:has-text('Promote')")
    expect(page.locator(f"#promote-{m.pk}")).to_contain_text("Recorded as")
    record = MemoryRecord.objects.get(source_message=m)
    page.click(f"#promote-{m.pk} a")
    page.goto(f"{page.base_url}/memories/")
    page.locator("#main input[name=q]").fill("Lisbon rain")
    expect(page.locator(f"#mem-{record.pk}")).to_be_visible()
    expect(page.locator(f"#mem-{record.pk} .source a")).to_have_text("message #9")
    screenshot(page, "memories-search")
    page.watch.assert_clean()


def test_create_a_key_use_it_revoke_it_and_the_api_refuses_it(browser_page, demo):
    page, ctx = browser_page, demo["context"]
    login(page, "boss", TEST_PASSWORD)
    secret = _issue_key_in_the_browser(page, "trip-bot", '{"user": "ada"}')
    screenshot(page, "keys-created")
    key = ApiKey.objects.get(name="trip-bot")
    assert key.context_keys == {"user": "ada"}
    url = f"{page.base_url}/api/v1/contexts/{ctx.pk}"
    ok = httpx.get(url, headers={"Authorization": f"Bearer {secret}"})
    assert ok.status_code == 200, ok.text
    page.reload()  # the secret is gone from the page once it has been shown
    assert secret not in page.content()
    expect(page.locator(f"#key-{key.pk}")).not_to_contain_text("never")  # last used is shown
    revoke = page.locator(f"#key-{key.pk} button:has-text('Revoke for good')")
    expect(revoke).to_be_hidden()  # asked for first
    page.click(f"#key-{key.pk} summary:has-text('Revoke')")
    screenshot(page, "keys-revoke-confirm")
    # On a phone the confirmation is on screen, not off to the side inside a scrolling table.
    page.set_viewport_size({"width": 390, "height": 844})
    box = revoke.bounding_box()
    assert box and 0 <= box["x"] and box["x"] + box["width"] <= 390, box
    page.set_viewport_size({"width": 1280, "height": 860})
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None
    revoke.click()
    expect(page.locator(f"#key-{key.pk} .badge")).to_contain_text("revoked")
    refused = httpx.get(url, headers={"Authorization": f"Bearer {secret}"})
    assert refused.status_code == 401
    screenshot(page, "keys-revoked")
    page.goto(f"{page.base_url}/purge/")
    screenshot(page, "purge")
    page.watch.assert_clean()
