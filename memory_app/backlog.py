"""Deferred work and who does it: vectors waiting for a provider, vectors waiting for their HNSW
graph, messages waiting for their full-text vector, queued OTLP exports waiting to be mapped,
trace spans past their retention. A per-process thread drains the middle three after a write
commits; `manage.py embed_worker` (`run_worker`) loops over all five; `manage.py expire_spans`
applies the retention once."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from memory_app import db
from memory_app.embeddings import indexer as vector_indexer
from memory_app.embeddings.indexer import index_batch, index_pending
from memory_app.embeddings.providers import EmbeddingProvider
from memory_app.embeddings.worker import BACKOFF_BASE_SECONDS, BatchResult, embed_batch
from memory_app.models import TraceSpan
from memory_app.search import fulltext

log = logging.getLogger(__name__)


class Outage:
    """Waits between attempts while the database is unavailable (down, restarting, stalled):
    doubling from BASE_SECONDS up to MAX_SECONDS, logged once when it begins and once when it
    ends, instead of a traceback per attempt or the loop exiting."""

    BASE_SECONDS = 0.5
    MAX_SECONDS = 30.0

    def __init__(self, who: str):
        self.who = who
        self.failures = 0
        self.since = 0.0

    def failed(self, exc: BaseException) -> float:
        """Seconds to wait before the next attempt."""
        if not self.failures:
            self.since = time.monotonic()
            log.warning(
                "%s: the database is unavailable (%s); retrying with backoff",
                self.who,
                str(exc).strip()[:200],
            )
        self.failures += 1
        # Its connection is broken: the next attempt opens a new one.
        connections.close_all()
        return min(self.BASE_SECONDS * 2 ** (self.failures - 1), self.MAX_SECONDS)

    def wait_out(self, exc: BaseException, stop: threading.Event | None) -> None:
        """Wait before the next attempt (cut short when `stop` is set)."""
        delay = self.failed(exc)
        if stop:
            stop.wait(delay)
        else:
            time.sleep(delay)

    def succeeded(self) -> None:
        if self.failures:
            log.warning(
                "%s: the database is back after %.1f s", self.who, time.monotonic() - self.since
            )
            self.failures = 0


# Backlogs of the layers above, drained by the indexer thread too (`register_drain`): each call
# does one batch and answers what it did, 0 when work is waiting on a busy context, None when
# there is none.
_drains: list[Callable[[], int | None]] = []


def register_drain(drain: Callable[[], int | None]) -> None:
    if drain not in _drains:
        _drains.append(drain)


class _Indexer:
    """The per-process daemon thread that drains the backlogs after a deferred batch commits:
    vectors waiting for their HNSW graph, messages waiting for their full-text vector
    (`memory_app.search.fulltext`), then the registered drains (queued OTLP exports).

    Woken by `wake()` (an on_commit hook); it drains on its own database connection (Django's
    connections are per thread), closes it when the backlog is empty, then sleeps until woken
    again, so an idle process holds no extra connection. Under gunicorn each worker process gets
    its own thread (started lazily, after the fork). A failure is logged and retried after a
    pause: the rows stay in the waiting side tables, searchable, until a drain succeeds."""

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
        outage = Outage("indexer")
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
                busy = False
                for drain in _drains:
                    while done := drain():
                        log.info("indexer: %s did %d", drain.__name__, done)
                    busy = busy or done == 0
                if busy or fulltext.pending_count():
                    # Contexts locked by writers that do not wake the indexer (edits, prunes).
                    time.sleep(self.BUSY_SECONDS)
                    self._wake.set()
                outage.succeeded()
            except db.DATABASE_FAULTS as exc:
                time.sleep(outage.failed(exc))
                self._wake.set()
                continue
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


SPAN_EXPIRE_BATCH = 1000


def expire_spans_batch(*, batch_size: int = SPAN_EXPIRE_BATCH) -> int | None:
    """Delete up to `batch_size` trace spans received more than AGENTMEMORY_SPAN_RETENTION_DAYS
    ago, oldest first, in one committed transaction; None when the retention is off.

    The steps and runs made from them stay. A span marking a purged step (`purged`,
    `purged_task`) keeps its marker and loses the rest: deleted, a re-sent copy of it would make
    the purged step again. Markers go with their run."""
    days = settings.AGENTMEMORY_SPAN_RETENTION_DAYS
    if days <= 0:
        return None
    cutoff = timezone.now() - timedelta(days=days)
    expired = TraceSpan.objects.filter(received_at__lt=cutoff).exclude(data__has_key="purged")
    with transaction.atomic():
        # Two steps, as the other claims: a plain read finds the oldest, then each context's
        # share is locked by a statement naming it (SKIP LOCKED; the lock re-reads each row).
        # When every span read was taken, the next older ones are read.
        rows: list[tuple[int, int, bool | None]] = []
        after = Q()
        while len(rows) < batch_size:
            found = list(
                expired.filter(after)
                .order_by("received_at", "pk")
                .values_list("pk", "context_id", "received_at")[: batch_size - len(rows)]
            )
            if not found:
                break
            per_context: dict[int, list[int]] = {}
            for pk, context_id, _ in found:
                per_context.setdefault(context_id, []).append(pk)
            for context_id, ids in per_context.items():
                rows += (
                    expired.filter(context_id=context_id, pk__in=ids)
                    .order_by("pk")
                    .select_for_update(skip_locked=True)
                    .values_list("pk", "context_id", "data__purged_task")
                )
            last_pk, _, last_at = found[-1]
            after = Q(received_at__gt=last_at) | Q(received_at=last_at, pk__gt=last_pk)
        # Each context's spans by a statement naming it (on Citus, its shard alone).
        by_context: dict[int, tuple[list[int], list[int]]] = {}
        for pk, context_id, task in rows:
            by_context.setdefault(context_id, ([], []))[bool(task)].append(pk)
        for context_id, (gone, marked) in by_context.items():
            spans = TraceSpan.objects.filter(context_id=context_id)
            if gone:
                spans.filter(pk__in=gone).delete()
            if marked:
                spans.filter(pk__in=marked).update(data={"purged": True, "purged_task": True})
    return len(rows)


def expire_spans(*, batch_size: int = SPAN_EXPIRE_BATCH) -> int:
    """Apply the span retention until nothing is left to expire; answers the spans expired."""
    total = 0
    while written := expire_spans_batch(batch_size=batch_size):
        total += written
    return total


# Why long: one turn of the worker is one sequence (claim, indexers, retention, chores) whose
# outage handling and totals are shared; split, each part would re-implement the backoff.
def _vacuumed_after(moved: int) -> int:
    """The side tables vacuumed once the worker's turns have moved many of their rows and found
    none left (`indexer.side_tables_vacuumed`); answers the rows moved since the last vacuum."""
    if moved >= vector_indexer.VACUUM_AFTER and vector_indexer.side_tables_vacuumed():
        return 0
    return moved


def run_worker(
    *,
    provider: EmbeddingProvider | None,
    batch_size: int | None = None,
    once: bool = False,
    max_batches: int | None = None,
    idle_sleep: float = 2.0,
    backoff_base: float = BACKOFF_BASE_SECONDS,
    stop: threading.Event | None = None,
    chores: Sequence[Callable[[], int]] = (),
    idle: Callable[[float], None] = time.sleep,
) -> BatchResult:
    """Loop over `embed_batch`; `once` stops when nothing is due (tests, cron), otherwise it
    waits `idle_sleep` when idle (by `idle`: an `ExportWait` ends it when an export is queued)
    and after failures. `chores` (retention, the mapping of queued OTLP exports: above this
    module) run once a turn too, each answering the rows it changed; without a provider only
    they and the indexers run. Returns the totals."""
    totals = BatchResult()
    batches = moved = 0  # moved: deferred vectors moved since the side tables' last vacuum
    outage = Outage("embed worker")
    while not (stop and stop.is_set()):
        if max_batches is not None and batches >= max_batches:
            break
        try:
            res = (
                embed_batch(provider=provider, batch_size=batch_size, backoff_base=backoff_base)
                if provider is not None
                else BatchResult()
            )
            outage.succeeded()
        except db.DATABASE_FAULTS as exc:
            outage.wait_out(exc, stop)
            continue
        # The deferred HNSW insertions too, one batch per turn (several workers share them).
        indexed, parsed, expired, chored = 0, None, 0, 0
        try:
            indexed = index_batch()
            moved = moved + indexed if indexed else _vacuumed_after(moved)
            # And the messages waiting for their full-text vector, one context's batch a turn
            # (None: no context behind; 0 can still be progress, over a range of pruned messages).
            parsed = fulltext.index_batch()
            # And the trace spans past their retention, one batch a turn.
            expired = expire_spans_batch() or 0
            for chore in chores:
                chored += chore()
        except db.DATABASE_FAULTS as exc:
            # The database went away between the claim and the chores: the same outage as a
            # failed claim, waited out with backoff (the embedded batch is counted below).
            outage.wait_out(exc, stop)
        except Exception:
            log.exception("indexer: deferred vectors, full-text vectors or retention failed")
        totals.indexed += indexed
        totals.parsed += parsed or 0
        batches += 1 if res.claimed else 0
        totals.claimed += res.claimed
        totals.embedded += res.embedded
        totals.failed += res.failed
        if res.failed:
            totals.error = res.error
            log.warning(
                "embedding batch of %d failed (%s): retrying with backoff", res.failed, res.error
            )
        elif res.embedded:
            log.info(
                "embedded %d items with %s (%d so far)",
                res.embedded,
                provider.describe() if provider is not None else "",
                totals.embedded,
            )
        if expired:
            log.info("removed %d trace spans past their retention", expired)
        if chored:
            log.info("chores (retention, span mapping) changed %d rows", chored)
        if (
            not res.claimed and not indexed and parsed is None and not expired and not chored
        ) or res.failed:
            if once:
                break
            (time.sleep if res.failed else idle)(idle_sleep)  # a failure's retry is not hurried
    return totals
