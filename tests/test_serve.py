"""`manage.py serve` (what `make run` runs): set up, serve with gunicorn, stop cleanly, keep
data."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _start(
    data_dir: Path, port: int, *args: str, **extra_env: str
) -> tuple[subprocess.Popen, float]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "AGENTMEMORY_OPERATOR_PASSWORD"}
    }
    env |= {
        "AGENTMEMORY_DATA_DIR": str(data_dir),
        "AGENTMEMORY_WORKERS": "2",
        "PYTHONUNBUFFERED": "1",
    } | extra_env
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    return proc, started


def _wait_for_login(port: int, started: float, proc: subprocess.Popen, within: float = 60) -> float:
    while time.monotonic() - started < within:
        if _status(f"http://127.0.0.1:{port}/accounts/login/") == 200:
            return time.monotonic() - started
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.3)
    raise AssertionError(f"login page not served within {within:.0f} s")


def _stop(proc: subprocess.Popen) -> str:
    # Ctrl-C in a terminal signals the whole foreground process group.
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    return out


def _postgres_running(data_dir: Path) -> bool:
    for p in psutil.process_iter(attrs=["name", "cmdline"]):
        if p.info["name"] == "postgres" and any(
            str(data_dir) in part for part in p.info["cmdline"] or []
        ):
            return True
    return False


@pytest.mark.slow
def _reuse_after_idle(port: int, *, idle: float) -> None:
    """A pooled client's connection, idle longer than the server's old keep-alive (2 s), is
    still open when the client reuses it (a closed one answers RemoteDisconnected)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        first.read()
        sock = conn.sock
        time.sleep(idle)  # the idle time itself is what is tested
        conn.request("GET", "/healthz")
        second = conn.getresponse()
        second.read()
        assert (first.status, second.status) == (200, 200)
        assert conn.sock is sock
    finally:
        conn.close()


def test_serve_starts_fast_stops_cleanly_and_keeps_data(tmp_path):
    data_dir = tmp_path / "var"
    os.chmod(tmp_path, 0o755)
    port = _free_port()

    proc, started = _start(data_dir, port)
    elapsed = _wait_for_login(port, started, proc)
    assert elapsed < 60
    assert _status(f"http://127.0.0.1:{port}/admin/login/") == 200
    assert _status(f"http://127.0.0.1:{port}/healthz") == 200
    # The MCP server is served with the site (ASGI): it asks for a key.
    assert _status(f"http://127.0.0.1:{port}/mcp") == 401
    _reuse_after_idle(port, idle=3.0)
    first_output = _stop(proc)
    assert "gunicorn" in first_output.lower()
    password = re.search(r"operator login: operator / (\S+)", first_output)
    assert password, first_output
    assert "demo data loaded" in first_output
    assert not _postgres_running(data_dir), "Ctrl-C must stop the embedded database"

    proc, started = _start(data_dir, port)
    _wait_for_login(port, started, proc)
    second_output = _stop(proc)
    assert "demo data loaded" not in second_output
    assert "existing account" in second_output
    assert not _postgres_running(data_dir)


def _holders(data_dir: Path) -> list[int]:
    import json

    lists = list(data_dir.rglob(".handle_pids.json"))
    return [pid for path in lists for pid in json.loads(path.read_text() or "[]")]


def _dead_pid() -> int:
    probe = subprocess.Popen(["true"])
    probe.wait()
    assert not psutil.pid_exists(probe.pid)
    return probe.pid


@pytest.mark.slow
def test_serve_stops_the_database_on_sigterm_and_sighup_and_survives_stale_holders(tmp_path):
    data_dir = tmp_path / "var"
    os.chmod(tmp_path, 0o755)
    port = _free_port()

    # SIGTERM to the whole process group (what `kill -- -PGID`, systemd or a container stop do).
    proc, started = _start(data_dir, port)
    _wait_for_login(port, started, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert "SIGTERM" in out, out
    assert not _postgres_running(data_dir), "SIGTERM must stop the embedded database"
    assert _holders(data_dir) == [], "no stale holder may be left behind"

    # A holder that died without its exit handlers (SIGKILL) must not keep the database up
    # forever; and SIGHUP to the serve process alone stops gunicorn and the database.
    stale = _dead_pid()
    (holders_file,) = data_dir.rglob(".handle_pids.json")
    holders_file.write_text(f"[{stale}]")
    proc, started = _start(data_dir, port)
    _wait_for_login(port, started, proc)
    os.kill(proc.pid, signal.SIGHUP)
    out, _ = proc.communicate(timeout=60)
    assert "SIGHUP" in out, out
    assert _status(f"http://127.0.0.1:{port}/healthz") is None, "gunicorn must be gone"
    assert not _postgres_running(data_dir), "a stale holder must not keep the database running"
    assert stale not in _holders(data_dir)


@pytest.mark.slow
def test_serve_on_a_busy_port_says_so_and_stops_the_database(tmp_path):
    data_dir = tmp_path / "var"
    os.chmod(tmp_path, 0o755)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, _ = _start(data_dir, port)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert f"port {port} on 127.0.0.1 is already in use" in out, out
    assert "serving on" not in out
    assert not _postgres_running(data_dir)


def test_a_second_serve_on_the_same_data_folder_says_so_and_leaves_the_first_serving(tmp_path):
    data_dir = tmp_path / "var"
    os.chmod(tmp_path, 0o755)
    port = _free_port()
    first, started = _start(data_dir, port)
    try:
        _wait_for_login(port, started, first)
        second, _ = _start(data_dir, _free_port())
        out, _ = second.communicate(timeout=120)
        assert second.returncode != 0
        assert f"is already serving the data folder {data_dir}" in out, out
        assert f"pid {first.pid}" in out
        assert "serving on" not in out
        # The first one was not disturbed: its database still answers.
        assert _status(f"http://127.0.0.1:{port}/healthz") == 200
    finally:
        _stop(first)
    assert not _postgres_running(data_dir)


def _health(port: int) -> dict:
    import json

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_a_worker_loads_the_local_model_as_it_starts_without_waiting_for_a_search(tmp_path):
    data_dir = tmp_path / "var"
    os.chmod(tmp_path, 0o755)
    port = _free_port()
    # No demo data: serve itself would load the model to embed it, before gunicorn starts.
    proc, started = _start(
        data_dir, port, "--no-demo", AGENTMEMORY_WORKERS="1", AGENTMEMORY_EMBEDDING_PROVIDER="local"
    )
    try:
        # Serving does not wait for the model (its import alone takes seconds). The start's
        # own speed is test_serve_starts_fast_stops_cleanly_and_keeps_data's to check.
        _wait_for_login(port, started, proc, within=180)
        assert _health(port)["embedding_model"] in ("loading", "ready")
        # No search has been made: the worker loads it on its own.
        deadline = time.monotonic() + 180
        while (state := _health(port)["embedding_model"]) != "ready":
            assert state == "loading", state
            assert time.monotonic() < deadline, "the model was not loaded within 180 s"
            time.sleep(0.5)
    finally:
        out = _stop(proc)
    assert "could not be loaded" not in out, out
