"""Smaller dashboard behaviours in headless Chromium: the context header's counts follow prune,
restore and undo; "Recent changes" names the messages; a jump to a pruned message says so;
fast j/k presses all count; a long unbroken title wraps on a phone."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from memory_app.models import Message
from memory_app.services.runs import run_create, steps_append
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, action_step, make_context, make_run, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def curator():
    return make_user(role="curator", username="cura")


def counts(page) -> tuple[str, str]:
    header = page.locator("#context-counts")
    return (
        header.locator("[data-testid=live-count]").inner_text(),
        header.locator("[data-testid=live-tokens]").inner_text(),
    )


def test_a_jump_to_a_pruned_message_says_it_is_pruned(browser_page, curator):
    page = browser_page
    ctx = make_context(messages=12)
    Message.objects.filter(context=ctx, seq=7).update(pruned_at=timezone.now(), pruned_by="cura")
    login(page, "cura", TEST_PASSWORD, next_path=f"/contexts/{ctx.pk}/")
    page.fill("input[name=seq]", "7")
    page.click("#history form button[type=submit]")
    note = page.locator("[data-testid=jump-note]")
    expect(note).to_contain_text("Message #7 is pruned")
    note.locator("a").click()
    expect(page.locator("#m-7.is-target .badge")).to_have_text("pruned")
    expect(page.locator("[data-testid=jump-note]")).to_have_count(0)
    page.fill("input[name=seq]", "99")
    page.click("#history form button[type=submit]")
    expect(page.locator("[data-testid=jump-note]")).to_contain_text("No message #99")
    page.watch.assert_clean()


def test_the_header_recounts_after_prune_restore_and_undo(browser_page, curator):
    page = browser_page
    ctx = make_context(messages=6, text="<b>bold</b> words number {i} and a few more after them")
    messages = {m.seq: m for m in Message.objects.filter(context=ctx)}
    tokens = {seq: m.token_count for seq, m in messages.items()}
    total = sum(tokens.values())

    login(page, "cura", TEST_PASSWORD, next_path=f"/contexts/{ctx.pk}/")
    assert counts(page) == ("6", str(total))
    page.locator("#m-2 button:has-text('Prune')").click()
    expect(page.locator("#m-2 .badge")).to_have_text("pruned")
    expect(page.locator("#context-counts [data-testid=live-count]")).to_have_text("5")
    assert counts(page) == ("5", str(total - tokens[2]))
    expect(page.locator("[data-testid=pruned-count]")).to_have_text("1")
    page.locator("#m-2 button:has-text('Restore')").click()
    expect(page.locator("#context-counts [data-testid=live-count]")).to_have_text("6")
    assert counts(page) == ("6", str(total))

    # On the curate page: prune two, then undo from "Recent changes".
    page.goto(f"{page.base_url}/contexts/{ctx.pk}/curate/")
    for seq in (3, 4):
        page.check(f"#cm-{messages[seq].pk} input[name=ids]")
    page.click("#curate-form button[name=pruned][value='1']")
    expect(page.locator("#context-counts [data-testid=live-count]")).to_have_text("4")
    assert counts(page) == ("4", str(total - tokens[3] - tokens[4]))
    recent = page.locator("#recent-changes li").first
    # Named by seq and first words, agent-written markup shown as text.
    expect(recent.locator(".target-name")).to_have_text(
        [f"#{seq} · <b>bold</b> words number {seq} and a few…" for seq in (3, 4)]
    )
    assert recent.locator("b").count() == 0
    screenshot(page, "curate-recent-changes-named")
    page.locator("#recent-changes summary").click()
    recent.locator("button:has-text('Undo')").click()
    expect(page.locator("#context-counts [data-testid=live-count]")).to_have_text("6")
    assert counts(page) == ("6", str(total))
    page.watch.assert_clean()


def test_a_long_unbroken_title_and_key_wrap_on_a_phone(browser_page, curator):
    page = browser_page
    word = "Unbroken" * 40
    ctx = make_context(keys={"user": "k" * 200}, title=word, messages=1)
    run = make_run(context=ctx, steps=1, task=word)
    page.set_viewport_size({"width": 375, "height": 800})
    login(page, "cura", TEST_PASSWORD, next_path="/contexts/")
    for path in ("/contexts/", f"/contexts/{ctx.pk}/", f"/runs/{run.pk}/steps/1/"):
        page.goto(page.base_url + path)
        expect(page.locator("h1")).to_be_visible()
        widths = page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert widths[0] <= widths[1], f"{path} is {widths[0]} px wide at 375 px"
    page.goto(f"{page.base_url}/contexts/{ctx.pk}/")
    title = page.locator("h1").bounding_box()
    assert title["x"] + title["width"] <= 375 and title["height"] > 40
    screenshot(page, "long-title-375", widths=("narrow",))


# Each step's answer held back in the page, as on a slow link: presses land while it loads.
SLOW_STEP_LOADS = """
(() => {
  const open = XMLHttpRequest.prototype.open, send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.open = function (method, url) {
    this._stepLoad = /\\/steps\\/\\d+\\/$/.test(String(url));
    return open.apply(this, arguments);
  };
  XMLHttpRequest.prototype.send = function (body) {
    if (!this._stepLoad) return send.call(this, body);
    setTimeout(() => send.call(this, body), 400);
  };
})();
"""


def test_fast_j_and_k_presses_are_all_honoured(browser_page, curator):
    page = browser_page
    run = make_run(context=make_context(), steps=40)
    page.add_init_script(SLOW_STEP_LOADS)
    login(page, "cura", TEST_PASSWORD, next_path=f"/runs/{run.pk}/steps/1/")
    page.wait_for_selector("#logbook[data-position='1']")
    for _ in range(10):
        page.keyboard.press("j")
        page.wait_for_timeout(150)  # a person's pace, not a wait for the page
    expect(page.locator("#logbook")).to_have_attribute("data-position", "11", timeout=20_000)
    assert page.url.endswith(f"/runs/{run.pk}/steps/11/")
    expect(page.locator("#step-list li.current .pos")).to_have_text("11")
    for _ in range(4):
        page.keyboard.press("k")
        page.wait_for_timeout(150)
    expect(page.locator("#logbook")).to_have_attribute("data-position", "7", timeout=20_000)
    assert page.url.endswith(f"/runs/{run.pk}/steps/7/")
    page.watch.assert_clean()


def bar_geometry(page) -> dict[int, tuple[float, float]]:
    """Each live bar's (x, width) of its duration rect, by step position."""
    rows = page.locator("#tl-bars > a").evaluate_all(
        "els => els.map(a => [a.dataset.p, a.querySelector('.tl-dur').getAttribute('x'),"
        " a.querySelector('.tl-dur').getAttribute('width')])"
    )
    return {int(p): (float(x or 0), float(w or 0)) for p, x, w in rows}


