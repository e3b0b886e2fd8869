"""`benchmark --only citus`: the same dataset on the single node and on a Citus cluster (a
coordinator and two workers on this machine), both open in one process, measured turn about.

The single node is the benchmark's own database on the embedded server; the cluster is started
from a Citus build (`scripts/citus_cluster.py`, its functions called here) or given by the URL of
a coordinator whose database is empty. Both are migrated and loaded alike (`bench.load.build`,
the same sizes and seed: the same rows); the cluster's tables are then distributed by
`manage.py distribute`, as an operator turns a single-node store into a cluster's.

Two Django connections stay open, one per side, and `connections["default"]` is pointed at one
or the other before each call: everything the request runs (ORM, raw cursors, the WSGI test
client) goes to that side, and neither pays a reconnect. The few per-process caches that hold
what a database is like (whether a table is distributed, the store's size, registered models)
are swapped with it. `bench.citus_rows` measures and reports.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dj_database_url
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.db.utils import load_backend
from django.test import Client

from memory_app.bench import database
from memory_app.bench.dataset import Dataset, Sizes
from memory_app.bench.harness import BenchError

DEFAULT_TREE = "var/citus-pg"
WORKERS = 2
SHARDS = 32


def sizes(*, quick: bool, **overrides: int) -> Sizes:
    """One context of 50,000 messages (half the store) and 3,000 others, a few large and a long
    tail of small ones, every message with a 384-d vector; a few runs (steps are not measured)."""
    base = (
        Sizes(messages=2_000, largest=1_000, contexts=20, runs=4, max_steps=20, transcript_steps=10)
        if quick
        else Sizes(
            messages=100_000,
            largest=50_000,
            contexts=3_000,
            runs=100,
            max_steps=100,
            transcript_steps=50,
        )
    )
    return Sizes(**{**base.as_dict(), **overrides})


# The per-process caches of what the database is like (whether a table is distributed, the
# store's size, registered models, the model indexes built): swapped with the connection.
def _caches() -> tuple[dict | set, ...]:
    from memory_app import scale_out
    from memory_app.embeddings import indexer, registry
    from memory_app.search import semantic

    return (scale_out._distributed, semantic._store_sizes, registry._registered, indexer._ensured)


@dataclass
class Side:
    name: str
    wrapper: object
    client: Client | None = None
    saved: list[dict | set] = field(default_factory=lambda: [type(c)() for c in _caches()])


@dataclass
class Pair:
    single: Side
    cluster: Side
    active: Side | None = None

    def use(self, side: Side) -> None:
        """Point the default connection (and the caches that go with it) at `side`."""
        if self.active is side:
            return
        caches = _caches()
        if self.active is not None:
            for cache, saved in zip(caches, self.active.saved, strict=True):
                saved.clear()
                saved.update(cache)
        for cache, saved in zip(caches, side.saved, strict=True):
            cache.clear()
            cache.update(saved)
        connections["default"] = side.wrapper
        self.active = side

    def sides(self) -> tuple[Side, Side]:
        return self.single, self.cluster


def cluster_script():
    """scripts/citus_cluster.py as a module: its start, url and stop."""
    path = Path(settings.BASE_DIR) / "scripts" / "citus_cluster.py"
    if not path.exists():
        raise BenchError(f"{path} is missing: the citus area runs from a checkout of the project")
    spec = importlib.util.spec_from_file_location("citus_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Cluster:
    """Where the coordinator is, and how to stop it when this run started it."""

    url: str
    host: str = ""
    port: int = 0
    stop: Callable[[], None] | None = None
    description: str = ""


def start_cluster(tree: Path, data: Path, db_name: str, log: Callable[[str], None]) -> Cluster:
    """A fresh coordinator and workers from the build in `tree`, their data under `data`."""
    from agentmemory_site.embedded_db import server_settings

    if not (tree / "lib" / "postgresql" / "citus.so").exists():
        raise BenchError(
            f"no Citus build in {tree}: scripts/build_citus.sh SOURCE_DIR {tree} makes one"
        )
    script = cluster_script()
    if (data / "ports").exists():
        # A cluster an earlier run left behind: stopped where it still runs, then wiped.
        try:
            script.stop(data)
        except (SystemExit, subprocess.CalledProcessError):
            pass
    shutil.rmtree(data, ignore_errors=True)
    log(f"starting a Citus coordinator and {WORKERS} workers from {tree} in {data}")
    # Each node gets the memory settings the embedded server gives itself, as each machine of a
    # real cluster would; only the pages a node touches take memory.
    url = _quiet(lambda: script.start(tree, data, db_name, WORKERS, server_settings()))
    ports = json.loads((data / "ports").read_text())["ports"]
    version = script.run(str(tree / "bin" / "postgres"), "--version").strip()
    return Cluster(
        url=url,
        # The coordinator's own socket: the single node is reached over a socket too.
        host=str(data / "coordinator"),
        port=ports["coordinator"],
        stop=lambda: _quiet(lambda: script.stop(data)),
        description=f"coordinator + {WORKERS} workers started from `{tree}` ({version})",
    )


def _quiet(fn: Callable[[], object]):
    """The script says what failed by SystemExit (it is a command line tool)."""
    try:
        return fn()
    except (SystemExit, subprocess.CalledProcessError) as exc:
        raise BenchError(f"the Citus cluster script failed: {exc}") from exc


def wrapper_for(cluster: Cluster):
    """A second connection to the coordinator, connected as the site's own is."""
    db = dj_database_url.parse(cluster.url, conn_max_age=600, conn_health_checks=True)
    if cluster.host:
        db["HOST"], db["PORT"] = cluster.host, cluster.port
    db.setdefault("OPTIONS", {})["connect_timeout"] = settings.DB_CONNECT_TIMEOUT
    db = connections.configure_settings({"default": db})["default"]
    return load_backend(db["ENGINE"]).DatabaseWrapper(db, "default")


