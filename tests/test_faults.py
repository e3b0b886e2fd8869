"""Database faults under a real `manage.py serve` and its embedded PostgreSQL: stalled (SIGSTOP)
and killed (kill -9) under write load, every answer is a success or a 503 with Retry-After,
never a 500; the server starts PostgreSQL again by itself; no acknowledged write is lost. And the
processes around it: a killed gunicorn master leaves no worker on the port, the embed worker
rides out an outage, SIGINT stops everything promptly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
from django.db import connection

from tests.api_helpers import make_key, new_context
from tests.builders import register_models
from tests.test_serve import _free_port, _postgres_running

ROOT = Path(__file__).resolve().parent.parent
CONNECT_TIMEOUT = 3
# What a 503 may take: the connect (or pool) timeout, plus the second the issue allows, plus
# slack for a loaded two-core test machine.
UNAVAILABLE_WITHIN = CONNECT_TIMEOUT + 1 + 1.5
PASSWORD = "fault-test-Operator-9"

pytestmark = pytest.mark.slow


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return (
        env
        | extra
        | {
            "AGENTMEMORY_DATA_DIR": str(data_dir),
            "AGENTMEMORY_WORKERS": extra.get("AGENTMEMORY_WORKERS", "2"),
            "AGENTMEMORY_DB_CONNECT_TIMEOUT": extra.get(
                "AGENTMEMORY_DB_CONNECT_TIMEOUT", str(CONNECT_TIMEOUT)
            ),
            "AGENTMEMORY_OPERATOR_PASSWORD": PASSWORD,
            "PYTHONUNBUFFERED": "1",
        }
    )


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout} s")


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Serve:
    """`manage.py serve` on its own data folder and port, its output collected."""

    def __init__(self, data_dir: Path, port: int | None = None, **env: str):
        self.data_dir, self.port = data_dir, port or _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(self.port), "--no-demo"],
            cwd=ROOT,
            env=_env(data_dir, **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        _wait(lambda: _healthy(self.port) or self.proc.poll() is not None, 90, "serve up")
        assert self.proc.poll() is None, self.output

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _postmaster_lines(self) -> list[str]:
        # PostgreSQL's postmaster.pid: its pid, data folder, start time, port, socket folder...
        return (self.data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()

    def database(self) -> psycopg.Connection:
        """A connection of the test's own to the embedded server this `serve` runs."""
        lines = self._postmaster_lines()
        return psycopg.connect(
            host=lines[4], port=int(lines[3]), user="postgres", dbname="agentmemory"
        )

    def postmaster(self) -> psutil.Process:
        pid = int(self._postmaster_lines()[0])
        return psutil.Process(pid)

    def command(self, *args: str) -> str:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=_env(self.data_dir),
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    def stop(self) -> float:
        started = time.monotonic()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C in a terminal
        self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        return time.monotonic() - started


@pytest.fixture
def serve(tmp_path):
    server = Serve(tmp_path / "data")
    yield server
    server.stop()


def _secret(serve: Serve) -> str:
    return serve.command("apikey", "create", "faults").strip().splitlines()[-1]


def _dashboard_session(serve: Serve) -> httpx.Client:
    client = httpx.Client(base_url=serve.url, timeout=30)
    page = client.get("/accounts/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    answer = client.post(
        "/accounts/login/",
        data={"username": "operator", "password": PASSWORD, "csrfmiddlewaretoken": token},
    )
    assert answer.status_code == 302, answer.text
    assert client.get("/").status_code == 200
    return client


