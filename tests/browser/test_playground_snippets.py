"""The playground's "Copy curl" and "Copy Python" snippets, copied as the page shows them and
run against the live server with a real key in the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

from memory_app import auth, selectors
from memory_app.views.playground import API_KEY_VARIABLE, spec_from_params
from tests.browser.conftest import login, screenshot
from tests.builders import TEST_PASSWORD, make_context, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

REPO = Path(__file__).resolve().parents[2]


def snippet_of(page, ctx, query: str, name: str) -> str:
    page.goto(f"{page.base_url}/contexts/{ctx.pk}/playground/?{query}")
    page.click("#side-a details.snippets summary")
    pre = page.locator(f"#{name}-a")
    expect(pre).to_be_visible()
    # What the Copy button copies: the element's text.
    return pre.evaluate("el => el.textContent")


def run(command: list[str], secret: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != API_KEY_VARIABLE}
    if secret is not None:
        env[API_KEY_VARIABLE] = secret
    return subprocess.run(
        command, env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_copied_curl_command_runs_with_the_key_from_the_environment(browser_page):
    page = browser_page
    make_user(role="viewer", username="vera")
    ctx = make_context(messages=12)
    secret = auth.apikey_create(name="curl", scopes=["read"]).secret
    login(page, "vera", TEST_PASSWORD)
    curl = snippet_of(page, ctx, "selector=window&k=3", "curl")
    assert f'"Authorization: Bearer ${API_KEY_VARIABLE}"' in curl
    screenshot(page, "playground-snippets")
    page.watch.assert_clean()

    # -s: quiet, -w: the status on its own last line.
    command = [
        "bash",
        "-c",
        curl.replace("curl -X POST", "curl -s -w '\\n%{http_code}' -X POST", 1),
    ]
    done = run(command, secret)
    body, _, status = done.stdout.rpartition("\n")
    assert (status, done.returncode) == ("200", 0), done.stdout + done.stderr
    expected = selectors.select(
        context=ctx, spec=spec_from_params({"selector": "window", "k": "3"})
    )
    assert [item["message"]["id"] for item in json.loads(body)["items"]] == expected.ids
    assert len(expected.ids) == 3

    # The same command without the variable is refused: the key really comes from it.
    body, _, status = run(command, None).stdout.rpartition("\n")
    assert status == "401"


def test_the_copied_python_snippet_runs_with_the_key_from_the_environment(browser_page):
    page = browser_page
    make_user(role="viewer", username="vera")
    ctx = make_context(messages=6, text="note {i} about Kyoto")
    secret = auth.apikey_create(name="python", scopes=["read"]).secret
    login(page, "vera", TEST_PASSWORD)
    python = snippet_of(page, ctx, "selector=token_window&max_tokens=30", "python")
    assert f'os.environ["{API_KEY_VARIABLE}"]' in python
    done = run([sys.executable, "-c", python], secret)
    assert done.returncode == 0, done.stderr
    expected = selectors.select(
        context=ctx, spec=spec_from_params({"selector": "token_window", "max_tokens": "30"})
    )
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(expected.ids) > 0
    assert all("about Kyoto" in line for line in lines)
