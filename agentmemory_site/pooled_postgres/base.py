"""Django's PostgreSQL backend for a server named by DATABASE_URL, and the base of the embedded
server's (`embedded_postgres`): with the connection pool on (under ASGI, settings.py), the pool
checks a connection it hands out with `db_pool.check_connection` (a deadline, and no round trip
for one that has just served a request) instead of psycopg_pool's own, and each connection
notes when it goes back to the pool. Timestamps are parsed by psycopg's C loader
(`db_pool.adapters_with_c_timestamps`), not by the pure-Python one Django's loader extends.
"""

from __future__ import annotations

from django.db.backends.postgresql import base

from agentmemory_site import db_pool


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self):
        params = super().get_connection_params()
        if "context" in params:
            params["context"] = db_pool.adapters_with_c_timestamps(params["context"])
        return params

    @property
    def pool(self):
        pool = super().pool
        if pool is not None and pool._check is not None:
            # Django hands psycopg_pool its own check, which waits on a stalled server for as
            # long as it stays stalled; this one gives up within a second.
            pool._check = db_pool.check_connection
        return pool

    def _close(self):
        if self.connection is not None and self.pool:
            db_pool.mark_idle(self.connection)
        return super()._close()