def test_a_running_runs_timeline_grows_on_the_clock_as_steps_arrive(browser_page, curator):
    page = browser_page
    run, _ = run_create(context=make_context(), task="Find the weather")
    t0 = 1_700_000_000.0
    items = [{"kind": "task", "task": "Find the weather"}]
    for number, (offset, seconds) in enumerate([(0, 2.5), (3, 10.0), (14, 360.0)], start=1):
        items.append(action_step(number, start_time=t0 + offset, end_time=t0 + offset + seconds))
    steps_append(run=run, items=items)
    login(page, "cura", TEST_PASSWORD, next_path=f"/runs/{run.pk}/steps/4/")
    expect(page.locator("#run-live")).to_be_visible()
    geometry = bar_geometry(page)
    assert geometry[4][1] > 900  # the long step spans most of the run
    assert geometry[1][0] == 0 and geometry[2][1] < 10

    # A step after an idle stretch: the poll appends its bar and the picture rescales.
    steps_append(run=run, items=[action_step(4, start_time=t0 + 574, end_time=t0 + 600)])
    expect(page.locator("#tl-bars > a")).to_have_count(5, timeout=8_000)
    expect(page.locator("#tl-caption")).to_contain_text("run 10 min")
    geometry = bar_geometry(page)
    scale = 1000 / 600
    assert geometry[4] == pytest.approx((14 * scale, 360 * scale), abs=0.02)
    assert geometry[5] == pytest.approx((574 * scale, 26 * scale), abs=0.02)
    # Nothing drawn over the idle stretch between steps 4 and 5.
    assert all(x + w <= 374 * scale + 0.02 or x >= 574 * scale - 0.02 for x, w in geometry.values())
    marker = float(page.locator(".tl-marker").get_attribute("x1"))
    assert marker == pytest.approx((14 + 180) * scale, abs=0.02)
    screenshot(page, "run-timeline-live")
    page.watch.assert_clean()
