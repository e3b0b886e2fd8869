"""Agent-written content is untrusted: every payload is shown as text and runs nothing."""

from __future__ import annotations

import pytest

from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, run_finish, steps_append
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, action_step, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

SCRIPT = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(1)>"
JS_URL = "javascript:alert(1)"
ALL = f"{SCRIPT} {IMG} {JS_URL}"
MARKDOWN = (
    f"# Title {SCRIPT}\n\n[click me]({JS_URL}) and [ok](https://example.org)\n\n"
    f'<a href="{JS_URL}">raw link</a> {IMG}\n\n![pic](https://evil.example/x.png)\n\n'
    f"```html\n{SCRIPT}\n```\n"
)


@pytest.fixture
def hostile():
    make_user(role="curator", username="ops")
    context, _ = context_get_or_create(
        keys={"user": SCRIPT, "chat": IMG, "link": JS_URL},
        title=f"Hostile {SCRIPT}",
        metadata={"note": ALL},
    )
    messages_append(
        context=context,
        items=[
            {
                "role": "user",
                "name": IMG,
                "text": ALL,
                "tags": [SCRIPT, JS_URL],
                "metadata": {"x": IMG},
            },
            {"role": "assistant", "text": MARKDOWN, "content": [{"type": "text", "text": SCRIPT}]},
        ],
    )
    run, _ = run_create(
        context=context, task=f"Task {SCRIPT}", system_prompt=IMG, agent_name=SCRIPT
    )
    step = action_step(
        1,
        model_output=f"Output {IMG}",
        code_action=f"print('{SCRIPT}')  # {IMG}",
        observations=f"Observed {SCRIPT} {JS_URL}",
        error_type=f"Err{IMG}",
        error_message=f"Failed {SCRIPT}",
        model_input_messages=[{"role": "user", "content": [{"type": "text", "text": ALL}]}],
    )
    step["tool_calls"] = [
        {
            "call_id": IMG,
            "name": f"tool{SCRIPT}",
            "arguments": {"q": SCRIPT, "u": JS_URL, IMG: 1},
            "output": IMG,
        },
        {
            "call_id": "c2",
            "name": "python_interpreter",
            "arguments": f"x = '{SCRIPT}'",
            "output": ALL,
        },
    ]
    steps_append(run=run, items=[{"kind": "task", "task": SCRIPT}, step])
    run_finish(run=run, status="failed", final_answer={"answer": ALL})
    return {"context": context, "run": run}


def assert_inert(page):
    # Nothing was injected as markup: no images, no script besides our two files, no js: links.
    assert page.locator("main img").count() == 0
    scripts = page.eval_on_selector_all("script", "els => els.map(e => e.getAttribute('src'))")
    assert all(src and src.startswith("/static/") for src in scripts), scripts
    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
    assert not [h for h in hrefs if h.strip().lower().startswith("javascript:")]
    handlers = page.eval_on_selector_all(
        "*",
        "els => els.flatMap(e => [...e.attributes].map(a => a.name))"
        ".filter(n => n.startsWith('on'))",
    )
    assert not handlers


def test_payloads_render_as_text_and_run_nothing(browser_page, hostile):
    page = browser_page
    context, run = hostile["context"], hostile["run"]
    login(page, "ops", TEST_PASSWORD)

    page.goto(f"{page.base_url}/contexts/?q=Hostile")
    assert SCRIPT in page.locator("#context-results").inner_text()
    assert_inert(page)

    page.goto(f"{page.base_url}/contexts/{context.pk}/")
    history = page.locator("#history").inner_text()
    assert ALL in history and IMG in history
    page.click("#m-1 details summary")
    assert IMG in page.locator("#m-1 details").inner_text()
    assert_inert(page)

    # Markdown view: rendered through the sanitiser, the dangerous parts gone or shown as text.
    page.goto(f"{page.base_url}/contexts/{context.pk}/?md=1")
    md = page.locator("#m-2 .msg-body")
    assert md.locator("h1").inner_text() == f"Title {SCRIPT}"
    assert md.locator("a[href='https://example.org']").count() == 1
    assert md.locator("a", has_text="click me").count() == 0
    assert "[image: pic]" in md.inner_text()
    assert SCRIPT in md.locator("pre").inner_text()
    assert_inert(page)
    screenshot(page, "xss-context-markdown", widths=("desktop",), full_page=False)

    page.goto(f"{page.base_url}/runs/{run.pk}/steps/2/")
    detail = page.locator(".step-detail").inner_text()
    for text in (
        f"Failed {SCRIPT}",
        f"Output {IMG}",
        f"Observed {SCRIPT} {JS_URL}",
        f"tool{SCRIPT}",
        IMG,
    ):
        assert text in detail
    page.click("details.lazy >> nth=0 >> summary")
    page.wait_for_selector("#model-input-2 .chat-msg")
    page.click("details.lazy >> nth=1 >> summary")
    page.wait_for_selector("#transcript-2 .chat-msg")
    assert IMG in page.locator("#transcript-2").inner_text()
    page.click(".page-head ~ details summary")  # final answer
    assert_inert(page)
    screenshot(page, "xss-run-step", widths=("desktop",), full_page=False)

    page.wait_for_timeout(300)  # let any late error or dialog surface before checking
    page.watch.assert_clean()
