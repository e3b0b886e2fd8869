"""The connection pool's health check (settings.py), with a deadline, and without a round trip
for a connection that has just served a request.

psycopg_pool's own check runs an empty query and waits for the answer as long as it takes: a
stalled server (stopped, swapping, frozen by SIGSTOP) keeps every request that takes an idle
pooled connection waiting with it. This one gives up after CHECK_SECONDS and drops the
connection; the pool then makes a new one within its timeout or the request answers 503.

A connection given back idle less than RECENT_SECONDS ago, with nothing from the server waiting
on its socket, is handed out without the empty query: it answered its last request just now,
and a server that closed it since (killed, restarted, the connection terminated) has left its
end of the socket readable, which sends it through the full check. Under steady traffic that is
one round trip less on every request. A server that stalls in that fraction of a second holds
the requests that took such a connection as it holds those already in flight; after it, every
connection is checked again.
"""

from __future__ import annotations

import select
import time
from functools import lru_cache

import psycopg
from psycopg import postgres, pq
from psycopg.adapt import AdaptersMap, Loader

CHECK_SECONDS = 1.0
RECENT_SECONDS = 0.2


def mark_idle(conn: psycopg.Connection) -> None:
    """Note that `conn` goes back to the pool now (the backend's `_close`)."""
    conn._agentmemory_idle_since = time.monotonic()  # type: ignore[attr-defined]


def check_connection(conn: psycopg.Connection) -> None:
    """Raise (and close `conn`) unless it served a request just now (see the module's notes) or
    the server answers an empty query within CHECK_SECONDS."""
    pgconn = conn.pgconn
    if conn.closed or pgconn.transaction_status != pq.TransactionStatus.IDLE:
        raise psycopg.OperationalError("the pooled connection is not idle")
    if _just_used(conn):
        return
    deadline = time.monotonic() + CHECK_SECONDS
    try:
        pgconn.send_query(b"")
        while pgconn.flush():
            _wait(pgconn, deadline, write=True)
        pgconn.consume_input()
        while pgconn.is_busy():
            _wait(pgconn, deadline, write=False)
            pgconn.consume_input()
        while (result := pgconn.get_result()) is not None:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                raise psycopg.OperationalError(result.get_error_message())
    except psycopg.Error:
        conn.close()
        raise


def _wait(pgconn, deadline: float, *, write: bool) -> None:
    remaining = deadline - time.monotonic()
    ready = remaining > 0 and select.select(
        [] if write else [pgconn.socket], [pgconn.socket] if write else [], [], remaining
    )
    if not ready or not any(ready):
        raise psycopg.OperationalError(f"the server did not answer within {CHECK_SECONDS} s")


def _just_used(conn: psycopg.Connection) -> bool:
    since = getattr(conn, "_agentmemory_idle_since", None)
    if since is None or time.monotonic() - since > RECENT_SECONDS:
        return False
    readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    return not readable


TIMESTAMPTZ_OID = postgres.types["timestamptz"].oid


@lru_cache
def adapters_with_c_timestamps(template: AdaptersMap) -> AdaptersMap:
    """Django's adapters (`template`) with its timestamptz loader replaced by one that parses
    with psycopg's C loader and sets the same zone as Django's does: Django's loader extends
    psycopg's pure-Python one (a regular expression and a dozen Python calls a value), a visible
    share of reading a few rows (the API key and its context on every request, the hits of a
    search). Without psycopg's C module, `template` as it is."""
    django_loader = template.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT)
    c_loader = psycopg.adapters.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT)
    zone = getattr(django_loader, "timezone", None)
    if c_loader is None or not c_loader.__module__.startswith("psycopg_"):
        return template

    class CTimestampLoader(Loader):
        timezone = zone  # what Django's cursors compare before registering their own

        def __init__(self, oid, context=None):
            super().__init__(oid, context)
            self._parse = c_loader(oid, context).load

        def load(self, data):
            return self._parse(data).replace(tzinfo=zone)

    adapters = AdaptersMap(template)
    adapters.register_loader(TIMESTAMPTZ_OID, CTimestampLoader)
    return adapters
