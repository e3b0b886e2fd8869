"""Loading the dataset of `memory_app.bench.dataset` into the benchmark database with COPY (not
the ORM row by row): contexts, messages and their vectors context by context, runs with their
steps and tool calls; then the full-text vectors, the indexes dropped for the load, the counters
and the HNSW index. The counters (Context.last_seq, message_count, token_count, run_count;
Run.step_count, error_count, last_position, token totals) are set from the loaded rows with one
SQL statement each, so they agree with what the write path would have kept.

The random draws happen in one fixed order from the generator's seed, so the same sizes always
load the same rows: a reused database (keyed by its sizes) holds what a fresh build would. Keep
that order when changing anything here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
from django.db import connection, transaction

from memory_app import pricing, tokens
from memory_app.bench.columns import (
    CONTEXT_COLUMNS,
    EMBEDDING_COLUMNS,
    EMBEDDING_TYPES,
    MESSAGE_COLUMNS,
    RUN_COLUMNS,
    STEP_COLUMNS,
    TOOLCALL_COLUMNS,
    copy_sql,
)
from memory_app.bench.dataset import (
    BENCH_MODEL,
    N_TOPICS,
    TOOLS,
    Dataset,
    Generator,
    Sizes,
    context_sizes,
    run_sizes,
)
from memory_app.embeddings import indexer
from memory_app.models import FTS_CONFIG, EmbeddingModel, keys_digest

RUN_STATUSES = ["success", "failed", "max_steps_error", "cancelled", "running"]
RUN_STATUS_SHARES = [0.88, 0.06, 0.02, 0.02, 0.02]
RUN_MODELS = ["gpt-4o-mini", "gpt-4o", "claude-sonnet-4"]
# Messages generated, counted and loaded at a time (bounds the builder's memory).
CHUNK = 100_000
LOADED_TABLES = (
    "memory_app_message",
    "memory_app_messagesearch",
    "memory_app_step",
    "memory_app_toolcall",
    "memory_app_embedding",
)


def _secondary_indexes(cursor, table: str) -> list[tuple[str, str]]:
    """(name, definition) of indexes not backing a constraint: dropped during the load, rebuilt
    after (one sort instead of 200,000 insertions into a GIN index)."""
    cursor.execute(
        """
        SELECT i.indexname, i.indexdef FROM pg_indexes i
        WHERE i.tablename = %s AND NOT EXISTS (
            SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname
        )
        """,
        [table],
    )
    return cursor.fetchall()


def build(*, sizes: Sizes, log: Callable[[str], None] = print, chunk: int = CHUNK) -> Dataset:
    """Load the dataset into the (empty, migrated) current database, `chunk` messages at a time."""
    gen = Generator(sizes)
    rng = gen.rng
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(days=30)

    per_context = context_sizes(sizes, rng)
    context_topics = {
        cid: [int(t) for t in rng.choice(N_TOPICS, size=3, replace=False)]
        for cid in range(1, len(per_context) + 1)
    }
    tokenizer = tokens.default_tokenizer_name()
    # Vectors are stored and searched only under a registered model; the dataset's is the
    # bench's own, in a database of its own.
    EmbeddingModel.objects.update_or_create(
        name=BENCH_MODEL, defaults={"dimensions": sizes.dims, "created_by": "system:benchmark"}
    )
    dropped = _open_for_load()
    raw = connection.connection.cursor()
    _copy_contexts(raw, rng, len(per_context), start)

    t_msg = time.perf_counter()
    vec_seconds = _copy_messages(
        raw,
        gen,
        per_context,
        context_topics,
        start=start,
        tokenizer=tokenizer,
        chunk=chunk,
        log=log,
    )
    timings["messages (COPY, incl. texts and token counts)"] = (
        time.perf_counter() - t_msg - vec_seconds
    )
    timings["vectors (COPY binary)"] = vec_seconds

    t_runs = time.perf_counter()
    per_run = run_sizes(sizes, rng)
    run_contexts = _copy_runs(raw, gen, per_run, context_topics, start)
    steps_rows, calls_rows = _steps_and_calls(gen, per_run, run_contexts, now)
    _copy_rows(raw, "memory_app_step", STEP_COLUMNS, steps_rows)
    _copy_rows(raw, "memory_app_toolcall", TOOLCALL_COLUMNS, calls_rows)
    raw.close()
    timings["runs, steps, tool calls (COPY)"] = time.perf_counter() - t_runs
    log(f"  runs: {len(per_run):,}, steps: {len(steps_rows):,}, tool calls: {len(calls_rows):,}")

    _timed(timings, "full-text vectors (to_tsvector)", _fill_fulltext)
    _timed(timings, "indexes rebuilt, counters set", lambda: _restore_indexes(dropped))
    _timed(
        timings,
        f"HNSW index (m={_hnsw_m()}, ef_construction={_hnsw_efc()})",
        lambda: _build_hnsw(sizes),
    )
    _timed(timings, "VACUUM ANALYZE", _vacuum_analyze)
    timings["total"] = time.perf_counter() - t0
    # The vector adapters registered for the binary COPY stay off the connection the
    # measurements use (the ORM expects pgvector.django's own conversions).
    connection.close()
    return Dataset(
        sizes=sizes,
        largest_context_id=1,
        small_context_id=_median_context(per_context),
        long_run_id=1,
        transcript_run_id=2 if len(per_run) > 1 else 1,
        topic_words=gen.topic_words,
        context_topics=context_topics,
        build_seconds=timings,
    )


def _timed(timings: dict[str, float], name: str, step: Callable[[], None]) -> None:
    t = time.perf_counter()
    step()
    timings[name] = time.perf_counter() - t


def _open_for_load() -> list[str]:
    """Ready the connection for the binary COPY and drop the secondary indexes of the loaded
    tables; returns their definitions, to be rebuilt after the load."""
    connection.ensure_connection()
    from pgvector.psycopg import register_vector

    register_vector(connection.connection)
    dropped = []
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        for table in LOADED_TABLES:
            for name, definition in _secondary_indexes(cursor, table):
                cursor.execute(f'DROP INDEX "{name}"')
                dropped.append(definition)
    return dropped


def _copy_rows(raw, table: str, columns: tuple[str, ...], rows: Iterable[tuple]) -> None:
    with raw.copy(copy_sql(table, columns)) as copy:
        for row in rows:
            copy.write_row(row)


def _copy_contexts(raw, rng: np.random.Generator, n_contexts: int, start: datetime) -> None:
    """The contexts, their counters 0 (filled in from the rows afterwards)."""
    with raw.copy(copy_sql("memory_app_context", CONTEXT_COLUMNS)) as copy:
        for cid in range(1, n_contexts + 1):
            keys = {"tenant": f"t{cid % 7}", "user": f"user{cid}", "chat": str(cid)}
            created = start + timedelta(seconds=int(rng.integers(0, 86400)))
            copy.write_row(
                (
                    cid,
                    json.dumps(keys),
                    keys_digest(keys),
                    f"Bench context {cid}",
                    "{}",
                    "",
                    0,
                    0,
                    0,
                    0,
                    created,
                    created,
                    created,
                )
            )
    # Found by their keys as any context is: through the digest table.
    raw.execute(
        "INSERT INTO memory_app_contextkey (digest, target_id)"
        " SELECT keys_digest, id FROM memory_app_context"
    )


_ROLES = np.array(["user", "assistant", "tool-call", "tool-response"], dtype=object)


@dataclass
class _ContextMessages:
    """One context's messages before their texts: the topic, role and pruned flag of each."""

    cid: int
    topics: np.ndarray
    roles: np.ndarray
    pruned: np.ndarray
    start: datetime

    @classmethod
    def draw(
        cls, rng: np.random.Generator, cid: int, topics_of: list[int], count: int, start: datetime
    ) -> _ContextMessages:
        """Mostly the context's own topics, sometimes any; a system prompt first, the user's
        current prompt last (as an agent's context holds it when it reads); 1 % pruned."""
        topics_arr = np.array(topics_of)
        topics = np.where(
            rng.random(count) < 0.85,
            rng.choice(topics_arr, size=count),
            rng.integers(0, N_TOPICS, size=count),
        )
        roles = rng.choice(_ROLES, size=count, p=[0.42, 0.42, 0.08, 0.08])
        roles[0] = "system"
        roles[-1] = "user"
        pruned = rng.random(count) < 0.01
        pruned[-1] = False
        return cls(cid, topics, roles, pruned, start)

    def rows(self, lo: int, texts: list[str], counts: list[int], first_id: int, tokenizer: str):
        """Message rows `lo`, `lo + 1`, … of the context, with ids from `first_id + 1`."""
        step_seconds = max(1, 86400 * 25 / max(len(self.topics), 1))
        for k, text in enumerate(texts):
            i = lo + k
            at = self.start + timedelta(seconds=int(i * step_seconds))
            pruned = self.pruned[i]
            yield (
                first_id + k + 1,
                self.cid,
                i + 1,
                self.roles[i],
                "",
                text,
                ["important"] if i % 97 == 0 else [],
                "{}",
                counts[k],
                tokenizer,
                "",
                at,
                at,
                at if pruned else None,
                "bench" if pruned else "",
            )


