"""OTLP exports acknowledged at once and mapped into runs and steps in bulk.

The receiver (`POST /v1/traces`, `/v1/logs`) reads and authenticates an export, places its
traces in their contexts (`traces.traces_place`: the same rules and refusals as the mapping) and
writes one `SpanQueue` row per context in one statement, then answers. A trace export is read no
further than placing needs (`otlp_scan`: ids and context attributes) and queued as protobuf, the
context's spans as received, zlib-compressed; the mapper decodes it. Spans kept before with other
content are answered as rejected there and then; spans already kept as sent are not queued
again.

The mapping is a backlog drained by the per-process indexer thread (woken when an export
commits; not with AGENTMEMORY_OTLP_MAP_THREAD off), by `manage.py serve`'s mapper (told of each
export as it commits: QUEUED_CHANNEL) and by every turn of `manage.py embed_worker`, provider or
not: `spans_map_batch` locks
one context (SKIP LOCKED: another mapper or writer holding it is passed over), claims up to
MAP_SPANS of its queued spans in arrival order, decodes them, maps them with
`trace_bulk.traces_map_bulk` (new traces written together, each trace brought up to date once for
all the exports that hold spans of it) and deletes the rows, in one transaction. A span queued
twice (an exporter's retry before the first copy was mapped) is kept once, first received first.

AGENTMEMORY_OTLP_MAP_INLINE maps in the request instead (the synchronous path: the export is
answered once its runs and steps are written).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import zlib
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from psycopg import sql as psql

from memory_app import backlog, db, pipelines, pricing
from memory_app.db import json_text
from memory_app.interop import otlp, otlp_scan
from memory_app.models import ApiKey, Context, SpanQueue
from memory_app.queries.trace_spans import SPAN_FIELDS
from memory_app.services import trace_bulk, traces

log = logging.getLogger(__name__)

# Spans mapped in one transaction (at least one export, whatever its size).
MAP_SPANS = 5000
# Exports of a context looked at per claim.
CLAIM_ROWS = 500
# A trace export's protobuf is queued zlib-compressed at this level: the acknowledgement commits
# its queue rows durably, and on a slow disk writing and flushing the WAL of a 210 KB export took
# longer than compressing it (≈ 0.7 ms) and writing the tenth that is left.
BODY_LEVEL = 1


def traces_receive(*, key: ApiKey, body: bytes, content_type: str) -> dict[str, Any]:
    """Accept an OTLP trace export (the request body, decompressed): queued for mapping (or
    mapped now, see the module doc). Returns `{"spans", "rejected", "rejected_ids", ...}` as
    `traces.traces_ingest` does; a body that is no valid export is `otlp.TraceFormatError`."""
    if settings.AGENTMEMORY_OTLP_MAP_INLINE:
        spans = otlp.decode_request(body, content_type=content_type)
        return traces.traces_ingest(key=key, spans=spans)
    scan = otlp_scan.scan_request(body, content_type=content_type)
    placed, kept = traces.traces_place(key=key, rows=scan.rows, create=False)
    if placed is not None:
        # Every context exists: the reads need no transaction, and the queue rows go in one
        # round trip with their BEGIN and COMMIT.
        return _queue_scan(scan, placed, kept)
    with transaction.atomic():
        # A context is created with the rows that need it, or not at all.
        placed, kept = traces.traces_place(key=key, rows=scan.rows)
        return _queue_scan(scan, placed, kept)


def _queue_scan(scan: otlp_scan.Scan, placed: list, kept: dict) -> dict[str, Any]:
    """Queue each context's spans not kept yet (`traces.traces_place` placed them); a span kept
    with other content is answered as rejected."""
    queued, rejected = [], []
    for context_id, group in placed:
        fresh = []
        for r in group:
            row = kept.get((context_id, r["trace_id"], r["span_id"]))
            if row is None:
                fresh.append(r["index"])
                continue
            (sent,) = traces.span_rows([scan.span(r["index"])])
            if any(row[k] != sent[k] for k in SPAN_FIELDS):
                rejected.append(r["span_id"])
        if fresh:
            trace_ids = sorted({scan.rows[i]["trace_id"] for i in fresh})
            body = zlib.compress(scan.body_of(set(fresh)), BODY_LEVEL)
            queued.append((context_id, trace_ids, len(fresh), "", body))
    _insert(queued)
    return {
        "spans": len(scan.rows),
        "queued": sum(q[2] for q in queued),
        "rejected": len(rejected),
        "rejected_ids": rejected,
    }


def logs_receive(*, key: ApiKey, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Accept decoded log records as `traces.logs_ingest` does, queued for mapping."""
    if settings.AGENTMEMORY_OTLP_MAP_INLINE:
        return traces.logs_ingest(key=key, records=records)
    kept, outside = traces.log_rows(records)
    result = _enqueue(key=key, rows=kept)
    return {**result, "rejected": len(outside), "rejected_ids": outside}


