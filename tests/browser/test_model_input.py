"""What the model saw, in headless Chromium: the run's system prompt in the header, a step's input
opened on demand with its sections and tokens, and the diff with the previous call's input,
added and removed lines marked as text; agent text never runs. Screenshots at 1440 and 390 px
in test-artifacts/screenshots/."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from memory_app.audit import Actor
from memory_app.memories import Scope
from memory_app.queries.model_input import model_input
from memory_app.services.memories import memories_record
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, run_finish, steps_append
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, action_step, make_context, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SYSTEM = "You are a careful agent. <b>Never</b> guess."
TASK = "New task:\nFind Ada a tea shop in Kyoto"
MEMORY = "Ada prefers green tea over coffee."
HISTORY = "Earlier we talked about Kyoto's Gion district."
OUTPUT = "I will search <script>window.__ran = 1</script> for shops."
OBSERVATION = 'Observation:\nUogashi, 2 min away <img src="/nope" onerror="window.__ran = 2">'


def text(role, value):
    return {"role": role, "content": [{"type": "text", "text": value}]}


@pytest.fixture
def run():
    make_user(role="viewer", username="vera")
    context = make_context(keys={"user": "ada", "chat": "kyoto"}, title="Ada's tea")
    memories_record(
        scope=Scope(keys={"user": "ada"}), items=[{"content": MEMORY}], actor=Actor.system("t")
    )
    messages_append(context=context, items=[{"role": "user", "text": HISTORY}])
    first = [
        text("system", SYSTEM),
        text("user", TASK),
        text("user", MEMORY),
        text("user", HISTORY),
    ]
    second = [
        *first,
        text("assistant", OUTPUT),
        text("tool-call", "Calling tools:\n[{'id': 'call_1', 'function': {'name': 'search'}}]"),
        text("tool-response", OBSERVATION),
    ]
    # The third call's selector dropped the old history message and added the new turn.
    third = [*second[:3], *second[4:], text("assistant", "Uogashi it is.")]
    run, _ = run_create(context=context, task=TASK, system_prompt=SYSTEM, framework="otel")
    steps_append(
        run=run,
        items=[
            {"kind": "task", "task": TASK},
            action_step(1, model_input_messages=first),
            action_step(2, model_input_messages=second),
            action_step(3, model_input_messages=third),
        ],
    )
    return run_finish(run=run, status="success")


def no_sideways_scroll(page) -> bool:
    return page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")


def open_model_input(page, position: int):
    page.click(f"#step-{position} details.lazy >> nth=0 >> summary")
    panel = page.locator(f"#model-input-{position}")
    expect(panel.locator("table.mi-sections")).to_be_visible()
    return panel


def test_sections_tokens_and_the_diff_of_a_step_input(browser_page, run):
    page = browser_page
    login(page, "vera", TEST_PASSWORD, next_path=f"/runs/{run.pk}/steps/3/")

    # The run's system prompt, in the header, as text.
    prompt = page.locator("details.system-prompt")
    prompt.locator("summary").click()
    expect(prompt.locator(".text-block")).to_have_text(SYSTEM)

    panel = open_model_input(page, 3)
    seen = model_input(run=run, position=3)
    sections = panel.locator("table.mi-sections tbody tr")
    expect(sections).to_have_count(5)
    for row, total in zip(sections.all(), seen.sections, strict=True):
        expect(row.locator("th")).to_have_text(total.label)
        expect(row.locator("td")).to_have_text([str(total.messages), str(total.tokens)])
    expect(panel.locator("td.mi-total")).to_have_text(str(seen.total_tokens))
    expect(panel.locator(".chat-msg .mi-badge")).to_have_text(
        [
            "System prompt",
            "Task",
            "Memory and selector hits",
            "Memory and selector hits",
            "Earlier steps",
            "Earlier steps",
            "Tool outputs",
        ]
    )
    expect(panel.locator(".chat-msg.mi-memory .mi-source a")).to_have_text(
        [f"memory {seen.messages[2].memory_id}", "message #1"]
    )

    # The diff against step 2's input: the lines step 2 added, each marked "+" in the text.
    diff = panel.locator(".mi-diff")
    expect(diff.locator("h3")).to_contain_text("Changes since step 2's input (+8 lines, −0 lines")
    added = diff.locator("ins")
    expect(added).to_have_count(8)
    expect(added.nth(1)).to_have_text("+" + OUTPUT)
    expect(added.nth(7)).to_have_text("+" + OBSERVATION.split("\n")[1])
    expect(diff.locator("del")).to_have_count(0)
    assert page.evaluate("() => window.__ran") is None
    screenshot(page, "model-input-sections", widths=("wide", "narrow"))
    page.set_viewport_size({"width": 390, "height": 844})
    assert no_sideways_scroll(page)
    page.set_viewport_size({"width": 1280, "height": 860})

    # The next step: its input dropped the history message (a "−" line) and added a turn.
    page.keyboard.press("j")
    page.wait_for_selector("#logbook[data-position='4']")
    panel = open_model_input(page, 4)
    diff = panel.locator(".mi-diff")
    expect(diff.locator("del")).to_have_text(["−── user ──", "−" + HISTORY])
    expect(diff.locator("ins")).to_have_text(["+── assistant ──", "+Uogashi it is."])
    expect(panel.locator("tr.mi-section-memory td")).to_have_text(
        ["1", str(model_input(run=run, position=4).sections[2].tokens)]
    )
    screenshot(page, "model-input-diff", widths=("wide", "narrow"))
    page.watch.assert_clean()


def test_a_step_without_a_recorded_input_says_so(browser_page):
    make_user(role="viewer", username="vera")
    run, _ = run_create(context=make_context(), task="t", framework="agentscope")
    steps_append(run=run, items=[action_step(1, model_input_messages=None)])
    page = browser_page
    login(page, "vera", TEST_PASSWORD, next_path=f"/runs/{run.pk}/steps/1/")
    page.click("#step-1 details.lazy >> nth=0 >> summary")
    expect(page.locator("#model-input-1 .not-recorded")).to_contain_text(
        "Not recorded: the step has no stored model input, and agentscope gives no rule"
    )
    expect(page.locator("details.system-prompt")).to_have_count(0)
    page.watch.assert_clean()
