"""A review queue in headless Chromium, worked with the keyboard only: a digit scores the run on
screen and the next one comes, `c` writes a comment sent with the score, `s` skips, and the
progress says how many of the queue's runs this reviewer has scored. Agent-written task text
is shown as text. Screenshots at 1440 and 390 px in test-artifacts/screenshots/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from memory_app.audit import Actor
from memory_app.models import AuditEvent, Score
from memory_app.services.runs import run_create, run_finish
from memory_app.services.scores import review_queue_create
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, make_context, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TASKS = [
    "Summarise the report <script>window.pwned=1</script>",
    "Book a table for two",
    "Plan a trip to Lisbon",
    "Translate the menu",
]


@pytest.fixture
def queue():
    cora = make_user(role="curator", username="cora")
    ctx = make_context(keys={"user": "ada"})
    now = timezone.now()
    runs = []
    for i, task in enumerate(TASKS):
        run, _ = run_create(context=ctx, task=task, started_at=now - timedelta(minutes=i))
        runs.append(run_finish(run=run, status="success"))
    # A failed run the queue's filter leaves out.
    failed, _ = run_create(context=ctx, task="Left out", started_at=now)
    run_finish(run=failed, status="failed")
    saved = review_queue_create(
        actor=Actor.for_user(cora),
        name="Did it answer?",
        filters="status=success",
        score_name="correct",
        score_kind="boolean",
    )
    return saved, runs


def test_a_reviewer_scores_comments_and_skips_with_the_keyboard(browser_page, queue):
    saved, runs = queue
    page = browser_page
    login(page, "cora", TEST_PASSWORD, next_path=f"/queues/{saved.pk}/")
    item = page.locator("#queue-item")
    done = item.locator('[data-queue="done"]')
    expect(done).to_have_text("0")
    expect(item.locator('[data-queue="total"]')).to_have_text("4")
    expect(item.locator(".queue-run h2")).to_contain_text(f"Run {runs[0].pk}")
    # The task's markup is text on the page, never a script that ran.
    expect(item.locator(".queue-run .task")).to_contain_text("<script>window.pwned=1</script>")
    assert page.evaluate("() => window.pwned") is None
    page.watch.assert_clean()

    page.keyboard.press("1")
    expect(done).to_have_text("1")
    expect(item.locator(".queue-run h2")).to_contain_text(f"Run {runs[1].pk}")

    page.keyboard.press("c")
    expect(page.locator("#queue-comment")).to_be_focused()
    page.keyboard.type("Books for 3, not 2 & <b>late</b>")
    page.keyboard.press("Escape")
    page.keyboard.press("0")
    expect(done).to_have_text("2")
    expect(item.locator(".queue-run h2")).to_contain_text(f"Run {runs[2].pk}")

    page.keyboard.press("s")
    expect(item.locator(".queue-run h2")).to_contain_text(f"Run {runs[3].pk}")
    expect(item.locator('[data-queue="position"]')).to_have_text("3")
    # A digit the queue does not give does nothing.
    page.keyboard.press("7")
    page.keyboard.press("1")
    expect(done).to_have_text("3")
    expect(item.locator('[data-queue="empty"]')).to_contain_text("after the ones you skipped")

    page.click("text=Back to the first run waiting")
    expect(item.locator(".queue-run h2")).to_contain_text(f"Run {runs[2].pk}")
    expect(item.locator('[data-queue="position"]')).to_have_text("4")
    page.watch.assert_clean()
    # Last, after the swaps: taken before one, the screenshots left a style attribute that
    # htmx's settle step copied onto the swapped element, which the CSP refuses.
    screenshot(page, "review-queue", widths=("wide", "narrow"))

    scored = {s.run_id: s for s in Score.objects.filter(name="correct")}
    assert {pk: s.value for pk, s in scored.items()} == {
        runs[0].pk: True,
        runs[1].pk: False,
        runs[3].pk: True,
    }
    assert scored[runs[1].pk].comment == "Books for 3, not 2 & <b>late</b>"
    assert {s.author for s in scored.values()} == {"user:cora"}
    assert AuditEvent.objects.filter(action="score_add", actor="user:cora").count() == 3

    # The comment shows, as text, on the run's logbook.
    page.goto(f"{page.base_url}/runs/{runs[1].pk}/")
    review = page.locator("#review-run")
    expect(review).to_contain_text("correct=false")
    expect(review).to_contain_text("Books for 3, not 2 & <b>late</b>")
    page.watch.assert_clean()