def _enqueue(*, key: ApiKey, rows: list[dict[str, Any]]) -> dict[str, Any]:
    queued, rejected = [], []
    with transaction.atomic():
        placed, kept = traces.traces_place(key=key, rows=rows)
        for context_id, group in placed:
            fresh, differing = [], []
            for r in group:
                row = kept.get((context_id, r["trace_id"], r["span_id"]))
                if row is None:
                    fresh.append(r)
                elif any(row[k] != r[k] for k in SPAN_FIELDS):
                    differing.append(r["span_id"])
            rejected += differing
            if fresh:
                trace_ids = sorted({r["trace_id"] for r in fresh})
                queued.append((context_id, trace_ids, len(fresh), json_text(fresh), None))
        _insert(queued)
    return {
        "spans": len(rows),
        "queued": sum(q[2] for q in queued),
        "rejected": len(rejected),
        "rejected_ids": rejected,
    }


def _insert(queued: list[tuple[int, list[str], int, str, bytes | None]]) -> None:
    """The exports' queue rows (context, trace ids, span count, payload, body) in one round trip,
    in one transaction (the caller's, if it has one), the indexer woken once it commits. Payload
    and body are bound as parameters, the body in binary: inlined in the statement's text
    (Django's cursor), half a megabyte of JSON was escaped by the client and parsed back by the
    server."""
    if not queued:
        return
    with db.binding_cursor() as cursor, pipelines.pipelined_transaction(cursor):
        cursor.executemany(
            f"INSERT INTO {SpanQueue._meta.db_table}"  # noqa: S608 - the model's table
            " (context_id, trace_ids, span_count, payload, body, received_at, error)"
            " VALUES (%s, %s, %s, %s, %s, now(), '')",
            queued,
        )
        # Delivered when the rows commit, to a mapper in another process (`exports_listener`).
        cursor.execute("SELECT pg_notify(%s, '')", [QUEUED_CHANNEL])
    if settings.AGENTMEMORY_OTLP_MAP_THREAD:
        transaction.on_commit(backlog.wake_indexer)


def spans_map_batch(*, max_spans: int = MAP_SPANS, wait: bool = False) -> int | None:
    """Map one context's queued spans (up to `max_spans`, at least one export) in one committed
    transaction. Answers the spans mapped; 0 when spans are queued but every context holding
    them is being written by someone else (`wait`: waited for instead); None when nothing is
    queued."""
    heads = (
        SpanQueue.objects.filter(error="")
        .order_by("pk")
        .values_list("context_id", flat=True)[:CLAIM_ROWS]
    )
    contexts = list(dict.fromkeys(heads))
    if not contexts:
        return None
    for context_id in contexts:
        try:
            done = _map_context(context_id, max_spans=max_spans, wait=wait)
        except db.DATABASE_FAULTS:
            raise
        except Exception as exc:
            # Spans the mapping cannot take must not hold up the context's later exports, nor
            # the other contexts': the first export alone is tried, and kept aside if it fails.
            log.exception("span mapping failed for context %s", context_id)
            try:
                done = _map_context(context_id, max_spans=0, wait=wait)
            except db.DATABASE_FAULTS:
                raise
            except Exception:
                _set_aside(context_id, exc)
                done = 0
        if done is not None:
            return done
    return 0


