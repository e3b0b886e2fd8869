"""The embedded PostgreSQL 16 + pgvector server used when no DATABASE_URL is set.

`pgserver` starts the server on first use (or attaches to one already running on the same data
folder) and keeps a list of the processes holding it; the server stops when the last of them
exits. Web workers, management commands and the test runner can therefore share one server.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

DATABASE_NAME = "agentmemory"


def embedded_database_url(data_dir: Path) -> str:
    """Start or attach to the embedded server under `data_dir` and return the URL of the
    `agentmemory` database on it (created on first use)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    # pgserver keeps its lock file under the user runtime dir; warn-free default when unset.
    os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir / "run"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        forget_dead_holders(server_class(), data_dir / "pgdata")
        server = pgserver.get_server(data_dir / "pgdata", cleanup_mode="stop")
    _ensure_database(server.get_uri("postgres"))
    return server.get_uri(DATABASE_NAME)


def server_class():
    """The embedded server package's server class (its lock guards the list of holders)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    return pgserver.PostgresServer


def forget_dead_holders(server_cls, pgdata: Path) -> list[int]:
    """Drop processes that no longer exist from the server's list of holders; returns them.

    The server stops when the last holder exits normally. A holder killed without running its
    exit handlers (SIGKILL, an OOM kill, a crash) stays on the list, and the server would then
    never stop again: every later run would see "another holder" and leave it running.
    """
    import json

    import psutil

    handles = pgdata / ".handle_pids.json"
    with server_cls._lock:  # the package's own inter-process lock around its list
        try:
            pids = json.loads(handles.read_text() or "[]")
        except (FileNotFoundError, ValueError):
            return []
        dead = [pid for pid in pids if not psutil.pid_exists(pid)]
        if dead:
            handles.write_text(json.dumps([pid for pid in pids if pid not in dead]))
    return dead


def _ensure_database(admin_url: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
        if not exists:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))
            except psycopg.errors.DuplicateDatabase:
                pass  # another process created it between our check and our CREATE
