"""Fixtures for browser tests: headless Debian Chromium driven by Playwright (sync API).

`browser_page` records console errors, dialogs and every request to a host other than the
test server, so a test can assert that a page ran no injected script and fetched nothing from
outside. Reused by other browser tests (e.g. the API docs page).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# Playwright's sync API runs an event loop in this thread; Django's ORM refuses to run next to
# one unless told that the test thread is not really async (it is not: calls are blocking).
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("AGENTMEMORY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
WIDTHS = {"desktop": (1280, 860), "wide": (1440, 900), "narrow": (390, 844)}
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/browser/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("playwright is not installed")
    if not Path(CHROMIUM).exists() and not shutil.which(CHROMIUM):
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"Chromium not found at {CHROMIUM}: browser tests must run in CI")
        pytest.skip(f"Chromium not found at {CHROMIUM}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@dataclass
class PageWatch:
    """What a page did that a test may want to forbid."""

    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    def assert_clean(self):
        assert not self.dialogs, f"dialogs opened: {self.dialogs}"
        assert not self.console_errors, f"console errors: {self.console_errors}"
        assert not self.page_errors, f"uncaught page errors: {self.page_errors}"
        assert not self.outside_requests, f"requests to outside hosts: {self.outside_requests}"


@pytest.fixture
def browser_page(browser, live_server):
    """A fresh page (own cookies) at desktop width; `page.watch` is a PageWatch."""
    context = browser.new_context(
        viewport=dict(zip(("width", "height"), WIDTHS["desktop"], strict=True))
    )
    page = context.new_page()
    watch = PageWatch()

    def on_console(message):
        if message.type == "error":
            watch.console_errors.append(f"{message.text} @ {message.location.get('url', '')}")

    def on_dialog(dialog):
        watch.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def on_request(request):
        host = urlsplit(request.url).hostname or ""
        if request.url.startswith(("http:", "https:", "ws:", "wss:")) and host not in LOCAL_HOSTS:
            watch.outside_requests.append(request.url)

    page.on("console", on_console)
    page.on("dialog", on_dialog)
    page.on("request", on_request)
    page.on("pageerror", lambda error: watch.page_errors.append(str(error)))
    # Never let a request leave the machine, even if a test forgets to check.
    context.route(
        lambda url: (
            (urlsplit(url).hostname or "") not in LOCAL_HOSTS and url.startswith(("http", "ws"))
        ),
        lambda route: route.abort(),
    )
    page.watch = watch
    page.base_url = live_server.url
    page.set_default_timeout(10_000)
    yield page
    context.close()


def login(page, username: str, password: str, *, next_path: str = "/") -> None:
    """Log in through the real form and wait for the page it leads to."""
    page.goto(f"{page.base_url}/accounts/login/?next={next_path}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    with page.expect_navigation():
        page.click("form button[type=submit]")
    assert "/accounts/login/" not in page.url, "login failed"


def screenshot(
    page, name: str, *, widths=("desktop", "narrow"), full_page: bool = True
) -> list[Path]:
    """Save `name-<width>.png` for each width into test-artifacts/screenshots/ (git-ignored)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    original = page.viewport_size
    paths = []
    for width_name in widths:
        width, height = WIDTHS[width_name]
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(50)
        path = SCREENSHOTS / f"{name}-{width_name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        paths.append(path)
    page.set_viewport_size(original)
    return paths