def _copy_messages(
    raw,
    gen: Generator,
    per_context: list[int],
    context_topics: dict[int, list[int]],
    *,
    start: datetime,
    tokenizer: str,
    chunk: int,
    log: Callable[[str], None],
) -> float:
    """Messages and their vectors, context by context; returns the seconds spent on vectors."""
    message_id = 0
    vec_seconds = 0.0
    for cid, count in enumerate(per_context, start=1):
        plan = _ContextMessages.draw(gen.rng, cid, context_topics[cid], count, start)
        # In chunks: a million-message context must not hold a million texts and vectors at once.
        for lo in range(0, count, chunk):
            hi = min(lo + chunk, count)
            texts = gen.texts(plan.topics[lo:hi])
            if lo == 0:
                texts[0] = "You are a helpful assistant. " + texts[0]
            counts = tokens.count_tokens(texts, tokenizer=tokenizer)
            rows = plan.rows(lo, texts, counts, message_id, tokenizer)
            _copy_rows(raw, "memory_app_message", MESSAGE_COLUMNS, rows)
            tv = time.perf_counter()
            _copy_vectors(raw, cid, gen.vectors(plan.topics[lo:hi]), message_id, gen.sizes.dims)
            vec_seconds += time.perf_counter() - tv
            message_id += hi - lo
            if count > chunk:
                log(f"  messages: context {cid}, {hi:,}/{count:,} rows")
        if cid == 1 or cid % 200 == 0:
            log(f"  messages: context {cid}/{len(per_context)}, {message_id:,} rows")
    return vec_seconds


