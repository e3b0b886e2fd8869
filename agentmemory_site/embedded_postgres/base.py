"""Django's PostgreSQL backend, for the embedded server the settings name when no DATABASE_URL is
set: a process starts the server, or attaches to the one already running on its data folder,
when it first connects (agentmemory_site/embedded_db.py).

The start hangs on the connection, not on the settings or on a list of commands: loading the
settings starts nothing, and whatever reaches the database (any management command, a web worker,
a script, the test session, `dbshell`) finds the server running, new commands included. The
process that started or attached holds the server until it exits (`manage.py serve` holds it for
the site's whole life); a process forked after that, such as a gunicorn worker under --preload,
shares its parent's hold.
"""

from __future__ import annotations

import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from django.db.backends.postgresql import base, client

from agentmemory_site import embedded_db

# The socket directory of each data folder this process holds (started or attached): every
# later connection, from any thread, goes straight to it.
_held: dict[Path, str] = {}
_lock = threading.Lock()


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