def _map_context(context_id: int, *, max_spans: int, wait: bool) -> int | None:
    """Map the context's oldest queued exports; None when its lock or its rows are taken."""
    with transaction.atomic():
        context = lock_context(context_id, wait=wait)
        if context is None:
            return None
        with connection.cursor() as cursor:
            # The batch's commit does not wait for its WAL to reach the disk: were the server to
            # crash first, the whole transaction is lost, the queue rows' deletion with the runs,
            # and the exports are mapped again. The exports themselves were made durable when
            # they were acknowledged.
            cursor.execute("SET LOCAL synchronous_commit = off")
        claimed = list(
            SpanQueue.objects.filter(context_id=context_id, error="")
            .order_by("pk")
            .select_for_update(skip_locked=True)
            .values_list("pk", "span_count")[:CLAIM_ROWS]
        )
        taken, size = [], 0
        for pk, count in claimed:
            if taken and size + count > max_spans:
                break
            taken.append(pk)
            size += count
        if not taken:
            return None
        rows, seen = [], set()
        for payload, body in _claimed(context_id, taken):
            for row in _rows(payload, body):
                if (row["trace_id"], row["span_id"]) not in seen:
                    seen.add((row["trace_id"], row["span_id"]))
                    rows.append(row)
        with pricing.prices_fixed():
            trace_bulk.traces_map_bulk(context=context, rows=rows)
        SpanQueue.objects.filter(context_id=context_id, pk__in=taken).delete()
    return len(rows)


def lock_context(context_id: int, *, wait: bool) -> Context | None:
    """The context locked for its mapping, in the caller's transaction; None when another mapper
    or writer holds it (`wait`: waited for). FOR NO KEY UPDATE: it keeps out the context's other
    writers (their FOR UPDATE, another mapper's lock) but not the receiver, whose queue rows'
    foreign key takes FOR KEY SHARE on the context; FOR UPDATE held every acknowledgement that
    names the context until the batch was mapped."""
    return (
        Context.objects.select_for_update(skip_locked=not wait, no_key=True)
        .filter(pk=context_id)
        .first()
    )


def _claimed(context_id: int, ids: list[int]) -> list[tuple[str, bytes | None]]:
    """The exports' payloads and bodies, in arrival order."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT payload, body FROM {SpanQueue._meta.db_table}"  # noqa: S608
            " WHERE context_id = %s AND id = ANY(%s) ORDER BY id",
            [context_id, ids],
        )
        return cursor.fetchall()


def _rows(payload: str, body: bytes | None) -> list[dict[str, Any]]:
    """A queued export's rows (`traces.span_rows`, `traces.log_rows`): a trace export's protobuf
    decoded, a log export's JSON read."""
    if body is None:
        return json.loads(payload)
    try:
        export = zlib.decompress(body)
    except zlib.error:
        # Queued as it came, by a receiver before the bodies were compressed (protobuf is no
        # zlib stream: its header check and checksum fail).
        export = bytes(body)
    return traces.span_rows(otlp.decode_request(export, content_type=otlp.PROTOBUF))


def _set_aside(context_id: int, exc: Exception) -> None:
    """The context's oldest export, which the mapping refuses: kept with the error, out of the
    backlog (`/healthz` counts it)."""
    with transaction.atomic():
        oldest = (
            SpanQueue.objects.filter(context_id=context_id, error="")
            .order_by("pk")
            .values_list("pk", flat=True)
            .first()
        )
        SpanQueue.objects.filter(context_id=context_id, pk=oldest).update(
            error=f"{type(exc).__name__}: {exc}"[:1000] or "failed"
        )


def spans_map_drain() -> int | None:
    """One batch, for the indexer thread (as `spans_map_batch`), the thread and its server
    process at the background priority (`db.background_priority`); None, leaving the queue to
    `embed_worker`, when AGENTMEMORY_OTLP_MAP_THREAD is off."""
    if not settings.AGENTMEMORY_OTLP_MAP_THREAD:
        return None
    db.background_priority(settings.AGENTMEMORY_OTLP_MAP_NICE)
    return spans_map_batch()


# How long the embed worker's turn keeps mapping batches while spans are queued.
CHORE_SECONDS = 2.0


