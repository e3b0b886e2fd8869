"""The fleet dataset of `benchmark --only fleet`, loaded by SQL into its own database: runs with
their steps and tool calls across contexts (statuses, errors, models, costs, tokens, durations,
scores and labels apart), and messages over the same contexts.

Every message says "report"; one topic word of 40 each (a topic is in 2.5 % of the messages,
steps and tool calls); one code of 100,000 (a code names 10 messages at a million). A run's
erroneous step says one of four errors ("timeout" is one). What the write path keeps is
computed from the rows: the runs' counters, cost and models from their steps, the contexts'
from their messages and runs, the full-text vectors of messages and of what runs wrote
(MessageSearch, RunSearch) with the text expressions the search reads them by.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from django.db import connection

from memory_app import pricing
from memory_app.bench import database
from memory_app.bench.load import _copy_contexts, _secondary_indexes
from memory_app.models import FTS_CONFIG
from memory_app.queries.search_all import _TEXTS

META_TABLE = "bench_fleet_meta"
TOPICS = [
    "garden", "invoice", "weather", "flight", "recipe", "contract", "server", "ticket",
    "doctor", "budget", "camera", "guitar", "planet", "harbor", "lawyer", "museum",
    "orchard", "pepper", "quartz", "rocket", "saddle", "tunnel", "violin", "walrus",
    "yogurt", "zipper", "anchor", "bakery", "canyon", "dragon", "engine", "falcon",
    "glacier", "hammock", "island", "jigsaw", "kettle", "lantern", "meadow", "nectar",
]  # fmt: skip
MODELS = ["gpt-4o-mini", "gpt-4o", "claude-sonnet-4", "gpt-4.1-mini"]
ERRORS = [
    ("AgentExecutionError", "tool failed: timeout after 30 s"),
    ("AgentToolCallError", "rate limit exceeded for the search tool"),
    ("AgentParsingError", "invalid JSON in the tool arguments"),
    ("AgentExecutionError", "connection reset by peer"),
]
# One status a slot: 8 of 12 runs succeed, one each fails, runs, stops at max steps, is cancelled.
STATUSES = ["success"] * 8 + ["failed", "running", "max_steps_error", "cancelled"]
# A multiplicative hash of a row number: statuses, models and durations drawn from it vary
# independently of the context (row number modulo the contexts) and of each other.
HASH = "(({} * 2654435761) % 4294967296)"
FILLED = (
    "memory_app_message",
    "memory_app_messagesearch",
    "memory_app_run",
    "memory_app_step",
    "memory_app_toolcall",
    "memory_app_runsearch",
    "memory_app_score",
    "memory_app_label",
)


@dataclass(frozen=True)
class FleetSizes:
    runs: int = 100_000
    steps_per_run: int = 10
    messages: int = 1_000_000
    contexts: int = 50

    @classmethod
    def quick(cls) -> FleetSizes:
        return cls(runs=600, steps_per_run=5, messages=6_000, contexts=50)

    @property
    def steps(self) -> int:
        return self.runs * self.steps_per_run


def _array(values: list[str]) -> str:
    return "ARRAY[" + ",".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


def rows_sql(s: FleetSizes, *, first: int = 1) -> dict[str, str]:
    """The statements that load the rows, by name; the contexts are ids `first` onwards."""
    topics, models = _array(TOPICS), _array(MODELS)
    prices = [pricing.model_price(m) or (0.0, 0.0) for m in MODELS]
    price_in = "ARRAY[" + ",".join(str(p[0]) for p in prices) + "]::float8[]"
    price_out = "ARRAY[" + ",".join(str(p[1]) for p in prices) + "]::float8[]"
    error_types, error_texts = _array([e[0] for e in ERRORS]), _array([e[1] for e in ERRORS])
    n, c = s.messages, s.contexts
    middle = max(1, s.steps_per_run // 2)
    return {
        "messages": f"""
INSERT INTO memory_app_message (context_id, seq, role, name, text, tags, metadata, token_count,
    tokenizer, source_timestamp, created_at, updated_at, pruned_by)
SELECT {first} + g % {c}, g / {c} + 1, (ARRAY['user','assistant'])[1 + g % 2], '',
    'status report about ' || ({topics})[1 + (g / 7) % 40] || ' code' || (g % 100000)
        || ' for the team, nothing unusual today',
    '{{}}', '{{}}', 12, '', '', now() - ({n} - g) * interval '2 seconds',
    now() - ({n} - g) * interval '2 seconds', ''
FROM generate_series(0, {n} - 1) g""",  # noqa: S608 - constants
        # A run errs when it failed or stopped, and one in seven others met an error on the way.
        "runs": f"""
