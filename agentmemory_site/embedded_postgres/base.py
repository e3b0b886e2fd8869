"""Django's PostgreSQL backend, for the embedded server the settings name when no DATABASE_URL is
set: a process starts the server, or attaches to the one already running on its data folder,
when it first connects (agentmemory_site/embedded_db.py).

The start hangs on the connection, not on the settings or on a list of commands: loading the
settings starts nothing, and whatever reaches the database (any management command, a web worker,
a script, the test session, `dbshell`) finds the server running, new commands included. The
process that started or attached holds the server until it exits (`manage.py serve` holds it for
the site's whole life); a process forked after that, such as a gunicorn worker under --preload,
shares its parent's hold.

A connection that fails because the server is gone (kill -9, a crash) starts it again, in the
background, in one of the processes holding it (`revive_in_background`); the request that
noticed answers its 503 meanwhile.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from django.db.backends.postgresql import client

from agentmemory_site import embedded_db
from agentmemory_site.pooled_postgres import base

# The socket directory of each data folder this process holds (started or attached): every
# later connection, from any thread, goes straight to it.
_held: dict[Path, str] = {}
_lock = threading.Lock()
# Held while this process's revival thread runs: one at a time per process.
_reviving = threading.Lock()
log = logging.getLogger(__name__)


def ensure_server(settings_dict: dict) -> str:
    """Start or attach to the embedded server of `settings_dict` (its EMBEDDED_DATA_DIR) once per
    process; returns the server's socket directory, also written to the dict's HOST (the running
    server's word over the one the settings computed)."""
    data_dir = Path(settings_dict["EMBEDDED_DATA_DIR"])
    host = _held.get(data_dir)
    if host is None:
        with _lock:  # a pool's threads may all connect at once
            host = _held.get(data_dir)
            if host is None:
                url = embedded_db.start_embedded_server(data_dir)
                host = _held[data_dir] = parse_qs(urlsplit(url).query)["host"][0]
    settings_dict["HOST"] = host
    return host


def revive_in_background(settings_dict: dict) -> None:
    """After a failed connection: when the server this process holds is gone, start it again in
    a thread of its own, so the request that noticed answers its 503 without waiting for it."""
    data_dir = Path(settings_dict["EMBEDDED_DATA_DIR"])
    if data_dir not in _held or not _reviving.acquire(blocking=False):
        return
    threading.Thread(
        target=_revive, args=(data_dir,), name="agentmemory-db-revive", daemon=True
    ).start()


def _revive(data_dir: Path) -> None:
    try:
        embedded_db.revive_server(data_dir)
    except Exception:
        # Still down (its old processes may hold its shared memory a moment longer): the next
        # failed connection tries again.
        log.exception("starting the embedded PostgreSQL again failed")
    finally:
        _reviving.release()


def start_embedded_database(using: str = "default") -> None:
    """Start the embedded server now when `using` is the embedded database (nothing otherwise):
    for entry points that serve it (asgi.py, wsgi.py: a gunicorn master under --preload then
    holds it for its workers) and for the test session, whose helpers reach it without Django."""
    from django.db import connections

    wrapper = connections[using]
    if isinstance(wrapper, DatabaseWrapper):
        ensure_server(wrapper.settings_dict)


class DatabaseClient(client.DatabaseClient):
    def runshell(self, parameters):
        ensure_server(self.connection.settings_dict)  # `dbshell` runs psql, not a connection
        super().runshell(parameters)


class DatabaseWrapper(base.DatabaseWrapper):
    client_class = DatabaseClient

    def get_connection_params(self):
        # Called before every new connection and when a pool is made: the one place to start.
        ensure_server(self.settings_dict)
        return super().get_connection_params()

    def get_new_connection(self, conn_params):
        try:
            return super().get_new_connection(conn_params)
        except self.Database.OperationalError:  # refused, timed out, or no pooled connection
            revive_in_background(self.settings_dict)
            raise
