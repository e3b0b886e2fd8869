"""Errors the server finds are shown where the operator looks, in headless Chromium; and every
link to an audit event (audit log, curate "details", after a purge) opens its page."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from memory_app.audit import Actor
from memory_app.models import ApiKey, AuditEvent, Message
from memory_app.services import curation
from memory_app.services.curation import messages_set_pruned
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, make_context, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def people():
    make_user(role="curator", username="cura")
    make_user(role="admin", username="boss")
    make_user(role="viewer", username="vera")


def test_a_bad_api_key_form_shows_the_reason_and_keeps_what_was_typed(browser_page, people):
    page = browser_page
    login(page, "boss", TEST_PASSWORD, next_path="/keys/")
    page.fill("input[name=name]", "bot")
    page.fill("input[name=context_keys]", '{"tenant": ')
    page.click("#keys-panel form button:has-text('Create key')")
    alert = page.locator("#keys-panel [role=alert]")
    expect(alert).to_contain_text("must be a JSON object like")
    expect(page.locator("input[name=context_keys]")).to_have_value('{"tenant": ')
    screenshot(page, "keys-error")
    # Each scope's box sits beside its name (not stretched across the field).
    for label in page.locator("#keys-panel label.check").all():
        box, whole = label.locator("input").bounding_box(), label.bounding_box()
        assert box["width"] < 30 and box["x"] - whole["x"] < 5, (box, whole)
    page.fill("input[name=context_keys]", "")
    for box in page.locator("#keys-panel input[name=scopes]").all():
        box.uncheck()
    page.click("#keys-panel form button:has-text('Create key')")
    expect(alert).to_contain_text("scopes must be a non-empty subset")
    assert not ApiKey.objects.exists()
    page.watch.console_errors.clear()  # Chromium logs each 400 answer as a console error
    page.watch.assert_clean()


def test_a_wrong_purge_confirmation_is_shown_and_nothing_is_purged(browser_page, people):
    page = browser_page
    context = make_context(messages=2)
    ids = list(Message.objects.filter(context=context).values_list("pk", flat=True))
    messages_set_pruned(context=context, ids=ids, pruned=True, actor=Actor.system("t"))
    later = (timezone.now() + timezone.timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M")
    login(page, "boss", TEST_PASSWORD, next_path=f"/purge/?older_than={later}")
    page.fill("#purge-panel input[name=confirmation]", "yes")
    page.click("#purge-panel button:has-text('Purge for good')")
    expect(page.locator("#purge-panel [role=alert]")).to_contain_text(curation.PURGE_CONFIRMATION)
    screenshot(page, "purge-error")
    assert Message.objects.filter(pk__in=ids).count() == 2

    # The right phrase purges, and the link to the purge's audit event opens it.
    page.fill("#purge-panel input[name=confirmation]", curation.PURGE_CONFIRMATION)
    page.click("#purge-panel button:has-text('Purge for good')")
    link = page.locator("#purge-panel a:has-text('event')")
    expect(link).to_be_visible()
    event = AuditEvent.objects.get(action="purge")
    link.click()
    expect(page.locator("h1")).to_contain_text(f"Event {event.pk}: purge of 2 messages")
    assert not Message.objects.filter(pk__in=ids).exists()


def test_prune_selected_with_nothing_ticked_says_so_in_the_page(browser_page, people):
    page = browser_page
    context = make_context(messages=3)
    login(page, "cura", TEST_PASSWORD, next_path=f"/contexts/{context.pk}/curate/")
    page.click("#curate-form button:has-text('Prune selected')")
    flash = page.locator("#flash [role=alert]")
    expect(flash).to_contain_text("select at least one message")
    expect(page.locator("#curate-list article.curate-row")).to_have_count(3)  # page unchanged
    screenshot(page, "prune-nothing-selected")
    # On a phone the message wraps under its title instead of shrinking to a letter a line.
    page.set_viewport_size({"width": 390, "height": 844})
    assert flash.locator("[data-testid=error-message]").bounding_box()["width"] > 200
    page.set_viewport_size({"width": 1280, "height": 860})
    page.click("#flash [data-dismiss=flash]")
    expect(flash).to_have_count(0)
    assert not AuditEvent.objects.exists()


def test_an_edit_to_empty_text_is_refused_in_the_row(browser_page, people):
    page = browser_page
    context = make_context(messages=2)
    message = Message.objects.get(context=context, seq=2)
    login(page, "cura", TEST_PASSWORD, next_path=f"/contexts/{context.pk}/curate/")
    row = page.locator(f"#cm-{message.pk}")
    row.locator("a:has-text('Edit')").click()
    row.locator("textarea[name=text]").fill("   ")
    row.locator("button:has-text('Save')").click()
    expect(row.locator("[role=alert]")).to_contain_text("the text cannot be empty")
    screenshot(page, "edit-empty-refused")
    message.refresh_from_db()
    assert message.text == "message 2"
    row.locator("a:has-text('Cancel')").click()
    expect(row.locator(".msg-body")).to_have_text("message 2")


def test_invalid_playground_numbers_are_explained_beside_the_form(browser_page, people):
    page = browser_page
    context = make_context(messages=3)
    login(page, "vera", TEST_PASSWORD, next_path=f"/contexts/{context.pk}/playground/")
    page.fill(".side-a input[name=k]", "0")
    expect(page.locator("#side-a [role=alert]")).to_contain_text(
        "k must be an integer between 1 and 1000"
    )
    screenshot(page, "playground-error")
    page.fill(".side-a input[name=k]", "2")
    expect(page.locator("#side-a [data-testid=count]")).to_have_text("2")


def test_a_forbidden_htmx_action_is_explained_in_the_page(browser_page, people):
    page = browser_page
    context = make_context(messages=1)
    login(page, "vera", TEST_PASSWORD, next_path=f"/contexts/{context.pk}/")
    # A viewer asks for a curator's fragment (e.g. a stale tab after a role change).
    page.evaluate(
        "url => htmx.ajax('GET', url, {target: '#main', swap: 'innerHTML'})",
        f"/contexts/{context.pk}/curate/",
    )
    expect(page.locator("#flash [role=alert]")).to_contain_text("Your role does not allow this")
    screenshot(page, "flash-403")
    expect(page.locator("#main")).not_to_contain_text("Not allowed")  # not swapped into the page


def test_every_link_to_an_audit_event_opens_it(browser_page, people):
    page = browser_page
    context = make_context(messages=4)
    login(page, "cura", TEST_PASSWORD, next_path=f"/contexts/{context.pk}/curate/")
    first = Message.objects.get(context=context, seq=1)
    page.check(f"#cm-{first.pk} input[name=ids]")
    page.click("#curate-form button:has-text('Prune selected')")
    expect(page.locator("#curate-notice")).to_contain_text("prune of 1 message")
    event = AuditEvent.objects.get(action="prune")

    page.goto(page.url)  # "Recent changes" with its "details" link
    page.click("details.recent summary")
    page.click(f"details.recent a[href='/audit/{event.pk}/']")
    expect(page.locator("h1")).to_have_text(f"Event {event.pk}: prune of 1 message")
    screenshot(page, "audit-event")

    page.goto(f"{page.base_url}/audit/")
    page.click(f"#audit-{event.pk} a:has-text('event {event.pk}')")
    expect(page.locator("h1")).to_contain_text(f"Event {event.pk}:")
    page.click("button:has-text('Restore')")
    expect(page.locator(f"#undo-{event.pk}")).to_contain_text("undone")
    undo = AuditEvent.objects.get(pk=event.pk).undone_by_id
    page.click(f"#undo-{event.pk} a:has-text('event {undo}')")
    expect(page.locator("h1")).to_contain_text(f"Event {undo}: restore of 1 message")
    page.watch.assert_clean()
