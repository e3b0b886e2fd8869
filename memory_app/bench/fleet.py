"""`benchmark --only fleet`: the runs table across contexts and search everything at the size of
their targets (100,000 runs with 1,000,000 steps and as many tool calls; 1,000,000 messages;
50 contexts), in a database of its own (`fleet_data` builds it by SQL, once; `--rebuild` builds
it again).

Each row is a page a reviewer opens (a logged-in user, through Django's full stack in-process)
or the Agent API's answer (a real key; one confined to some contexts' keys too), timed as the
other areas' rows are. The area writes its own section of the report (`SECTION`), which a full
run keeps as it is (`bench.sections`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

import psycopg
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.urls import reverse

from memory_app.bench import database, sections
from memory_app.bench.fleet_data import FleetSizes, build, finished
from memory_app.bench.harness import API
from memory_app.bench.measure import Latency, Row, Target, loadavg, time_calls

SECTION = sections.FLEET
TARGET = Target("<=", 150, "p50 ≤ 150 ms")
WARMUP = 3
# The contexts of one tenant: a key confined to them, a runs table filtered to them.
TENANT = ("tenant", "t3")
# What a reviewer searches for, and how often the dataset holds it (`fleet_data`).
QUERIES = [
    ("report", "a word in every message"),
    ("garden", "a topic word (2.5 % of messages, steps, tool calls)"),
    ("code4242", "a rare code (10 messages)"),
    ('"status report" garden', "a phrase and a word"),
    ("timeout", "an error word"),
    ("walrus prices", "tool-call words"),
    ("nothingmatchesthis", "a word matching nothing"),
]


class FleetError(Exception):
    pass


@dataclass
class FleetRow:
    row: Row
    load: float


def prepare(
    db_name: str, sizes: FleetSizes, *, rebuild: bool, log: Callable[[str], None]
) -> dict[str, float]:
    """Switch to the area's database, building its dataset unless it holds a finished one of
    these sizes; the build's timings."""
    try:
        exists = database.database_exists(db_name)
        database.switch_to(db_name)
    except (database.BenchDatabaseError, psycopg.Error) as exc:
        raise FleetError(f"cannot use the benchmark database {db_name!r}: {exc}") from exc
    if exists and not rebuild:
        timings = finished(sizes)
        if timings is None:
            raise FleetError(
                f"database {db_name} holds no finished fleet dataset of these sizes (a build may "
                "be under way in another process: wait for it); --rebuild drops and rebuilds it"
            )
        log(f"reusing database {db_name}")
        # Migrations added since the build (an index, say) are measured too.
        database.migrate()
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        return timings
    connection.close()
    log(f"creating database {db_name}")
    try:
        database.recreate_database(db_name)
    except psycopg.Error as exc:
        raise FleetError(f"cannot create the benchmark database {db_name!r}: {exc}") from exc
    database.migrate()
    log(
        f"building the fleet dataset: {sizes.runs:,} runs, {sizes.steps:,} steps, "
        f"{sizes.messages:,} messages over {sizes.contexts} contexts"
    )
    return build(sizes, log)


def _clients() -> tuple[Client, Client, Client]:
    """A dashboard user's client, an API key's, and a key confined to one tenant's."""
    from memory_app import auth

    user, _ = get_user_model().objects.get_or_create(
        username="benchmark", defaults={"is_superuser": True, "is_staff": True}
    )
    web = Client()
    web.force_login(user)
    keys = [
        auth.apikey_create(name="benchmark", scopes=["read"]),
        auth.apikey_create(
            name="benchmark, one tenant", scopes=["read"], context_keys=dict([TENANT])
        ),
    ]
    api, confined = (Client(HTTP_AUTHORIZATION=f"Bearer {k.secret}") for k in keys)
    return web, api, confined


def _pages() -> list[tuple[str, str, str]]:
    """(measure, client, URL) of every row: the runs table's pages, then the searches."""
    from memory_app.queries.runs_table import RunFilters, runs_table

    runs, search = reverse("runs"), reverse("search")
    second = runs_table(filters=RunFilters()).next_cursor
    key = "=".join(TENANT)
    pages = [
        ("runs table", "web", runs),
        ("runs table, page 2 by cursor", "web", f"{runs}?{urlencode({'cursor': second or ''})}"),
        ("runs table, failed with an error", "web", f"{runs}?status=failed&has_error=1"),
        (f"runs table, a key subset ({key})", "web", f"{runs}?{urlencode({'key': key})}"),
        ("runs table, costliest first", "web", f"{runs}?sort=cost"),
        ("runs table, a score (correct = false)", "web", f"{runs}?score=correct&score_value=false"),
        ('runs table, error text ("timeout")', "web", f"{runs}?error=timeout"),
        ("home page (failed and running runs)", "web", reverse("home")),
        ("Agent API, runs", "api", f"{API}/runs"),
    ]
    for q, what in QUERIES:
        query = urlencode({"q": q})
        pages.append((f"search everything page, {what}: {q}", "web", f"{search}?{query}"))
        pages.append((f"search everything API, {what}: {q}", "api", f"{API}/search?{query}"))
    for q in ("report", "garden"):
        query = urlencode({"q": q})
        name = f"search everything API, a key confined to {key}: {q}"
        pages.append((name, "confined", f"{API}/search?{query}"))
    return pages


