"""The site's ASGI app (Django + /mcp) served by uvicorn in a thread, for tests that need a real
HTTP server speaking ASGI (MCP clients). Requests run in this process, on the test database:
tests using it take `transactional_db` so what they write is visible to the server's thread,
as with pytest-django's `live_server`.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from asgiref.sync import sync_to_async
from django.db import connections

from tests.aio import run_coroutine


class AsgiServer:
    def __init__(self, app, host: str = "127.0.0.1"):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level="warning")
        self.server = uvicorn.Server(config)
        self.url = f"http://{host}:{port}"
        self.thread = threading.Thread(target=self.server.run, name="asgi-test-server", daemon=True)

    def start(self, timeout: float = 20) -> AsgiServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the ASGI test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        # Tools ran in asgiref's thread-sensitive executor: close the connection it holds, or
        # the test database cannot be dropped.
        run_coroutine(sync_to_async(connections.close_all, thread_sensitive=True)())
