"""The request path: what a request costs above the database's own work, over real HTTP.

The product is served as `manage.py serve` serves it (gunicorn, uvicorn workers, the site's ASGI
app; one worker here) on the benchmark's database, and each row pairs one of its requests with
the same database work done without it, interleaved A B, B A, A B ... (A = ours over HTTP):

- semantic search on the largest context ÷ the same SQL run raw (psycopg in this process, the
  statements `memory_app.search.semantic` sends, the hits' rows read by the walk's statement,
  as the API reads them);
- a single append ÷ a minimal HTTP handler doing the same INSERT (`bench/minimal_http.py`:
  the same statements in one transaction, no authentication, no validation, no middleware),
  served by the same server with the same worker class, over the same keep-alive connection
  kind from the same client.

Each row's ratio is the median of the per-pair ratios, its spread beside it (target: both
≤ 2.0). Then the work above the database itself: the CPU time the serving worker spends on each
of a window, a semantic search and a single append (target: p50 ≤ 1 ms). The HTTP client is
`http.client` on one keep-alive connection per side; request bodies are encoded before the
clock starts.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

import orjson
import psycopg
from django.conf import settings

from memory_app import db
from memory_app.bench.harness import API, SEARCH_K, Bench, BenchError, context_size
from memory_app.bench.measure import (
    Latency,
    Row,
    Target,
    fmt_ms,
    latency_of,
    load_span,
    loadavg,
    machine_lines,
    paired_note,
    time_pairs,
)
from memory_app.search import semantic

AREA = "request path"
# Its notes' heading in a full run's report, and the section `--only http_path` writes alone
# (a later full run writes its own in its place).
SECTION = "## Request path"
RATIO_TARGET = Target("<=", 2.0, "median per-pair ratio ≤ 2.0", of_ratio=True)
WORK_TARGET = Target("<=", 1.0, "p50 ≤ 1 ms")
# Pairs per row however few samples the run takes (not in a quick run): each row's two sides
# differ by a few milliseconds, and over 50 pairs their median ratio moved by more than the
# margin to its target from run to run; over 400 (a few seconds a row) it holds within a few
# hundredths.
MIN_PAIRS = 400


def pairs_for(b: Bench) -> int:
    """How many pairs each row times."""
    return b.samples if b.quick else max(b.samples, MIN_PAIRS)


def run(b: Bench) -> None:
    from memory_app.bench.database import conninfo, server_info

    info = conninfo()
    start = loadavg()
    url = f"postgresql://{quote(info.get('user', ''))}:@/{info['dbname']}?host={info['host']}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "AGENTMEMORY_SEARCH_EXACT_THRESHOLD": str(settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD),
    }
    with (
        _served(
            ["agentmemory_site.asgi:application", "memory_app.bench.minimal_http:app"], env
        ) as (ours_served, minimal_served),
        # Statements prepared only where the search prepares them (`Walk.prepared`), as the
        # site's connections do (db.binding_cursor): psycopg's own preparing after five runs
        # would prepare the statements the search leaves unprepared.
        psycopg.connect(**info, autocommit=True, prepare_threshold=db.PREPARE_WHEN_ASKED) as raw,
    ):
        # The query vector's parameter, packed as the search packs it (memory_app.db).
        raw.adapters.register_dumper(db.Float8Array, db.Float8ArrayDumper)
        ours = _Http(ours_served.port, {"Authorization": f"Bearer {b.api_secret}"})
        minimal = _Http(minimal_served.port, {})
        _semantic_row(b, ours, raw)
        _append_row(b, ours, minimal)
        _work_rows(b, ours, worker_pid(ours_served.master))
    server = server_info(info["dbname"])
    b.report.notes += [
        "",
        SECTION,
        "",
        *machine_lines(server["server"], server["pgvector"]),
        load_span(start),
        f"- Held: the benchmark's dataset ({b.data.sizes.messages:,} messages over "
        f"{b.data.sizes.contexts:,} contexts, vectors for every message).",
        "",
        "Over real HTTP on 127.0.0.1: the product as `manage.py serve` runs it (gunicorn with "
        "uvicorn workers, one worker) against the same SQL without it, pairs of calls interleaved "
        "A B, B A, A B ...; the ratio is the median of the per-pair ratios (the middle half and "
        "the extremes in the row). Semantic search: the statements the search sends, raw through "
        "psycopg in the benchmark's process (the walk's settings, the walk with the hits' rows). "
        "Single append: a minimal ASGI handler on the same server doing the append's statements in"
        " one transaction (counters and seq, the message row, its full-text row), nothing else "
        "(memory_app/bench/minimal_http.py). Work above the database: for each request, the "
        "serving worker's CPU time (the process's CPU clock, every thread's: the event loop's "
        "HTTP and the API thread's request with its key check, body, statements, rows and "
        "answer; PostgreSQL's own work runs in its processes), read before it and after it once "
        "the clock stops moving, requests one after another; the mean beside the row.",
    ]


class _Http:
    """One keep-alive connection; a request's whole answer is read before the clock stops."""

    def __init__(self, port: int, headers: dict[str, str]):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Content-Type": "application/json", **headers}

    def post(self, path: str, body: bytes) -> bytes:
        try:
            self.conn.request("POST", path, body=body, headers=self.headers)
            response = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed the idle connection (its keep-alive ran out): a new one.
            self.conn.close()
            self.conn.request("POST", path, body=body, headers=self.headers)
            response = self.conn.getresponse()
        data = response.read()
        if response.status not in (200, 201):
            raise BenchError(f"POST {path} answered {response.status}: {data[:300]!r}")
        return data