def measure(*, samples: int, log: Callable[[str], None]) -> list[FleetRow]:
    web, api, confined = _clients()
    clients = {"web": web, "api": api, "confined": confined}
    rows = []
    for name, which, url in _pages():
        client = clients[which]

        def call(client=client, url=url):
            response = client.get(url)
            if response.status_code != 200:
                raise FleetError(f"GET {url} answered {response.status_code}")
            return response

        # Every call is taken, however slow (the default time budget would cut a slow row short).
        latency: Latency = time_calls(call, n=samples, warmup=WARMUP, budget=float("inf"))
        row = Row("fleet", name, latency, None, TARGET)
        load = os.getloadavg()[0]
        log(f"  {name}: {latency} (load {load:.2f})")
        rows.append(FleetRow(row, load))
    return rows


def counts() -> dict[str, int]:
    """The rows the dataset holds, as counted now."""
    tables = ("context", "run", "step", "toolcall", "message", "messagesearch", "runsearch")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT "  # noqa: S608 - constants
            + ", ".join(f"(SELECT count(*) FROM memory_app_{t})" for t in tables)  # noqa: S608
            + ", (SELECT count(*) FROM memory_app_score),"
            " (SELECT count(*) FROM memory_app_label)"
        )
        values = cursor.fetchone()
    return dict(zip((*tables, "score", "label"), values, strict=True))


def section(
    rows: list[FleetRow],
    *,
    sizes: dict[str, int],
    build_seconds: dict[str, float],
    command: str,
    db_name: str,
    samples: int,
    quick: bool,
    loads: tuple[str, str],
) -> list[str]:
    s = sizes
    lines = [
        *sections.opening(SECTION, command, quick=quick),
        f"- Dataset (own database `{db_name}`, built by SQL: `memory_app/bench/fleet_data.py`): "
        f"{s['run']:,} runs with {s['step']:,} steps and {s['toolcall']:,} tool calls, "
        f"{s['message']:,} messages, over {s['context']:,} contexts; statuses, errors, models, "
        f"costs, tokens and durations apart; {s['score']:,} scores and {s['label']:,} labels; "
        f"the full-text vectors of {s['messagesearch']:,} messages and of {s['runsearch']:,} "
        'step outputs, errors and tool calls, analysed. Every message says "report".',
        f"- Build: {sum(build_seconds.values()):,.0f} s ("
        + ", ".join(f"{k} {v:,.0f} s" for k, v in build_seconds.items())
        + "); reused by later runs.",
        f"- Latencies: p50 / p95 of {samples} calls after {WARMUP} warm-up calls, server time "
        "through Django's full stack in-process (`django.test.Client`): pages with a logged-in "
        "user, the Agent API with a real key (read scope).",
        f"- Load average (1/5/15 min) at the start: {loads[0]}; at the end: {loads[1]} (the "
        f"{os.cpu_count()} cores are shared with other work).",
        "",
        "| Measure | Ours | Target | Result | Load (1 min) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.row.measure} | {r.row.ours} | {TARGET.text} | {r.row.status} | {r.load:.2f} |"
        )
    return lines


def run(
    *,
    db_name: str,
    sizes: FleetSizes,
    rebuild: bool,
    samples: int,
    quick: bool,
    command: str,
    log: Callable[[str], None],
) -> tuple[list[FleetRow], list[str]]:
    """Prepare the database, measure every row; the rows and the report's section."""
    start = loadavg()
    built = prepare(db_name, sizes, rebuild=rebuild, log=log)
    log(f"measuring fleet ({samples} calls a row)")
    rows = measure(samples=samples, log=log)
    lines = section(
        rows,
        sizes=counts(),
        build_seconds=built,
        command=command,
        db_name=db_name,
        samples=samples,
        quick=quick,
        loads=(start, loadavg()),
    )
    return rows, lines
