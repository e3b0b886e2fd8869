"""`manage.py benchmark --quality --keyword-messages N`: keyword search on one context of N
messages (target: p50 ≤ 30 ms at 1,000,000).

The context holds LoCoMo's turns over and over, a unique number appended to each (so that no
two messages are equal and the words keep the dataset's frequencies), every full-text vector
written as the indexer leaves them (GIN pending list merged, the tables analysed). It is built
once into its own database and reused while it holds the same number of messages. LoCoMo's
questions are then asked in keyword mode through `search_messages`, as the API asks them, and
each one's statements are run again under EXPLAIN (ANALYZE, BUFFERS): the buffers and the
server's own time depend less on the machine's load than the wall-clock figures.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence

from django.db import connection

from memory_app import db
from memory_app.bench import database, sections
from memory_app.models import FTS_CONFIG

KEYS = {"benchmark": "locomo-keyword-scale"}
QUESTIONS = 200


def prepare(db_name: str, conversations, messages: int, log: Callable[[str], None]):
    """Switch to the benchmark database `db_name` and answer its context of `messages` LoCoMo
    turns: built once (its database made anew when it holds another size), then reused."""
    exists = database.database_exists(db_name)
    database.switch_to(db_name)
    if not exists:
        database.recreate_database(db_name)
    database.migrate()
    if built_size() != messages:
        if exists:
            connection.close()
            database.recreate_database(db_name)
            database.migrate()
        log(f"building one context of {messages:,} messages in {db_name}")
        build([(t[1], t[2]) for c in conversations for t in c.turns], messages, log)
    return scale_context()


def scale_context():
    """The scale context of the current database, or None."""
    from memory_app.models import Context
    from memory_app.queries.lists import context_by_keys

    return context_by_keys(within=Context.objects.all(), keys=KEYS)


def built_size() -> int:
    """Messages of the scale context in the current database (0 when there is none)."""
    context = scale_context()
    return context.message_count if context else 0


def build(turns: Sequence[tuple[str, str]], messages: int, log: Callable[[str], None]):
    """One context of `messages` messages cycling through `turns` (speaker, text), every vector
    written; returns the context."""
    from memory_app.services.contexts import context_get_or_create

    context, _ = context_get_or_create(keys=KEYS)
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        cursor.execute("CREATE TEMP TABLE bench_turns (i int PRIMARY KEY, name text, text text)")
        with connection.connection.cursor().copy(
            "COPY bench_turns (i, name, text) FROM STDIN"
        ) as copy:
            for i, (speaker, text) in enumerate(turns):
                copy.write_row((i, speaker, text))
        t = time.perf_counter()
        cursor.execute(
            "INSERT INTO memory_app_message (context_id, seq, role, name, text, tags, metadata,"
            " token_count, tokenizer, source_timestamp, created_at, updated_at, pruned_by)"
            " SELECT %s, g, CASE WHEN g %% 2 = 0 THEN 'assistant' ELSE 'user' END, t.name,"
            " t.text || ' #' || g, '{}', '{}', 0, '', '', now(), now(), ''"
            " FROM generate_series(1, %s) g JOIN bench_turns t ON t.i = (g - 1) %% %s",
            [context.pk, messages, len(turns)],
        )
        log(f"  messages: {messages:,} rows in {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        cursor.execute(
            "INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)"
            " SELECT context_id, seq, memory_app_search_vector(%s::regconfig, text)"
            " FROM memory_app_message WHERE context_id = %s ORDER BY seq",
            [FTS_CONFIG, context.pk],
        )
        cursor.execute(
            "UPDATE memory_app_context SET last_seq = %s, search_seq = %s, message_count = %s"
            " WHERE id = %s",
            [messages, messages, messages, context.pk],
        )
        cursor.execute("SELECT gin_clean_pending_list('message_search_gin'::regclass)")
        log(f"  full-text vectors in {time.perf_counter() - t:.0f} s")
        cursor.execute("DROP TABLE bench_turns")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE memory_app_message")
        cursor.execute("VACUUM ANALYZE memory_app_messagesearch")
    context.refresh_from_db()
    return context


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _explained(sql: str, params) -> tuple[float, int]:
    """(server execution ms, shared buffers hit + read) of one captured statement, its
    parameters bound by the server as the search binds them."""
    with db.binding_cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    top = plan[0]
    node = top["Plan"]
    buffers = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
    return float(top["Execution Time"]), int(buffers)


def run(context, questions: Sequence[str], log: Callable[[str], None]) -> dict:
    """Each question in keyword mode (k 10), timed; then each one's statements explained."""
    from memory_app.search.messages import search_messages

    for question in questions[:5]:  # warm the caches and the connection
        search_messages(context=context, query=question, k=10, mode="keyword")
    times = []
    for question in questions:
        t = time.perf_counter()
        search_messages(context=context, query=question, k=10, mode="keyword")
        times.append((time.perf_counter() - t) * 1000)
    server_ms, buffers, statements = [], [], []
    for question in questions:
        captured = []

        def capture(execute, sql, params, many, context, captured=captured):
            captured.append((sql, params))
            return execute(sql, params, many, context)

        with connection.execute_wrapper(capture):
            search_messages(context=context, query=question, k=10, mode="keyword")
        total_ms = total_buffers = 0
        statements.append(len(captured))
        for sql, params in captured:
            ms, blocks = _explained(sql, params)
            total_ms += ms
            total_buffers += blocks
        server_ms.append(total_ms)
        buffers.append(total_buffers)
    return {
        "questions": len(questions),
        "p50": statistics.median(times),
        "p95": _percentile(times, 0.95),
        "server_p50": statistics.median(server_ms),
        "server_p95": _percentile(server_ms, 0.95),
        "buffers_p50": statistics.median(buffers),
        "buffers_p95": _percentile(buffers, 0.95),
        "statements": statistics.median(statements),
    }


def report(result: dict, messages: int, load: str) -> list[str]:
    ok = result["p50"] <= 30
    return [
        f"Keyword search, one context of {messages:,} messages, {result['questions']} LoCoMo"
        f" questions, k 10 (load average {load}):",
        f"- wall clock: p50 {result['p50']:.1f} ms, p95 {result['p95']:.1f} ms"
        f" (target p50 ≤ 30 ms: {'met' if ok else '**missed**'})",
        f"- the server's execution time of its statements (EXPLAIN ANALYZE): p50"
        f" {result['server_p50']:.1f} ms, p95 {result['server_p95']:.1f} ms;"
        f" shared buffers p50 {result['buffers_p50']:,.0f}, p95 {result['buffers_p95']:,.0f};"
        f" {result['statements']:.0f} statements a query",
    ]


def section(
    result: dict, messages: int, *, load: str, command: str, machine: list[str]
) -> list[str]:
    """The report's section of a `--quality --keyword-messages` run: what it ran on, then
    `report`'s figures."""
    return [
        *sections.opening(sections.KEYWORD_SCALE, command, quick=False),
        *machine,
        f"- Dataset: one context of {messages:,} messages, LoCoMo's turns repeated with a unique"
        " number appended to each (every full-text vector written, the index's pending list"
        " merged, analysed); the questions of the LoCoMo files `--quality` reads (fetched, or"
        " `--dataset`).",
        "",
        *report(result, messages, load),
    ]