def spans_map_chore(*, background: bool = False) -> int:
    """For the embed worker's turn: batches mapped one after another while spans are queued,
    for up to CHORE_SECONDS (then the turn's other work has its go); the spans mapped. One
    batch a turn left a mapper process chasing a stream of exports with the rest of the turn's
    statements between every two batches. `background`: the worker and its server process at
    the background priority (`db.background_priority`)."""
    if background:
        db.background_priority(settings.AGENTMEMORY_OTLP_MAP_NICE)
    total, started = 0, time.monotonic()
    while done := spans_map_batch():
        total += done
        if time.monotonic() - started >= CHORE_SECONDS:
            break
    return total


# Told of every export queued, once it commits: a mapper waiting on it starts at once.
QUEUED_CHANNEL = "agentmemory_spans_queued"


# A dead peer noticed within about a minute (30 s idle, then three probes 10 s apart); ignored
# on a Unix socket.
LISTENER_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def exports_listener() -> psycopg.Connection:
    """A connection of its own (the default database's), listening for exports queued
    (QUEUED_CHANNEL). Listening starts before the caller looks at the queue, so an export
    queued after that look is told of; `export_queued` waits for one."""
    params = connection.get_connection_params()
    # Django's cursor class and adapters are its own connection's, not a listener's.
    params.pop("cursor_factory", None)
    params.pop("context", None)
    # An idle listener sends nothing: without TCP keepalives a peer gone without a word (a
    # half-open connection) is never noticed, and the mapper waits on it for the rescans alone.
    # The operator's own settings (DATABASE_URL) win.
    for name, value in LISTENER_KEEPALIVES.items():
        params.setdefault(name, value)
    listener = psycopg.connect(**params, autocommit=True)
    try:
        listener.execute(psql.SQL("LISTEN {}").format(psql.Identifier(QUEUED_CHANNEL)))
    except BaseException:
        listener.close()
        raise
    return listener


def export_queued(listener: psycopg.Connection, timeout: float) -> bool:
    """Whether an export was queued (told to `listener`) within `timeout` seconds; those told
    of meanwhile are taken with it (one look at the queue maps them all)."""
    waiting = listener.notifies(timeout=timeout, stop_after=1)
    try:
        return next(waiting, None) is not None
    finally:
        waiting.close()


class ExportWait:
    """An idle mapper's wait: until an export is queued, `stop` is set, or the time given is up.
    `listen` before each look at the queue (an export queued after the look is then told of).
    A wait that had to listen anew (its connection lost) ends at once, for a look at what was
    queued meanwhile; while the database cannot be reached the time is waited out."""

    # How long a stop waits for an idle mapper at most (it checks between waits).
    STOP_SECONDS = 0.2

    def __init__(self, stop: threading.Event):
        self.stop = stop
        self.listener: psycopg.Connection | None = None
        self.failing = False  # warned that listening failed, not listening since

    def listen(self) -> None:
        """Listening (connected anew if need be), with what it was told taken: the look that
        follows covers it, and told exports do not pile up unread while the mapper is busy.
        Best effort: a failure is logged, and the next wait waits its time out."""
        if self.listener is not None:
            try:
                self._drained()
                return
            except psycopg.Error:
                self.close()
        try:
            self.listener = exports_listener()
        except Exception as exc:  # listening only saves time: the rescans still map
            # Once an outage: the waits go on trying, as often as the mapper idles.
            if not self.failing:
                log.warning("not listening for exports (%s)", str(exc).strip()[:200])
            self.failing = True
            return
        if self.failing:
            log.info("listening for exports again")
        self.failing = False

    def __call__(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if self.listener is None:
                self.listen()
                if self.listener is None:
                    self.stop.wait(left)
                return
            try:
                if export_queued(self.listener, min(left, self.STOP_SECONDS)):
                    self._drained()  # told before the look that follows, which covers them
                    return
            except psycopg.Error:
                self.close()

    def _drained(self) -> None:
        while export_queued(self.listener, 0):
            pass

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def spans_busy() -> bool:
    """Whether spans wait in the queue (not set aside): after a look mapped none, their
    contexts were held by writers, and the mapper looks again soon rather than when told."""
    return SpanQueue.objects.filter(error="").exists()


def spans_map_pending() -> int:
    """Map every queued span (tests, benchmarks); answers the spans mapped. A context held by
    another writer is waited for."""
    total = 0
    while (done := spans_map_batch(wait=True)) is not None:
        total += done
    return total