class Writers:
    """Threads appending messages with client ids as fast as answers come; a 503 is retried
    with the same client id, as the Python client does."""

    def __init__(self, serve: Serve, secret: str, context_id: int, count: int = 6):
        self.url = f"{serve.url}/api/v1/contexts/{context_id}/messages"
        self.headers = {"Authorization": f"Bearer {secret}"}
        self.stop = threading.Event()
        self.answers: list[tuple[int | str, float, str | None]] = []
        self.acknowledged: set[str] = set()
        self.threads = [threading.Thread(target=self._write, args=(i,)) for i in range(count)]
        for thread in self.threads:
            thread.start()

    def _write(self, writer: int) -> None:
        n = 0
        with httpx.Client(headers=self.headers, timeout=60) as client:
            while not self.stop.is_set():
                client_id = f"w{writer}-{n}"
                started = time.monotonic()
                try:
                    answer = client.post(
                        self.url, json={"role": "user", "text": client_id, "client_id": client_id}
                    )
                except httpx.HTTPError as exc:
                    self.answers.append((type(exc).__name__, time.monotonic() - started, None))
                    continue
                elapsed = time.monotonic() - started
                self.answers.append(
                    (answer.status_code, elapsed, answer.headers.get("Retry-After"))
                )
                if answer.status_code in (200, 201):
                    self.acknowledged.add(client_id)
                    n += 1
                elif answer.status_code == 503:
                    time.sleep(0.2)

    def count(self, status) -> int:
        return sum(1 for answer in self.answers if answer[0] == status)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)


