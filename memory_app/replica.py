"""Reads that may come from the read replica (`DATABASE_REPLICA_URL`), and the router that sends
them there.

A streaming replica replays the primary's writes a moment after they commit: an agent reading
right after its own write would often not see it there. So nothing reads from the replica unless
the code around it says a slightly older answer is fine (`replica_reads()`: the dashboard's lists
and pages, the playground, the export), and even then only this app's own tables (sessions, users
and permissions stay on the primary: a login must be seen by the page it redirects to) and never
inside a transaction on the primary (a write's own reads: client-id lookups, get-or-create, key
checks). Every write, every migration and every other read goes to the primary.

A replica that cannot be reached is skipped for a few seconds and its reads go to the primary:
the pages stay up, only the load moves back.

Read-your-writes across requests: after a write (any POST, PUT, PATCH or DELETE) the response
carries the primary's WAL position in `X-Agentmemory-LSN` (and, for the dashboard, a cookie). A
request that sends it back reads from the replica only once the replica has replayed that far,
from the primary until then (memory_app/middleware.py). A curator who prunes a message and is
sent to the page sees it pruned.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

REPLICA = "replica"
LSN_HEADER = "X-Agentmemory-LSN"
LSN_COOKIE = "agentmemory_lsn"
# A PostgreSQL WAL position as pg_current_wal_lsn() writes it.
LSN_FORMAT = re.compile(r"[0-9A-F]{1,8}/[0-9A-F]{1,8}", re.IGNORECASE)
# How long reads stay on the primary after the replica failed to answer a connection.
RETRY_SECONDS = 5.0

log = logging.getLogger(__name__)
_stale_ok: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "agentmemory_replica_reads", default=False
)
# When the replica may be tried again (time.monotonic()); 0 while it answers.
_down_until = 0.0


@dataclass
class Position:
    """A WAL position the client has seen written; whether the replica has replayed it is
    asked once per request (then every read of the request agrees)."""

    lsn: str
    replayed: bool | None = None


_after: contextvars.ContextVar[Position | None] = contextvars.ContextVar(
    "agentmemory_replica_after", default=None
)


@contextlib.contextmanager
def reads_after(position: Position | None) -> Iterator[None]:
    """Inside the block, the replica serves reads only once it has replayed `position`."""
    token = _after.set(position)
    try:
        yield
    finally:
        _after.reset(token)


def written_position() -> str | None:
    """The primary's WAL position now (after this request's commits), None when it cannot say."""
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_lsn()::text")
            return cursor.fetchone()[0]
    except DatabaseError:
        return None


def _replayed(position: Position) -> bool:
    if position.replayed is None:
        try:
            with connections[REPLICA].cursor() as cursor:
                cursor.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [position.lsn])
                # NULL when the server is no longer a replica: the primary then.
                position.replayed = bool(cursor.fetchone()[0])
        except DatabaseError:
            position.replayed = False
    return position.replayed


@contextlib.contextmanager
def replica_reads() -> Iterator[None]:
    """Inside the block, reads of this app's tables may come from the replica (a few moments
    behind the primary), when one is configured and reachable."""
    token = _stale_ok.set(True)
    try:
        yield
    finally:
        _stale_ok.reset(token)


def replica_stream(items: Iterable) -> Iterator:
    """`items` (a generator that reads the database as it goes, such as a streamed export),
    each step read under `replica_reads()` and the position of the request that made it: a
    stream runs after its view, and the request's middleware, have returned."""
    return _stream(iter(items), _after.get())


def _stream(iterator: Iterator, position: Position | None) -> Iterator:
    while True:
        with replica_reads(), reads_after(position):
            try:
                item = next(iterator)
            except StopIteration:
                return
        yield item


def configured() -> bool:
    return REPLICA in connections.settings


def forget_failure() -> None:
    """Try the replica again at the next read (after it was found down)."""
    global _down_until
    _down_until = 0.0


def _reachable() -> bool:
    """The replica answers a connection (the one this thread holds, checked once per request as
    Django checks the primary's, or a new one); when it does not, it is skipped for
    RETRY_SECONDS."""
    global _down_until
    if time.monotonic() < _down_until:
        return False
    wrapper = connections[REPLICA]
    try:
        wrapper.close_if_health_check_failed()
        wrapper.ensure_connection()
    except DatabaseError as exc:
        _down_until = time.monotonic() + RETRY_SECONDS
        log.warning("the read replica is unavailable, reading from the primary: %s", exc)
        return False
    return True


def use_replica(model) -> bool:
    return (
        _stale_ok.get()
        and model._meta.app_label == "memory_app"
        and configured()
        and not connections[DEFAULT_DB_ALIAS].in_atomic_block
        and _reachable()
        and (_after.get() is None or _replayed(_after.get()))
    )


class ReplicaRouter:
    """DATABASE_ROUTERS' entry when a replica is configured (agentmemory_site/settings.py)."""

    def db_for_read(self, model, **hints):
        # The primary by name, not None: Django would otherwise follow an instance's own
        # database, and an object read from the replica would draw a write's reads there.
        return REPLICA if use_replica(model) else DEFAULT_DB_ALIAS

    def db_for_write(self, model, **hints):
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1, obj2, **hints):
        return True  # one database, two copies of it

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        return db == DEFAULT_DB_ALIAS
