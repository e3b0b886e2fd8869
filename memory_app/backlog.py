"""The per-process thread that drains the deferred work after a large batch commits: vectors
waiting for their HNSW graph, then messages waiting for their full-text vector."""

from __future__ import annotations

import logging
import os
import threading
import time

from django.conf import settings

from memory_app.embeddings.indexer import index_pending
from memory_app.search import fulltext

log = logging.getLogger(__name__)


class _Indexer:
    """The per-process daemon thread that drains the backlogs after a deferred batch commits:
    vectors waiting for their HNSW graph, then messages waiting for their full-text vector
    (`memory_app.search.fulltext`).

    Woken by `wake()` (an on_commit hook); it drains on its own database connection (Django's
    connections are per thread), closes it when the backlog is empty, then sleeps until woken
    again, so an idle process holds no extra connection. Under gunicorn each worker process gets
    its own thread (started lazily, after the fork). A failure is logged and retried after a
    pause: the rows stay `indexed = false`, searchable, until a drain succeeds."""

    RETRY_SECONDS = 5.0
    # A context being written to is skipped (SKIP LOCKED): looked at again this much later.
    BUSY_SECONDS = 0.1

    def __init__(self):
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def wake(self) -> None:
        if not settings.AGENTMEMORY_INDEXER_THREAD:
            return
        with self._lock:
            self._idle.clear()
            self._wake.set()
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="agentmemory-indexer", daemon=True
                )
                self._thread.start()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """True once the thread has drained what it was woken for and closed its connection."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        from django.db import connections

        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                done = index_pending()
                if done:
                    log.info("indexer: %d deferred vectors inserted into their HNSW graph", done)
                parsed = fulltext.index_pending()
                if parsed:
                    log.info("indexer: %d messages' full-text vectors written", parsed)
                if fulltext.pending_count():
                    # Contexts locked by writers that do not wake the indexer (edits, prunes).
                    time.sleep(self.BUSY_SECONDS)
                    self._wake.set()
            except Exception:
                log.exception("indexer: draining the backlog failed; retrying")
                connections.close_all()
                time.sleep(self.RETRY_SECONDS)
                self._wake.set()
                continue
            finally:
                if not self._wake.is_set():
                    connections.close_all()
            with self._lock:
                if not self._wake.is_set():
                    self._idle.set()


indexer = _Indexer()


def wake_indexer() -> None:
    indexer.wake()