def _copy_vectors(raw, cid: int, vectors: np.ndarray, first_id: int, dims: int) -> None:
    with raw.copy(copy_sql("memory_app_embedding", EMBEDDING_COLUMNS, binary=True)) as copy:
        copy.set_types(EMBEDDING_TYPES)
        for i in range(len(vectors)):
            copy.write_row((first_id + i + 1, cid, BENCH_MODEL, dims, vectors[i]))


def _copy_runs(
    raw,
    gen: Generator,
    per_run: list[int],
    context_topics: dict[int, list[int]],
    start: datetime,
) -> list[int]:
    """The runs: the first two (the longest and the transcript one) in the largest context, the
    others anywhere; counters 0, set from the steps afterwards. Returns each run's context."""
    rng, n_contexts = gen.rng, len(context_topics)
    run_contexts = []
    with raw.copy(copy_sql("memory_app_run", RUN_COLUMNS)) as copy:
        for rid, n_steps in enumerate(per_run, start=1):
            cid = 1 if rid <= 2 else int(rng.integers(1, n_contexts + 1))
            run_contexts.append(cid)
            topic = context_topics[cid][0]
            task = gen.texts(np.array([topic]))[0]
            started = start + timedelta(seconds=int(rng.integers(0, 86400 * 25)))
            finished = started + timedelta(seconds=n_steps * 3)
            # Most runs succeed; the runs table's filters need some of every status and model.
            status = "success" if rid <= 2 else str(rng.choice(RUN_STATUSES, p=RUN_STATUS_SHARES))
            running = status == "running"
            copy.write_row(
                (
                    rid,
                    cid,
                    task,
                    "You are an expert assistant who can solve any task using tools.",
                    "bench-agent",
                    "smolagents",
                    status,
                    None if running else json.dumps("done"),
                    started,
                    None if running else finished,
                    None if running else n_steps * 3.0,
                    0,
                    0,
                    0,
                    json.dumps({"model": RUN_MODELS[rid % len(RUN_MODELS)]}),
                    started,
                    finished,
                )
            )
    return run_contexts


