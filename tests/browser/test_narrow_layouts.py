"""Every main screen fits a 420 px wide window: nothing sticks out sideways (the page never
scrolls horizontally; wide content such as code scrolls inside its own box)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.urls import reverse

from memory_app.models import AuditEvent, Context, Message, Run
from tests.browser.conftest import SCREENSHOTS, login
from tests.builders import TEST_PASSWORD, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

WIDTHS = (420, 375)  # the narrow window, and a common phone


def main_screens() -> dict[str, str]:
    trip = Context.objects.get(keys__chat="trip-planning")
    tools = Context.objects.get(keys__chat="kyoto")
    run = Run.objects.filter(context=trip, status="success").order_by("pk").last()
    edit = AuditEvent.objects.filter(action="edit").first()
    message = Message.objects.filter(context=trip).order_by("seq").first()
    return {
        "contexts": reverse("contexts"),
        "context": reverse("context", args=[trip.pk]),
        "context-tools": reverse("context", args=[tools.pk]),
        "run": reverse("run", args=[run.pk]),
        "curate": reverse("curate-history", args=[trip.pk]),
        "curate-edit": reverse("curate-message-edit", args=[trip.pk, message.pk]),
        "bulk-prune": reverse("curate-bulk", args=[trip.pk]) + "?role=user&text=Paris",
        "playground": reverse("playground", args=[trip.pk]) + "?compare=1&b_selector=token_window",
        "memories": reverse("memories"),
        "audit": reverse("audit"),
        "audit-event": reverse("audit-entry", args=[edit.pk]),
        "keys": reverse("keys"),
        "purge": reverse("purge") + "?older_than=2099-01-01T00:00",
        "not-found": "/contexts/987654/",
    }


@pytest.mark.parametrize("width", WIDTHS)
def test_every_main_screen_fits_a_narrow_window(browser, live_server, width):
    call_command("seed_demo")
    make_user(role="admin", username="boss")
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.base_url = live_server.url
    login(page, "boss", TEST_PASSWORD)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    overflowing = {}
    for name, url in main_screens().items():
        page.goto(live_server.url + url)
        page.wait_for_load_state("networkidle")
        page_width = page.evaluate("document.documentElement.scrollWidth")
        if page_width > width:
            # Name the widest offenders to make the failure easy to fix.
            culprits = page.evaluate(
                """w => [...document.querySelectorAll('body *')]
                    .filter(e => e.getBoundingClientRect().right > w + 0.5)
                    .slice(0, 5).map(e => e.tagName + '.' + e.className + ' ' """
                """+ Math.round(e.getBoundingClientRect().right))""",
                width,
            )
            overflowing[name] = (page_width, culprits)
        page.screenshot(path=str(SCREENSHOTS / f"w{width}-{name}.png"), full_page=True)
    context.close()
    assert not overflowing, overflowing
