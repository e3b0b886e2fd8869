"""Run a coroutine from a synchronous test, whatever else the test process is running.

Playwright's sync API (browser tests, session-scoped) keeps an asyncio loop running on the main
thread, and `asyncio.run` refuses to start inside a running loop; a worker thread has none.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor


def run_coroutine(coro):
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