def _steps_and_calls(
    gen: Generator, per_run: list[int], run_contexts: list[int], now: datetime
) -> tuple[list[tuple], list[tuple]]:
    """Step rows and tool-call rows of every run: a task step, action steps (1 in 33 failing, each
    with one or two tool calls) and, in runs of more than two steps, a final answer. Ids are
    positions in the lists, from 1."""
    rng = gen.rng
    steps_rows: list[tuple] = []
    calls_rows: list[tuple] = []
    for rid, (n_steps, cid) in enumerate(zip(per_run, run_contexts, strict=True), start=1):
        outputs = gen.texts(rng.integers(0, N_TOPICS, size=n_steps))
        observations = gen.texts(rng.integers(0, N_TOPICS, size=n_steps))
        t = time.time() - 86400
        for pos in range(1, n_steps + 1):
            kind = (
                "task"
                if pos == 1
                else ("final_answer" if pos == n_steps and n_steps > 2 else "action")
            )
            error = kind == "action" and rng.random() < 0.03
            tin, tout = int(rng.integers(500, 4000)), int(rng.integers(20, 400))
            step_id = len(steps_rows) + 1
            output, observation = outputs[pos - 1], observations[pos - 1]
            tokens = (tin, tout)
            row = _step_row(step_id, rid, pos, kind, output, observation, error, tokens, t, now)
            steps_rows.append((cid, *row))
            t += 3
            if kind == "action":
                calls_rows += [
                    (cid, *row)
                    for row in _tool_calls(rng, step_id, len(calls_rows), observation, error, now)
                ]
    return steps_rows, calls_rows


def _step_row(
    step_id: int,
    rid: int,
    pos: int,
    kind: str,
    output: str,
    observation: str,
    error: bool,
    token_counts: tuple[int, int],
    t: float,
    now: datetime,
) -> tuple:
    action = kind == "action"
    tin, tout = token_counts
    return (
        step_id,
        rid,
        pos,
        kind,
        pos - 1 if action else None,
        output if kind == "task" else None,
        None,
        json.dumps(output) if action else None,
        None,
        observation if action else None,
        "AgentExecutionError" if error else None,
        "tool failed: timeout" if error else None,
        t,
        t + 2.5,
        2.5,
        tin if action else None,
        tout if action else None,
        tin + tout if action else None,
        kind == "final_answer",
        "",
        now,
    )


def _tool_calls(
    rng: np.random.Generator,
    step_id: int,
    last_call_id: int,
    observation: str,
    error: bool,
    now: datetime,
) -> list[tuple]:
    """One or two tool calls of an action step, ids after `last_call_id`."""
    rows = []
    for cpos in range(1, int(rng.integers(1, 3)) + 1):
        call_id = last_call_id + cpos
        tool = TOOLS[int(rng.integers(0, len(TOOLS)))]
        rows.append(
            (
                call_id,
                step_id,
                cpos,
                f"call_{call_id}",
                tool,
                json.dumps({"query": observation[:60], "limit": 5}),
                observation[:200],
                not error,
                1.2,
                now,
            )
        )
    return rows