INSERT INTO memory_app_run (context_id, task, system_prompt, agent_name, framework, status,
    started_at, finished_at, duration, step_count, error_count, last_position, tool_call_count,
    model_names, metadata, created_at, updated_at)
SELECT {first} + g % {c}, 'look into the ' || ({topics})[1 + g % 40] || ' question ' || g, '',
    (ARRAY['researcher','planner','support'])[1 + g % 3], 'smolagents', st,
    now() - g * interval '13 seconds',
    CASE WHEN st <> 'running' THEN now() - g * interval '13 seconds' + dur * interval '1 second'
    END,
    CASE WHEN st <> 'running' THEN dur END,
    0, (st IN ('failed', 'max_steps_error') OR g % 7 = 0)::int, 0, 0, '{{}}', '{{}}',
    now() - g * interval '13 seconds', now() - g * interval '13 seconds'
FROM generate_series(1, {s.runs}) g,
    LATERAL (SELECT ({_array(STATUSES)})[1 + {HASH.format("g")} / 256 % 12] AS st,
                    2 + {HASH.format("g")} / 4096 % 600 AS dur) x""",  # noqa: S608 - constants
        "steps": f"""
INSERT INTO memory_app_step (run_id, context_id, position, kind, step_number, model, observations,
    error_type, error_message, duration, input_tokens, output_tokens, total_tokens, cost,
    is_final_answer, pruned_by, created_at)
SELECT r.id, r.context_id, p, 'action', p, ({models})[m], 'looked up '
        || ({topics})[1 + (r.id + p) % 40] || ' record ' || (r.id * {s.steps_per_run} + p),
    CASE WHEN r.error_count > 0 AND p = {middle} THEN ({error_types})[1 + r.id % 4] END,
    CASE WHEN r.error_count > 0 AND p = {middle} THEN ({error_texts})[1 + r.id % 4]
        || ' (run ' || r.id || ')' END,
    0.5 + (r.id + p) % 9, tin, tout, tin + tout,
    (tin * ({price_in})[m] + tout * ({price_out})[m]) / 1000000.0,
    p = {s.steps_per_run}, '', r.created_at + p * interval '1 second'
FROM memory_app_run r CROSS JOIN generate_series(1, {s.steps_per_run}) p,
    LATERAL (SELECT 1 + {HASH.format("r.id")} / 65536 % 4 AS m,
                    800 + (r.id * 7 + p * 131) % 4000 AS tin,
                    40 + (r.id * 13 + p * 17) % 600 AS tout) x""",  # noqa: S608 - constants
        "tool calls": f"""
INSERT INTO memory_app_toolcall (step_id, context_id, position, call_id, name, arguments, output,
    success, created_at)
SELECT s.id, s.context_id, 1, 'call_' || s.id,
    (ARRAY['web_search','read_file','sql_query','send_email'])[1 + s.id % 4],
    json_build_object('query', ({topics})[1 + s.id % 40] || ' prices ' || s.id),
    'found ' || (s.id % 97) || ' results', s.error_type IS NULL, s.created_at
FROM memory_app_step s""",  # noqa: S608 - constants
        # A reviewer's `correct` on one run in five (a third of them false), an evaluator's
        # `quality` on one in ten, a label on one in twenty.
        "scores": """
INSERT INTO memory_app_score (context_id, run_id, author, name, kind, number, comment,
    created_at, updated_at)
SELECT context_id, id, 'user:benchmark', 'correct', 'boolean', (id / 5 % 3 <> 0)::int, '',
    created_at, created_at
FROM memory_app_run WHERE id % 5 = 0
UNION ALL
SELECT context_id, id, 'key:evaluator', 'quality', 'numeric', 1 + id / 10 % 5, '', created_at,
    created_at
FROM memory_app_run WHERE id % 10 = 0""",
        "labels": """
INSERT INTO memory_app_label (context_id, run_id, author, name, created_at)
SELECT context_id, id, 'user:benchmark', 'needs-review', created_at
FROM memory_app_run WHERE id % 20 = 0""",
    }


def counters_sql() -> list[str]:
    """What the write path keeps on runs and contexts, from their rows."""
    return [
        """
UPDATE memory_app_run r SET step_count = s.n, last_position = s.last, error_count = s.errors,
    tool_call_count = s.n, input_tokens = s.i, output_tokens = s.o, total_tokens = s.t,
    cost = s.cost, model_names = s.models
FROM (SELECT context_id, run_id, count(*) AS n, max(position) AS last,
             count(*) FILTER (WHERE error_type IS NOT NULL) AS errors, sum(input_tokens) AS i,
             sum(output_tokens) AS o, sum(total_tokens) AS t, sum(cost) AS cost,
             array_agg(DISTINCT model ORDER BY model)::varchar[] AS models
      FROM memory_app_step GROUP BY context_id, run_id) s