def prepare(
    *,
    db_name: str,
    data_sizes: Sizes,
    cluster: Cluster,
    log: Callable[[str], None],
    build: Callable[[Sizes], Dataset],
) -> tuple[Pair, Dataset]:
    """Both sides migrated and loaded with the same rows (`build` loads the current database);
    the cluster's tables distributed."""
    database.switch_to(db_name)
    database.recreate_database(db_name)
    log(f"single node: database {db_name} on the embedded server")
    database.migrate()
    pair = Pair(Side("single node", connections["default"]), Side("cluster", wrapper_for(cluster)))
    pair.use(pair.single)
    data = build(data_sizes)
    pair.use(pair.cluster)
    _refuse_a_used_database()
    log("cluster: migrate, load the same dataset, distribute")
    database.migrate()
    build(data_sizes)
    call_command("distribute", "--shard-count", str(SHARDS), stdout=_Sink(log))
    # Filled while the tables were still local: what they are now is asked again.
    for cache in _caches():
        cache.clear()
    from django.db import connection

    with connection.cursor() as cursor:
        for table in _distributed_tables(cursor):
            cursor.execute(f"VACUUM ANALYZE {table}")
    return pair, data


def _refuse_a_used_database() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('memory_app_context') IS NOT NULL")
        if cursor.fetchone()[0]:
            raise BenchError(
                "the coordinator's database already holds the store's tables: the citus area "
                "needs an empty database (citus and vector extensions, workers added)"
            )


def _distributed_tables(cursor) -> list[str]:
    cursor.execute("SELECT logicalrelid::regclass::text FROM pg_dist_partition ORDER BY 1")
    return [row[0] for row in cursor.fetchall()]


class _Sink:
    """What `distribute` prints, into the benchmark's log."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log

    def write(self, text: str) -> None:
        if text.strip():
            self.log("  " + text.rstrip())

    def flush(self) -> None:
        pass


def close(pair: Pair | None, single_wrapper) -> None:
    """The default connection back on the single node, the cluster's closed."""
    if pair is not None:
        pair.use(pair.single)
        pair.cluster.wrapper.close()
    connections["default"] = single_wrapper
    single_wrapper.close()
