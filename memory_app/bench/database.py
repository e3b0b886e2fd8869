"""The benchmark's own database on the same server: created, migrated, switched to.

The switch happens in-process, before any query of the command: the default connection is closed
and its NAME changed, so everything afterwards (ORM, raw cursors, the WSGI test client) runs
against the benchmark database and nothing can touch the operator's data.
"""

from __future__ import annotations

import psycopg
from django.core.management import call_command
from django.db import connection, connections
from psycopg import sql


class BenchDatabaseError(Exception):
    pass


def _admin_conninfo(settings_dict: dict) -> dict:
    # The backend's own parameters first: the embedded backend starts (or attaches to) its server
    # there and writes the socket directory into the settings.
    connections["default"].get_connection_params()
    settings_dict = {**settings_dict, "HOST": connections["default"].settings_dict["HOST"]}
    info = {
        "dbname": "postgres",
        "user": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        "host": settings_dict.get("HOST") or None,
        "port": settings_dict.get("PORT") or None,
        "connect_timeout": 10,
    }
    return {k: v for k, v in info.items() if v is not None}


def database_exists(name: str) -> bool:
    settings_dict = connections["default"].settings_dict
    with psycopg.connect(**_admin_conninfo(settings_dict), autocommit=True) as conn:
        return (
            conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            is not None
        )


def recreate_database(name: str) -> None:
    """Drop (forcing other sessions off) and create `name` empty."""
    settings_dict = connections["default"].settings_dict
    with psycopg.connect(**_admin_conninfo(settings_dict), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(name: str) -> None:
    settings_dict = connections["default"].settings_dict
    with psycopg.connect(**_admin_conninfo(settings_dict), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def switch_to(name: str) -> str:
    """Point the default connection at `name`; returns the previous name."""
    conn = connections["default"]
    previous = conn.settings_dict["NAME"]
    if name == previous:
        raise BenchDatabaseError(
            f"the benchmark database must not be the site's own database ({previous!r})"
        )
    conn.close()
    conn.settings_dict["NAME"] = name
    return previous


def migrate() -> None:
    call_command("migrate", verbosity=0, interactive=False)


def server_info(name: str) -> dict[str, str]:
    settings_dict = {**connections["default"].settings_dict}
    info = _admin_conninfo(settings_dict)
    info["dbname"] = name
    with psycopg.connect(**info) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        row = conn.execute(
            "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()
    return {"server": server, "pgvector": row[0] if row else "absent"}


def conninfo() -> dict:
    """psycopg connection arguments for the database the default connection points at."""
    settings_dict = connections["default"].settings_dict
    return {**_admin_conninfo(settings_dict), "dbname": settings_dict["NAME"]}


def stored_meta(table: str) -> str | None:
    """The JSON a finished build left in its one-row `table` (as text), or None: no build
    finished in this database."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [table])
        if cursor.fetchone()[0] is None:
            return None
        cursor.execute(sql.SQL("SELECT data::text FROM {} LIMIT 1").format(sql.Identifier(table)))
        row = cursor.fetchone()
    return row[0] if row else None