def _probe_surfaces(serve: Serve, secret: str, dashboard: httpx.Client) -> dict:
    """One REST, OTLP, MCP and dashboard request at once: name -> (status, seconds, headers,
    body)."""
    auth = {"Authorization": f"Bearer {secret}"}
    calls = {
        "rest": lambda c: c.get(f"{serve.url}/api/v1/contexts", headers=auth),
        "otlp": lambda c: c.post(
            f"{serve.url}/v1/traces", json={"resourceSpans": []}, headers=auth
        ),
        "mcp": lambda c: c.post(
            f"{serve.url}/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "open_context", "arguments": {"keys": {"probe": "mcp"}}},
            },
            headers=auth | {"Accept": "application/json, text/event-stream"},
        ),
    }
    results = {}

    def run(name, call):
        started = time.monotonic()
        if name == "dashboard":
            answer = dashboard.get("/")
        else:
            with httpx.Client(timeout=60) as client:
                answer = call(client)
        results[name] = (answer.status_code, time.monotonic() - started, answer.headers, answer)

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    threads.append(threading.Thread(target=run, args=("dashboard", None)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    return results


def _stored_client_ids(serve: Serve, secret: str, context_id: int) -> set[str]:
    stored, after = set(), 0
    with httpx.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=30) as client:
        while True:
            page = client.get(
                f"{serve.url}/api/v1/contexts/{context_id}/messages",
                params={"after": after, "limit": 500},
            ).json()
            items = page["items"]
            if not items:
                return stored
            stored |= {item["client_id"] for item in items}
            after = items[-1]["seq"]


def test_stalled_and_killed_postgres_answer_503_then_heal_with_no_acknowledged_write_lost(
    serve,
):
    secret = _secret(serve)
    context = httpx.post(
        f"{serve.url}/api/v1/contexts",
        json={"keys": {"test": "faults"}},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    ).json()
    dashboard = _dashboard_session(serve)
    writers = Writers(serve, secret, context["id"])
    try:
        _wait(lambda: len(writers.acknowledged) >= 20, 30, "writes before the faults")

        # Stalled: the postmaster and every backend frozen. In-flight requests wait for it; a
        # new request gives up on its pooled connection and answers 503.
        postmaster = serve.postmaster()
        frozen = [postmaster, *postmaster.children()]
        for process in frozen:
            process.suspend()
        try:
            time.sleep(0.5)
            stalled = _probe_surfaces(serve, secret, dashboard)
        finally:
            for process in frozen:
                process.resume()
        _wait(lambda: _healthy(serve.port), 30, "health after the stall")

        # Killed: the server starts PostgreSQL again by itself.
        acknowledged_before_kill = len(writers.acknowledged)
        postmaster.kill()
        _wait(lambda: writers.count(503) and True, 30, "a 503 after the kill")
        _wait(lambda: _healthy(serve.port), 60, "health after the kill")
        _wait(
            lambda: len(writers.acknowledged) >= acknowledged_before_kill + 20,
            30,
            "writes after the restart",
        )
        assert serve.postmaster().pid != postmaster.pid
    finally:
        writers.finish()

    for name, (status, seconds, headers, answer) in stalled.items():
        assert status == 503, (name, status, answer.text[:300])
        assert headers["Retry-After"] == "2", name
        assert seconds < UNAVAILABLE_WITHIN, (name, seconds)
    assert stalled["rest"][3].json() == {
        "detail": "the database is unavailable right now; retry shortly"
    }
    assert stalled["otlp"][3].json()["code"] == 14  # google.rpc UNAVAILABLE
    assert stalled["mcp"][3].json()["error"]["code"] == -32603
    assert "The database is unavailable" in stalled["dashboard"][3].text

    statuses = {answer[0] for answer in writers.answers}
    assert statuses <= {200, 201, 503}, statuses
    unavailable = [answer for answer in writers.answers if answer[0] == 503]
    assert unavailable and all(retry == "2" for _, _, retry in unavailable)
    assert max(seconds for _, seconds, _ in unavailable) < UNAVAILABLE_WITHIN
    stored = _stored_client_ids(serve, secret, context["id"])
    assert writers.acknowledged and writers.acknowledged <= stored
    assert "starting it again" in serve.output and "running again" in serve.output

    # The restarted PostgreSQL is the one serve stops, promptly, with no false alarm.
    assert serve.stop() < 5, serve.output
    assert serve.proc.returncode == 0, serve.output
    assert "Perhaps out of memory" not in serve.output
    assert not _postgres_running(serve.data_dir)


def test_an_exhausted_pool_answers_503_and_loses_no_acknowledged_batch(tmp_path):
    """More concurrent 1,000-message batches than pooled connections: a request that waits
    longer than the pool timeout for one answers 503 (retried with the same client ids, as the
    Python client does), never 500, and every acknowledged batch is stored. The first batch to
    get the one pooled connection holds it, waiting for the context's row, which the test
    keeps locked until a request has been answered 503: the pool is exhausted however fast the
    machine writes a batch."""
    serve = Serve(
        tmp_path / "data",
        AGENTMEMORY_WORKERS="1",
        AGENTMEMORY_DB_POOL_SIZE="1",
        AGENTMEMORY_DB_CONNECT_TIMEOUT="1",
    )
    try:
        secret = _secret(serve)
        headers = {"Authorization": f"Bearer {secret}"}
        context = httpx.post(
            f"{serve.url}/api/v1/contexts", json={"keys": {"test": "pool"}}, headers=headers
        ).json()
        url = f"{serve.url}/api/v1/contexts/{context['id']}/messages/batch"
        holder = serve.database()
        holder.execute("SELECT 1 FROM memory_app_context WHERE id = %s FOR UPDATE", [context["id"]])
        answers: list[tuple[int, str | None, float]] = []
        acknowledged: set[str] = set()

        def write(writer: int) -> None:
            with httpx.Client(headers=headers, timeout=120) as client:
                for batch in range(3):
                    ids = [f"p{writer}-{batch}-{i}" for i in range(1000)]
                    body = {"messages": [{"role": "user", "text": c, "client_id": c} for c in ids]}
                    while True:
                        started = time.monotonic()
                        answer = client.post(url, json=body)
                        elapsed = time.monotonic() - started
                        answers.append(
                            (answer.status_code, answer.headers.get("Retry-After"), elapsed)
                        )
                        if answer.status_code != 503:
                            break
                    if answer.status_code in (200, 201):
                        acknowledged.update(ids)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(12)]
        for thread in threads:
            thread.start()
        try:
            _wait(lambda: any(status == 503 for status, _, _ in answers), 60, "a 503")
        finally:
            holder.rollback()
            holder.close()
        for thread in threads:
            thread.join(timeout=600)
        statuses = {status for status, _, _ in answers}
        assert statuses <= {200, 201, 503}, statuses
        unavailable = [(retry, seconds) for status, retry, seconds in answers if status == 503]
        assert unavailable, "the pool was never exhausted"
        assert all(retry == "2" for retry, _ in unavailable)
        # The pool timeout (1 s) plus the second allowed, with the same slack as above.
        assert max(seconds for _, seconds in unavailable) < 1 + 1 + 1.5
        assert len(acknowledged) == 12 * 3 * 1000
        assert _stored_client_ids(serve, secret, context["id"]) == acknowledged
    finally:
        serve.stop()


