"""Small builders for tests, all through the real write path (`memory_app.services`)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.apps import apps
from django.contrib.auth.models import Group, User
from django.db import connection

from memory_app.models import Context, Run
from memory_app.roles import sync_role_groups
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, run_finish, steps_append

_counter = itertools.count(1)
TEST_PASSWORD = "pw-for-tests-1"  # noqa: S105 - test users only


def make_user(
    *, role: str | None = "viewer", username: str | None = None, password: str = TEST_PASSWORD
) -> User:
    """A dashboard user in the group `role` (viewer / curator / admin), or in none."""
    if role and not Group.objects.filter(name=role).exists():
        # A transactional test elsewhere flushed the tables (and the groups the migration made).
        sync_role_groups()
    user = User.objects.create_user(username=username or f"user{next(_counter)}", password=password)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def make_context(
    *, keys: dict[str, Any] | None = None, title: str = "", messages: int = 0, **message_fields
) -> Context:
    """A context with `messages` simple alternating user/assistant messages."""
    context, _ = context_get_or_create(keys=keys or {"test": f"ctx{next(_counter)}"}, title=title)
    if messages:
        add_messages(context=context, count=messages, **message_fields)
    context.refresh_from_db()
    return context


def add_messages(
    *, context: Context, count: int, batch: int = 1000, text: str = "message {i}", **fields
):
    done = 0
    while done < count:
        size = min(batch, count - done)
        items = [
            {
                "role": "user" if (done + i) % 2 == 0 else "assistant",
                "text": text.format(i=done + i + 1),
                **fields,
            }
            for i in range(size)
        ]
        messages_append(context=context, items=items)
        done += size


def action_step(number: int, **overrides) -> dict[str, Any]:
    """A smolagents-like ActionStep as the API would store it, with one tool call."""
    start = 1_700_000_000.0 + number * 2
    step = {
        "kind": "action",
        "step_number": number,
        "model_input_messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are a careful agent."}]},
            {"role": "user", "content": [{"type": "text", "text": "New task:\nFind the weather."}]},
        ],
        "model_output": f"I will call a tool (step {number}).",
        "observations": f"Observation for step {number}",
        "start_time": start,
        "end_time": start + 0.5 + (number % 7) * 0.3,
        "input_tokens": 100 + number,
        "output_tokens": 20 + number % 5,
        "tool_calls": [
            {
                "call_id": f"call_{number}",
                "name": "get_weather",
                "arguments": {"city": "Paris", "step": number},
                "output": "Sunny, 22C",
                "success": True,
                "duration": 0.2,
            },
        ],
    }
    step.update(overrides)
    return step


def make_run(
    *,
    context: Context,
    steps: int = 3,
    error_at: tuple[int, ...] = (),
    task: str = "Find the weather in Paris",
    status: str = "success",
    batch: int = 500,
    **step_overrides,
) -> Run:
    """A finished run: a task step, then `steps - 1` action steps; errors at the given positions."""
    run, _ = run_create(
        context=context,
        task=task,
        system_prompt="You are a careful agent.",
        agent_name="tester",
        framework="smolagents",
    )
    items: list[dict[str, Any]] = [{"kind": "task", "task": task}]
    for position in range(2, steps + 1):
        extra = dict(step_overrides)
        if position in error_at:
            extra.update(
                error_type="AgentExecutionError", error_message=f"Tool failed at step {position}"
            )
        items.append(action_step(position - 1, **extra))
    for start in range(0, len(items), batch):
        steps_append(run=run, items=items[start : start + batch])
    return run_finish(run=run, status=status)


def register_models(**dimensions: int) -> None:
    """Register embedding models by name (`register_models(**{"inline-3": 3})`) through the
    service, as an operator would: vectors are accepted only under registered names."""
    from memory_app.audit import Actor
    from memory_app.services.embedding_models import embedding_model_register

    for name, dims in dimensions.items():
        embedding_model_register(name=name, dimensions=dims, actor=Actor.system("test"))


BACKUP_HEADER = {"type": "header", "format": "agentmemory-backup", "version": 3, "embeddings": True}
# The kinds a version 2 file holds (its trailer counts these), then those version 3 added.
BACKUP_KINDS_V2 = ("context", "run", "step", "message", "memory", "embedding")
BACKUP_KINDS = (
    *BACKUP_KINDS_V2[:4],
    "score",
    "label",
    "comment",
    "checkpoint",
    "checkpoint_blob",
    "checkpoint_write",
    "memory",
    "memory_version",
    "embedding",
)


def backup_file(records: list[Any]) -> str:
    """A backup file of `records` (the header first), signed by `signed_backup`."""
    return signed_backup([json.dumps(r) + "\n" for r in records])


def signed_backup(lines: list[str]) -> str:
    """These lines (each ending in a newline, the header first) and the trailer export writes
    after them: the number of lines of each kind and the sha256 of every byte before it,
    computed here (not by the server's code) so a test of what the server checks does not grade
    its own answer."""
    version_2 = bool(lines) and re.search(r'"version": ?2\b', lines[0]) is not None
    counts = dict.fromkeys(BACKUP_KINDS_V2 if version_2 else BACKUP_KINDS, 0)
    for line in lines:
        # Read off the line's start (every record begins with its type), not parsed: tests sign
        # lines nested too deep for a parser on purpose.
        kind = re.match(r'\{"type": ?"(\w+)"', line)
        if kind and kind[1] in counts:
            counts[kind[1]] += 1
    body = "".join(lines)
    digest = hashlib.sha256(body.encode()).hexdigest()
    return body + json.dumps({"type": "trailer", "counts": counts, "sha256": digest}) + "\n"


def analyse(*tables: str) -> None:
    """ANALYZE `tables` (names without the memory_app_ prefix) as this test's transaction sees
    them, and keep autovacuum from analysing them again until it ends: an autovacuum left over
    from an earlier test's rolled-back bulk load sees none of this test's uncommitted rows, and
    its statistics (an empty table) would turn the planner to sequential scans mid-test. The
    lock is the one VACUUM and ANALYZE take; a running autovacuum yields to it."""
    names = ", ".join(f"memory_app_{t}" for t in tables)
    with connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {names} IN SHARE UPDATE EXCLUSIVE MODE")
        for table in tables:
            cursor.execute(f"ANALYZE memory_app_{table}")


def load_fleet(*, runs: int, steps_per_run: int, messages: int, contexts: int) -> list[Context]:
    """Contexts (keys `tenant` t0…t6 and `user`) holding runs, steps, tool calls, scores,
    labels and messages loaded by the fleet benchmark's own SQL (`memory_app.bench.fleet_data`:
    thousands of rows in a second, where the write path takes minutes), with the counters and
    full-text vectors the write path keeps, analysed."""
    from memory_app.bench.fleet_data import FleetSizes, counters_sql, rows_sql, vectors_sql

    made = [make_context(keys={"tenant": f"t{i % 7}", "user": f"u{i}"}) for i in range(contexts)]
    first = made[0].pk
    # The statements give the rows of the n-th context to the id `first + n`.
    assert [c.pk for c in made] == list(range(first, first + contexts))
    sizes = FleetSizes(runs=runs, steps_per_run=steps_per_run, messages=messages, contexts=contexts)
    with connection.cursor() as cursor:
        for statement in rows_sql(sizes, first=first).values():
            cursor.execute(statement)
        for statement in counters_sql():
            cursor.execute(statement)
        # The messages' vectors, as the indexer writes them (the triggers wrote the runs').
        cursor.execute(vectors_sql()[0])
        # As autovacuum would have by now: the GIN pending lists merged (the planner prices a
        # long pending list, which holds every row here).
        for index in (
            "message_search_gin",
            *(f"run_search_{k}_gin" for k in ("output", "error", "tool")),
        ):
            cursor.execute("SELECT gin_clean_pending_list(%s::regclass)", [index])
    analyse("context", "message", "messagesearch", "run", "step", "toolcall", "runsearch")
    analyse("score", "label")
    for context in made:
        context.refresh_from_db()
    return made


def plan_nodes(sql: str, settings: list[str] = ()) -> list[dict]:
    """Every node of the plan of `sql` (a captured query) under `settings` (SET LOCAL
    statements, as the code ran it with), in a savepoint that takes the settings back.

    Sequential scans are priced out: on a test's few thousand rows a scan is the cheaper plan,
    at a million rows it is seconds. A Seq Scan left in the plan is one no index can replace:
    the query's shape, not the table's size, calls for it."""
    from django.db import transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = on")
        for setting in settings:
            cursor.execute(setting)
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes, todo = [], [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo += node.get("Plans", [])
    return nodes


def run_benchmark(
    *args: str, db_suffix: str, output: Path, timeout: int, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, str]:
    """`manage.py benchmark ARGS` in a process of its own from the project's root, on a
    database named after the suite's (`<test db>_<db_suffix>`), its report written to `output`;
    the finished process (output captured as text) and the database's name."""
    db_name = f"{os.environ.get('AGENTMEMORY_TEST_DB_NAME', 'test_agentmemory')}_{db_suffix}"
    command = [sys.executable, "manage.py", "benchmark", *args, "--db-name", db_name]
    proc = subprocess.run(
        [*command, "--output", str(output)],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, db_name


def prepared_plans(like: str) -> list[tuple[str, int, int]]:
    """(text, generic plans, custom plans) of each statement prepared on the test's connection
    whose text (its placeholders numbered, `$1`...) is LIKE `like`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            [like],
        )
        return cursor.fetchall()


def context_tables() -> set[str]:
    """The tables of a context's rows: those whose rows always carry a context (distributed by
    it on Citus, docs/scale-out.md), the contexts themselves aside."""
    return {
        model._meta.db_table
        for model in apps.get_app_config("memory_app").get_models()
        for f in model._meta.concrete_fields
        if f.attname == "context_id" and not f.null
    }


# A `context_id` condition naming a context: `= 7`, `IN (7, 8)`, or a correlated subquery's
# `= ("memory_app_score"."context_id")`.
NAMES_CONTEXT = r'\."context_id"\s*(?:IN\s*\(\d|=\s*(?:\d|\(?(?:"\w+"|[A-Z]\d+)\."context_id"))'


def without_their_context(statements: list[str]) -> list[str]:
    """Each of Django's statements (its quoted table names, its `U0` aliases) that reads,
    updates or deletes a context's rows without naming their context: each table of context
    rows it names (or that table's alias) needs a `context_id` condition: equal to a value or
    to another row's `context_id` (a correlated subquery's), not to a context's id (a join of
    `memory_app_context` names no context). The statements are the `sql` of what
    `CaptureQueriesContext` captured (its parameters in place)."""
    tables = "|".join(sorted(context_tables()))
    named = re.compile(rf'\b(?:FROM|JOIN|UPDATE)\s+"({tables})"(?:\s+(?:AS\s+)?([A-Z]\d+)\b)?')
    missing = []
    for sql in statements:
        for m in named.finditer(sql):
            table = m.group(2) or f'"{m.group(1)}"'
            if not re.search(rf"{re.escape(table)}{NAMES_CONTEXT}", sql):
                missing.append(f"{m.group(1)}: {sql}")
    return missing