WHERE r.context_id = s.context_id AND r.id = s.run_id""",
        """
UPDATE memory_app_context c SET last_seq = m.n, search_seq = m.n, message_count = m.n,
    token_count = m.tokens, last_activity_at = m.last_at, updated_at = m.last_at
FROM (SELECT context_id, max(seq) AS n, sum(token_count) AS tokens, max(created_at) AS last_at
      FROM memory_app_message GROUP BY context_id) m
WHERE c.id = m.context_id""",
        """
UPDATE memory_app_context c SET run_count = r.n
FROM (SELECT context_id, count(*) AS n FROM memory_app_run GROUP BY context_id) r
WHERE c.id = r.context_id""",
    ]


def vectors_sql() -> list[str]:
    """The full-text vectors as the indexer (messages) and migration 0035's triggers (what runs
    wrote) write them."""
    run_rows = " UNION ALL ".join(
        f"SELECT t.context_id, '{kind}', t.id, {run}, {step},"  # noqa: S608 - constants
        f" memory_app_search_vector('{FTS_CONFIG}', {text})"
        f" FROM {table} t {join} WHERE {text} <> ''"
        for kind, (table, text), run, step, join in (
            ("output", _TEXTS["output"], "t.run_id", "t.id", ""),
            ("error", _TEXTS["error"], "t.run_id", "t.id", ""),
            (
                "tool",
                _TEXTS["tool"],
                "s.run_id",
                "t.step_id",
                "JOIN memory_app_step s ON s.context_id = t.context_id AND s.id = t.step_id",
            ),
        )
    )
    return [
        f"INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)"  # noqa: S608
        f" SELECT context_id, seq, memory_app_search_vector('{FTS_CONFIG}', text)"
        f" FROM memory_app_message ORDER BY context_id, seq",
        "INSERT INTO memory_app_runsearch (context_id, kind, ref_id, run_id, step_id,"
        f" search_vector) {run_rows} ORDER BY 1, 2, 3",
    ]


# One statement after another, each timed: the steps of a build read best as one list.
def build(sizes: FleetSizes, log: Callable[[str], None]) -> dict[str, float]:
    """Load the dataset into the current (empty, migrated) database; the seconds of each step."""
    timings: dict[str, float] = {}
    sql = rows_sql(sizes)
    connection.ensure_connection()
    raw = connection.connection.cursor()
    start = datetime.now(UTC) - timedelta(days=30)
    _copy_contexts(raw, np.random.default_rng(0), sizes.contexts, start)
    raw.close()
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        cursor.execute("SET maintenance_work_mem = '512MB'")
        dropped = []
        for table in FILLED:
            for name, definition in _secondary_indexes(cursor, table):
                cursor.execute(f'DROP INDEX "{name}"')
                dropped.append(definition)
        # The side tables are filled in one pass each below, as migration 0035's backfill does.
        for table in ("memory_app_step", "memory_app_toolcall"):
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        steps = [
            *sql.items(),
            *(("counters", q) for q in counters_sql()),
            *(("full-text vectors", q) for q in vectors_sql()),
            *(("indexes", q) for q in dropped),
        ]
        for i, (name, statement) in enumerate(steps):
            t = time.perf_counter()
            cursor.execute(statement)
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - t
            if i + 1 == len(steps) or steps[i + 1][0] != name:
                log(f"  {name}: {timings[name]:.1f} s")
        for table in ("memory_app_step", "memory_app_toolcall"):
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
        for table in ("context", "message", "run", "step", "toolcall"):
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('memory_app_{table}', 'id'),"  # noqa: S608
                f" (SELECT coalesce(max(id), 1) FROM memory_app_{table}))"
            )
        t = time.perf_counter()
        cursor.execute("VACUUM ANALYZE")
        timings["VACUUM ANALYZE"] = time.perf_counter() - t
        # json, not jsonb: the build steps keep the order they ran in.
        cursor.execute(f"CREATE TABLE {META_TABLE} (data json NOT NULL)")
        cursor.execute(
            f"INSERT INTO {META_TABLE} (data) VALUES (%s)",  # noqa: S608
            [json.dumps({"sizes": asdict(sizes), "build_seconds": timings})],
        )
    return timings


def finished(sizes: FleetSizes) -> dict[str, float] | None:
    """The build's timings when the current database holds a finished dataset of `sizes`."""
    raw = database.stored_meta(META_TABLE)
    data = json.loads(raw) if raw else {}
    return data.get("build_seconds") if data.get("sizes") == asdict(sizes) else None
