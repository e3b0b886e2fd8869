"""The connection pool's health check (settings.py), with a deadline.

psycopg_pool's own check runs an empty query and waits for the answer as long as it takes: a
stalled server (stopped, swapping, frozen by SIGSTOP) keeps every request that takes an idle
pooled connection waiting with it. This one gives up after CHECK_SECONDS and drops the
connection; the pool then makes a new one within its timeout or the request answers 503.
"""

from __future__ import annotations

import select
import time

import psycopg
from psycopg import pq

CHECK_SECONDS = 1.0


def check_connection(conn: psycopg.Connection) -> None:
    """Raise (and close `conn`) unless the server answers an empty query within CHECK_SECONDS."""
    pgconn = conn.pgconn
    if conn.closed or pgconn.transaction_status != pq.TransactionStatus.IDLE:
        raise psycopg.OperationalError("the pooled connection is not idle")
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