def test_a_killed_gunicorn_master_leaves_no_worker_on_the_port(tmp_path):
    first = Serve(tmp_path / "data")
    try:
        master = next(
            p for p in psutil.Process(first.proc.pid).children() if "gunicorn" in p.cmdline()
        )
        workers = master.children()
        assert workers
        master.kill()
        psutil.wait_procs(workers, timeout=10)
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
        first.proc.wait(timeout=30)
        assert first.proc.returncode != 0
    finally:
        first.stop()
    # The same data folder and port serve again.
    second = Serve(tmp_path / "data", port=first.port)
    try:
        assert _healthy(second.port)
    finally:
        second.stop()


def test_the_embed_worker_rides_out_a_database_outage(serve):
    worker = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "embed_worker",
            "--provider",
            "openai",
            "--base-url",
            "http://127.0.0.1:9",
            "--model",
            "fault-test-model",
            "--idle-sleep",
            "0.2",
        ],
        cwd=ROOT,
        env=_env(serve.data_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(worker.stdout), daemon=True)
    reader.start()
    try:
        _wait(lambda: any("pending" in line for line in lines), 60, "the worker up")
        serve.postmaster().kill()
        _wait(lambda: any("back after" in line for line in lines), 60, "the worker's recovery")
        assert worker.poll() is None, "".join(lines)
        outage = [line for line in lines if "the database is unavailable" in line]
        assert len(outage) == 1, "".join(lines)  # logged once, not once per attempt
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        reader.join(timeout=10)
    assert worker.returncode == 0, "".join(lines)
    assert "Traceback" not in "".join(lines)
    # Whichever process started PostgreSQL again, serve (the last to hold it) stops it.
    serve.stop()
    assert not _postgres_running(serve.data_dir)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("table", "vectors"),
    [("memory_app_message", False), ("memory_app_embeddingwaiting", True)],
    ids=["messages", "waiting vectors"],
)
def test_a_copy_the_database_cuts_off_answers_503_and_stores_nothing(table, vectors):
    """A batch's rows go in by COPY on psycopg's own cursor, past Django's error wrapping: a
    connection the database cuts off mid-COPY is a database fault like any other (503 with
    Retry-After), not a 500, and the batch is stored whole or not at all."""
    register_models(**{"cut-off-3": 3})
    client = make_key()
    client.client.raise_request_exception = False  # a 500 is answered, as a server would
    ctx = new_context(client)
    batch = [
        {"role": "user", "text": f"message {i}"}
        | ({"vector": [1.0, float(i), 0.5], "vector_model": "cut-off-3"} if vectors else {})
        for i in range(80)
    ]
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params) as holder:
        # SHARE: reads go on, the COPY's insert waits for the lock until its backend is ended.
        holder.execute(f"LOCK TABLE {table} IN SHARE MODE")  # noqa: S608 - the test's constant
        answers = []
        post = threading.Thread(
            target=lambda: answers.append(
                client.post(f"/api/v1/contexts/{ctx}/messages/batch", {"messages": batch})
            )
        )
        post.start()
        with psycopg.connect(**params, autocommit=True) as watcher:
            deadline = time.monotonic() + 10
            while True:
                waiting = watcher.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database() AND query LIKE %s",
                    [f"COPY {table} %"],
                ).fetchall()
                if waiting or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert waiting, watcher.execute(
                "SELECT pid, wait_event_type, wait_event, state, left(query, 120) FROM"
                " pg_stat_activity WHERE datname = current_database()"
            ).fetchall()
            watcher.execute("SELECT pg_terminate_backend(%s)", [waiting[0][0]])
        holder.rollback()
    post.join(60)
    [answer] = answers
    assert answer.status_code == 503, answer.content
    assert answer["Retry-After"]
    listed = client.get(f"/api/v1/contexts/{ctx}/messages")
    assert listed.status_code == 200 and listed.json()["items"] == []