def _fill_fulltext() -> None:
    """The steady state: the indexer has parsed every message (memory_app.search.fulltext)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)"
            " SELECT context_id, seq, memory_app_search_vector(%s::regconfig, text)"
            " FROM memory_app_message"
            " WHERE pruned_at IS NULL ORDER BY context_id, seq",
            [FTS_CONFIG],
        )


def _restore_indexes(dropped: list[str]) -> None:
    """Rebuild the indexes dropped for the load, set the counters and the id sequences."""
    with connection.cursor() as cursor:
        _raise_maintenance_work_mem(cursor, "1GB")
        for definition in dropped:
            cursor.execute(definition)
        _set_counters(cursor)
        for table in (
            "memory_app_context",
            "memory_app_message",
            "memory_app_run",
            "memory_app_step",
            "memory_app_toolcall",
            "memory_app_embedding",
        ):
            cursor.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"  # noqa: S608
                f" (SELECT coalesce(max(id), 1) FROM {table}))"
            )


def _build_hnsw(sizes: Sizes) -> None:
    with connection.cursor() as cursor:
        # A million 384-d vectors need ~2 GB for the graph to be built in memory.
        _raise_maintenance_work_mem(cursor, "1GB" if sizes.messages <= 300_000 else "3GB")
    # In a transaction the index is built in one pass with parallel workers (CONCURRENTLY
    # would scan the table twice; nothing else writes to this database meanwhile).
    with transaction.atomic():
        indexer.ensure_model_index(model=BENCH_MODEL, dimensions=sizes.dims)


def _vacuum_analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def _raise_maintenance_work_mem(cursor, size: str) -> None:
    """SET maintenance_work_mem to `size` unless the server's setting is already larger."""
    cursor.execute(
        "SELECT pg_size_bytes(current_setting('maintenance_work_mem')) < pg_size_bytes(%s)", [size]
    )
    if cursor.fetchone()[0]:
        cursor.execute(f"SET maintenance_work_mem = '{size}'")


def _hnsw_m() -> int:
    from django.conf import settings

    return settings.AGENTMEMORY_HNSW_M


def _hnsw_efc() -> int:
    from django.conf import settings

    return settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION


def _median_context(per_context: list[int]) -> int:
    """A typical small context: the one of median size (ids are 1-based positions)."""
    order = sorted(range(len(per_context)), key=lambda i: per_context[i])
    return order[len(order) // 2] + 1


def _set_counters(cursor) -> None:
    """The counters the write path keeps, computed from the rows (so they are consistent)."""
    cursor.execute(
        """
        UPDATE memory_app_context c SET last_seq = s.last_seq, search_seq = s.last_seq,
            message_count = s.n, token_count = s.tokens, last_activity_at = s.last_at,
            updated_at = s.last_at
        FROM (SELECT context_id, max(seq) AS last_seq, count(*) AS n, sum(token_count) AS tokens,
                     max(created_at) AS last_at
              FROM memory_app_message GROUP BY context_id) s
        WHERE c.id = s.context_id
        """
    )
    cursor.execute(
        """
        UPDATE memory_app_context c SET run_count = r.n
        FROM (SELECT context_id, count(*) AS n FROM memory_app_run GROUP BY context_id) r
        WHERE c.id = r.context_id
        """
    )
    cursor.execute(
        """
        UPDATE memory_app_run r SET step_count = s.n, last_position = s.last_position,
            error_count = s.errors, input_tokens = s.i, output_tokens = s.o, total_tokens = s.t
        FROM (SELECT run_id, count(*) AS n, max(position) AS last_position,
                     count(*) FILTER (WHERE error_type IS NOT NULL) AS errors,
                     sum(input_tokens) AS i, sum(output_tokens) AS o, sum(total_tokens) AS t
              FROM memory_app_step GROUP BY run_id) s
        WHERE r.id = s.run_id
        """
    )
    cursor.execute(
        """
        UPDATE memory_app_run r SET tool_call_count = c.n
        FROM (SELECT s.run_id, count(*) AS n FROM memory_app_toolcall t
              JOIN memory_app_step s ON s.id = t.step_id GROUP BY s.run_id) c
        WHERE r.id = c.run_id
        """
    )
    # The steps name no model: the run's metadata does, and prices their tokens (as the write
    # path's `runs_recount` would).
    for model in RUN_MODELS:
        price = pricing.model_price(model) or (0.0, 0.0)
        cursor.execute(
            """
            UPDATE memory_app_run SET model_names = ARRAY[%s]::varchar[],
                cost = (coalesce(input_tokens, 0) * %s + coalesce(output_tokens, 0) * %s)
                    / 1000000.0
            WHERE metadata->>'model' = %s
            """,
            [model, price[0], price[1], model],
        )