def _semantic_row(b: Bench, ours: _Http, raw: psycopg.Connection) -> None:
    cid = b.data.largest_context_id
    size = context_size(cid)
    gen = b.gen(seed_offset=7)
    topics = b.data.context_topics[cid]
    queries = [gen.query(topics[i % len(topics)])[1] for i in range(pairs_for(b) + 3)]
    path = f"{API}/contexts/{cid}/select"

    def http(vector) -> None:
        encoded = _semantic_body(b, vector)
        return lambda: ours.post(path, encoded)

    def direct(vector) -> None:
        walk = semantic.walk_statements(
            model=b.data.model,
            vector=vector,
            limit=SEARCH_K,
            share=size,
            **semantic.message_filter(cid),
            rows_sql=semantic.MESSAGE_ROWS,
            one_plan=True,
        )
        return lambda: _raw_search(raw, walk)

    a, d, paired = time_pairs([(http(v), direct(v)) for v in queries])
    label = f"semantic search k={SEARCH_K}, largest context ({size:,} msgs)"
    row = Row(
        AREA, f"{label}: HTTP ÷ the same SQL raw", a, d, RATIO_TARGET, paired_note(paired), paired
    )
    b.report.add(row, b.log)


def _semantic_body(b: Bench, vector) -> bytes:
    """A semantic search's request body with the client's vector (a numpy array), encoded."""
    body = {
        "selector": "search",
        "query": "",
        "k": SEARCH_K,
        "mode": "semantic",
        "model": b.data.model,
        "query_vector": vector,
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _raw_search(raw: psycopg.Connection, walk: semantic.Walk) -> None:
    """The statements as the search sends them: BEGIN, the settings, the walk (which reads the
    hits' rows too) and COMMIT in one round trip (a pipeline), prepared as the search prepares
    them; the rows kept as the search keeps them (nearest first, ties by id)."""
    with raw.pipeline():
        raw.execute("BEGIN")
        raw.execute(*walk.settings, prepare=walk.prepared)
        walked = raw.execute(walk.sql, walk.args, prepare=walk.prepared)
        raw.execute("COMMIT")
    found = walked.fetchall()
    sorted(found, key=lambda row: (row[1], row[0]))[:SEARCH_K]


def _append_row(b: Bench, ours: _Http, minimal: _Http) -> None:
    stamp = str(time.time_ns())
    ours_ctx, minimal_ctx = (
        b.post(f"{API}/contexts", {"keys": {"bench": f"request-path-{side}", "at": stamp}}).json()[
            "id"
        ]
        for side in ("ours", "minimal")
    )
    gen = b.gen(seed_offset=8)
    texts = gen.texts([i % 40 for i in range(pairs_for(b) + 3)])
    bodies = [orjson.dumps({"role": "user", "text": text}) for text in texts]
    a, m, paired = time_pairs(
        [
            (
                lambda body=body: ours.post(f"{API}/contexts/{ours_ctx}/messages", body),
                lambda body=body: minimal.post(f"/contexts/{minimal_ctx}/messages", body),
            )
            for body in bodies
        ]
    )
    label = "single append: HTTP ÷ a minimal HTTP handler doing the same INSERT"
    b.report.add(Row(AREA, label, a, m, RATIO_TARGET, paired_note(paired), paired), b.log)


def _work_rows(b: Bench, ours: _Http, pid: int) -> None:
    """Work above the database: for each request, the CPU time the serving worker spent on it,
    over all its threads (the event loop's HTTP, the API thread's request: key check, body,
    statements sent and rows read, the answer). PostgreSQL's own work is in its processes, not
    the worker's. A window of 20 and a semantic search on the largest context, and a single
    append to a context of its own."""
    cid = b.data.largest_context_id
    gen = b.gen(seed_offset=9)
    topics = b.data.context_topics[cid]
    n = pairs_for(b) + 3
    select = f"{API}/contexts/{cid}/select"
    window = orjson.dumps({"selector": "window", "k": 20})
    searches = [_semantic_body(b, gen.query(topics[i % len(topics)])[1]) for i in range(n)]
    stamp = str(time.time_ns())
    target = b.post(f"{API}/contexts", {"keys": {"bench": "work-above-db", "at": stamp}}).json()
    texts = gen.texts([i % 40 for i in range(n)])
    appends = [orjson.dumps({"role": "user", "text": text}) for text in texts]
    for label, path, bodies in (
        ("window k=20, largest context", select, [window] * n),
        (f"semantic search k={SEARCH_K}, largest context", select, searches),
        ("single append", f"{API}/contexts/{target['id']}/messages", appends),
    ):
        cpu, mean = worker_cpu(
            pid, [lambda p=path, body=body: ours.post(p, body) for body in bodies]
        )
        note = (
            f"the serving worker's CPU over {cpu.n} requests, mean {fmt_ms(mean)}; "
            f"load {os.getloadavg()[0]:.2f}"
        )
        measure = f"work above the database, {label}: the worker's CPU per request"
        b.report.add(Row(AREA, measure, cpu, None, WORK_TARGET, note), b.log)


def worker_pid(master: int) -> int:
    """The process id of a gunicorn master's one worker."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    if len(children) != 1:
        raise BenchError(f"gunicorn {master} runs {len(children)} workers, not one")
    return int(children[0])


def worker_cpu(pid: int, calls: list, *, warmup: int = 3) -> tuple[Latency, float]:
    """The CPU time process `pid` spends during each of `calls` after the first `warmup` (made
    one after another), in milliseconds: the process's CPU clock, which sums every thread's,
    ended ones too, and is brought up to date when read. The clock is read again until it stops
    moving (the process's work after it sent the answer is its request's too), a millisecond
    apart at most a few times. With the mean of the samples."""
    clock = _process_cpu_clock(pid)
    for call in calls[:warmup]:
        call()
    samples = []
    for call in calls[warmup:]:
        before = _settled(clock)
        call()
        samples.append((_settled(clock) - before) / 1e6)
    return latency_of(samples), sum(samples) / len(samples)


def _process_cpu_clock(pid: int) -> int:
    """The clock id of process `pid`'s CPU time (Linux's CPUCLOCK_SCHED of the whole process,
    `clock_getcpuclockid(3)`'s)."""
    return ((~pid) << 3) | 2


def _settled(clock: int, *, reads: int = 5) -> int:
    """The clock's value once it no longer moves between two reads a millisecond apart."""
    value = time.clock_gettime_ns(clock)
    for _ in range(reads):
        time.sleep(0.001)
        again = time.clock_gettime_ns(clock)
        if again == value:
            break
        value = again
    return value


def section(report, *, command: str, quick: bool) -> list[str]:
    """This area's section of the report, when it runs alone."""
    from memory_app.bench import sections

    return sections.paired_section(
        report, SECTION, command=command, quick=quick, sides=("Ours", "Without it")
    )


class Served(NamedTuple):
    """An app served by `_served`: its port and its gunicorn master's process id."""

    port: int
    master: int


@contextmanager
def _served(
    apps: list[str],
    env: dict[str, str],
    pythons: list[str] | None = None,
    *,
    workers: int = 1,
    preload: bool = False,
):
    """Each app under gunicorn with `workers` uvicorn workers on a free port of 127.0.0.1, as
    `manage.py serve` runs the site (`preload`: imported once before the workers fork, as serve
    does), started side by side (each by its python of `pythons`, default this one); their
    ports and gunicorn masters. Stopped (by their own process ids) on the way out."""
    procs, ports = [], []
    try:
        for app, python in zip(apps, pythons or [sys.executable] * len(apps), strict=True):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            cmd = [python, "-m", "gunicorn", app]
            cmd += ["--worker-class", "uvicorn_worker.UvicornWorker", "--workers", str(workers)]
            cmd += ["--config", "python:agentmemory_site.gunicorn_hooks"]
            cmd += ["--preload"] if preload else []
            cmd += ["--bind", f"127.0.0.1:{port}", "--log-level", "warning"]
            cmd += ["--keep-alive", str(settings.AGENTMEMORY_KEEPALIVE_SECONDS)]
            procs.append(subprocess.Popen(cmd, env=env, cwd=settings.BASE_DIR))
            ports.append(port)
        for app, proc, port in zip(apps, procs, ports, strict=True):
            _wait_serving(app, proc, port)
        yield [Served(port, proc.pid) for port, proc in zip(ports, procs, strict=True)]
    finally:
        stop_processes(procs)


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Ask each process to stop (SIGTERM, all at once), then kill any still running 20 s on."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_serving(app: str, proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"{app} did not start serving (exit {proc.poll()})") from None
            time.sleep(0.2)
