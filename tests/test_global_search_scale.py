"""Search everything at the target's size: 1,000,000 messages (and 100,000 steps with as many
tool calls) over 50 contexts, loaded by SQL; `-s` prints the figures."""

from __future__ import annotations

import os
import statistics
import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from memory_app.models import Context
from memory_app.queries.search_all import SearchFilters, search_all
from tests.api_helpers import make_key
from tests.builders import make_context, make_user

pytestmark = pytest.mark.django_db

MESSAGES = 1_000_000
CONTEXTS = 50
RUNS = 10_000  # 10 steps each, one tool call a step
TOPICS = [
    "garden", "invoice", "weather", "flight", "recipe", "contract", "server", "ticket",
    "doctor", "budget", "camera", "guitar", "planet", "harbor", "lawyer", "museum",
    "orchard", "pepper", "quartz", "rocket", "saddle", "tunnel", "violin", "walrus",
    "yogurt", "zipper", "anchor", "bakery", "canyon", "dragon", "engine", "falcon",
    "glacier", "hammock", "island", "jigsaw", "kettle", "lantern", "meadow", "nectar",
]  # fmt: skip
TOPIC_ARRAY = "ARRAY[" + ",".join(f"'{t}'" for t in TOPICS) + "]"
# Every message says "report"; one topic of 40 each (25,000 matches a topic); one code of
# 100,000 (10 matches a code).
MESSAGES_SQL = f"""
INSERT INTO memory_app_message (context_id, seq, role, name, text, tags, metadata, token_count,
    tokenizer, source_timestamp, created_at, updated_at, pruned_by)
SELECT %(first)s + (g %% {CONTEXTS}), g / {CONTEXTS} + 1,
    (ARRAY['user','assistant'])[1 + g %% 2], '',
    'status report about ' || ({TOPIC_ARRAY})[1 + (g / 7) %% 40] || ' code' || (g %% 100000)
        || ' for the team, nothing unusual today',
    '{{}}', '{{}}', 12, '', '', now(), now(), ''
FROM generate_series(0, {MESSAGES} - 1) g
"""  # noqa: S608 - constants
VECTORS_SQL = """
INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
SELECT context_id, seq, memory_app_search_vector('english', text) FROM memory_app_message
ORDER BY context_id, seq
"""
COUNTERS_SQL = """
UPDATE memory_app_context c SET last_seq = m.n, search_seq = m.n, message_count = m.n
FROM (SELECT context_id, max(seq) AS n FROM memory_app_message GROUP BY context_id) m
WHERE c.id = m.context_id
"""
RUNS_SQL = f"""
INSERT INTO memory_app_run (context_id, task, system_prompt, agent_name, framework, status,
    step_count, error_count, last_position, tool_call_count, model_names, metadata, created_at,
    updated_at)
SELECT %(first)s + g %% {CONTEXTS}, 'task ' || g, '', 'bench', 'smolagents', 'success', 10, 1, 10,
    10, ARRAY[]::varchar[], '{{}}', now(), now()
FROM generate_series(1, {RUNS}) g
"""  # noqa: S608 - constants
STEPS_SQL = f"""
INSERT INTO memory_app_step (run_id, context_id, position, kind, observations, error_type,
    error_message, model, is_final_answer, pruned_by, created_at)
SELECT r.id, r.context_id, p, 'action',
    'looked up ' || ({TOPIC_ARRAY})[1 + (r.id + p) % 40] || ' record ' || (r.id * 10 + p),
    CASE WHEN p = 5 THEN 'AgentExecutionError' END,
    CASE WHEN p = 5 THEN 'tool failed: timeout ' || r.id END,
    '', false, '', now()
FROM memory_app_run r CROSS JOIN generate_series(1, 10) p
"""  # noqa: S608 - constants
TOOLS_SQL = f"""
INSERT INTO memory_app_toolcall (step_id, context_id, position, call_id, name, arguments, output,
    created_at)
SELECT s.id, s.context_id, 1, '', 'web_search',
    json_build_object('query', ({TOPIC_ARRAY})[1 + s.id % 40] || ' prices ' || s.id),
    'found ' || (s.id % 97) || ' results', now()
FROM memory_app_step s
"""  # noqa: S608 - constants

QUERIES = [
    "report",  # every message
    "garden",  # 2.5 % of messages, 2.5 % of steps and tool calls
    "code4242",  # 10 messages
    '"status report" garden',  # a phrase and a word
    "timeout",  # 20,000 errors
    "walrus prices",  # tool calls
    "nothingmatchesthis",
]


@pytest.mark.slow
def test_search_everything_at_1000000_messages():
    contexts = [make_context(keys={"tenant": f"t{i % 7}", "user": f"u{i}"}) for i in range(50)]
    first = contexts[0].pk
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(MESSAGES_SQL, {"first": first})
        cursor.execute(VECTORS_SQL)
        cursor.execute(COUNTERS_SQL)
        cursor.execute(RUNS_SQL, {"first": first})
        cursor.execute(STEPS_SQL)
        cursor.execute(TOOLS_SQL)
        for table in ("message", "messagesearch", "runsearch", "step", "toolcall", "context"):
            cursor.execute(f"ANALYZE memory_app_{table}")
        cursor.execute("SELECT count(*) FROM memory_app_runsearch")
        (run_rows,) = cursor.fetchone()
    took = time.perf_counter() - started
    print(f"\nloaded {MESSAGES:,} messages, {run_rows:,} run rows in {took:.0f} s")
    api = make_key(scopes=["read"])
    confined = make_key(scopes=["read"], context_keys={"tenant": "t3"})
    web = Client()
    web.force_login(make_user(role="viewer"))
    print(f"load average {os.getloadavg()}")
    t3 = Context.objects.filter(keys__contains={"tenant": "t3"})
    for q, within in (("report", None), ("garden", None), ("report", t3)):
        with CaptureQueriesContext(connection) as queries:
            search_all(filters=SearchFilters(q=q), contexts=within)
        sql = next(x["sql"] for x in queries.captured_queries if "UNION ALL" in x["sql"])
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
            print("\n".join(row[0] for row in cursor.fetchall()))
    missed = []
    for q in QUERIES:
        calls = {
            "query": lambda q=q: search_all(filters=SearchFilters(q=q)),
            "API": lambda q=q: api.get("/api/v1/search", {"q": q}),
            "API, confined key": lambda q=q: confined.get("/api/v1/search", {"q": q}),
            "page": lambda q=q: web.get("/search/", {"q": q}),
        }
        for name, call in calls.items():
            call()  # warm
            timings, reads = [], []
            for _ in range(5):
                with CaptureQueriesContext(connection) as queries:
                    start = time.perf_counter()
                    answer = call()
                    timings.append(time.perf_counter() - start)
                if name != "query":
                    assert answer.status_code == 200, answer.content[:300]
                reads.append(sum(float(x["time"]) for x in queries.captured_queries))
            print(
                f"{q!r:28} {name:18} p50 {statistics.median(timings) * 1000:6.0f} ms"
                f"  (SQL {statistics.median(reads) * 1000:5.0f} ms, {len(queries)} queries)"
            )
            # The SQL stays index-driven at this size: a search that scans the messages or steps
            # takes seconds here. The 150 ms target is measured by `manage.py benchmark` (the
            # dashboard area's search rows), not by a test sharing the machine with others.
            if statistics.median(reads) >= 1.0:
                missed.append((q, name, statistics.median(reads)))
    print(f"load average {os.getloadavg()}")
    assert not missed
