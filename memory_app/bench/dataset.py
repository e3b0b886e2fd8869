"""A synthetic but realistic dataset, loaded with COPY (not the ORM row by row).

Shape (default sizes): 200,000 messages over 1,000 contexts, one of them holding half of all
messages (100,000) and a few more large ones; the rest follow a long-tailed distribution. 2,000
runs, one of `max_steps` steps and one of `transcript_steps` in the largest context, the others
short; action steps carry one or two tool calls, a few carry errors. Texts come from a fixed
pseudo-word vocabulary grouped in topics (so keyword queries match a realistic share of rows);
every message with text has a 384-dimension vector built from the same topic (topic centre +
subtopic + a spread, normalised), as real embeddings cluster by subject. The spread lies mostly
in a few directions of its subtopic's own (`local_dims`) plus a little isotropic noise, so the
vectors' local intrinsic dimension is that of real sentence embeddings (see `Generator`).

Counters (Context.last_seq, message_count, token_count, run_count; Run.step_count,
error_count, last_position, token totals) are set from the loaded rows with one SQL statement
each, so they agree with what the write path would have kept.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
from django.db import connection, transaction

from memory_app import tokens
from memory_app.embeddings import indexer
from memory_app.models import FTS_CONFIG, keys_digest

BENCH_MODEL = "bench-minilm-384"
N_TOPICS = 40
N_SUBTOPICS = 12
# Calibrated on all-MiniLM-L6-v2 vectors of real sentences (Generator's docstring).
LOCAL_DIMS = 24
LOCAL_SPREAD = 0.6
ISOTROPIC_NOISE = 0.1
TOOLS = [
    "web_search",
    "visit_webpage",
    "python_interpreter",
    "calculator",
    "weather",
    "sql_query",
    "read_file",
]


@dataclass(frozen=True)
class Sizes:
    messages: int = 200_000
    contexts: int = 1_000
    runs: int = 2_000
    max_steps: int = 2_000
    transcript_steps: int = 1_000
    dims: int = 384
    seed: int = 7
    # Messages of the largest context; 0: half of all messages.
    largest: int = 0
    # Directions of each subtopic's spread (see Generator.vectors); 0: isotropic noise in every
    # dimension, the vectors of the reports before 2026-11-23 (a stress case for the index).
    local_dims: int = LOCAL_DIMS

    @classmethod
    def quick(cls) -> Sizes:
        return cls(messages=3_000, contexts=12, runs=12, max_steps=120, transcript_steps=60)

    @classmethod
    def scale(cls) -> Sizes:
        """Issue 11's scale: 1,000,000 messages in one context, 1,200,000 vectors in the store
        (the other large contexts hold 60,000, 30,000 and 15,000 messages)."""
        return cls(messages=1_200_000, largest=1_000_000)

    @property
    def largest_messages(self) -> int:
        return self.largest or self.messages // 2

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Dataset:
    """What the measurements need to know about the loaded data."""

    sizes: Sizes
    largest_context_id: int
    small_context_id: int
    long_run_id: int
    transcript_run_id: int
    model: str = BENCH_MODEL
    topic_words: list[list[str]] = field(default_factory=list)
    context_topics: dict[int, list[int]] = field(default_factory=dict)
    build_seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "sizes"}
        data["sizes"] = self.sizes.as_dict()
        data["context_topics"] = {str(k): v for k, v in self.context_topics.items()}
        # jsonb does not keep key order: the build steps are stored as pairs.
        data["build_seconds"] = list(self.build_seconds.items())
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Dataset:
        data = json.loads(text)
        # A dataset stored before a field existed was built as that field's 0 describes.
        data["sizes"] = Sizes(**{"largest": 0, "local_dims": 0, **data["sizes"]})
        data["context_topics"] = {int(k): v for k, v in data["context_topics"].items()}
        steps = data.get("build_seconds") or []
        data["build_seconds"] = dict(steps) if isinstance(steps, list) else steps
        return cls(**data)


# --- vocabulary and vectors -------------------------------------------------------------------

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def _words(rng: np.random.Generator, count: int, taken: set[str]) -> list[str]:
    out = []
    while len(out) < count:
        syllables = rng.integers(2, 5)
        word = "".join(
            rng.choice(list(_CONSONANTS)) + rng.choice(list(_VOWELS)) for _ in range(syllables)
        )
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


class Generator:
    """Deterministic texts and vectors for a seed.

    Vectors: topic centre + subtopic direction + a spread. Real sentence embeddings vary
    around a subject along a few directions, not in all 384: the local intrinsic dimension (LID,
    Levina-Bickel MLE over 20 neighbours) of all-MiniLM-L6-v2 vectors of real English sentences
    (docstrings of installed packages, embedded offline) is 19.4 over 20,000 of them and 22.7
    over 5,000. A large context's nearest neighbours lie within one subtopic, so that is where
    the generator is calibrated: over 3,000 vectors of one subtopic, isotropic noise in every
    dimension (`local_dims` 0, the generator of the reports before 2026-11-23) gives an LID of
    96: near-equidistant neighbours that no real model produces, which make an approximate
    index look far worse than it is on real data. LOCAL_SPREAD along `local_dims` (24) random
    directions of each subtopic plus ISOTROPIC_NOISE in every dimension gives 20.0 there (and
    10.5 over 20,000 vectors of all topics). tests/test_benchmark.py keeps this calibration.
    """

    def __init__(self, sizes: Sizes):
        self.sizes = sizes
        self.rng = np.random.default_rng(sizes.seed)
        taken: set[str] = set()
        self.common = np.array(_words(self.rng, 800, taken), dtype=object)
        self.topic_words = [_words(self.rng, 30, taken) for _ in range(N_TOPICS)]
        self._topic_arr = [np.array(t, dtype=object) for t in self.topic_words]
        dims = sizes.dims
        self.centres = self._unit(self.rng.normal(size=(N_TOPICS, dims)))
        self.subs = self._unit(self.rng.normal(size=(N_TOPICS, N_SUBTOPICS, dims)))
        local = sizes.local_dims
        # Orthonormal spread directions per subtopic, as rows: (topics * subtopics, local, dims).
        self.bases = (
            np.stack(
                [
                    np.linalg.qr(self.rng.normal(size=(dims, local)))[0].T
                    for _ in range(N_TOPICS * N_SUBTOPICS)
                ]
            )
            if local
            else None
        )

    @staticmethod
    def _unit(a: np.ndarray) -> np.ndarray:
        return a / np.linalg.norm(a, axis=-1, keepdims=True)

    def texts(self, topics: np.ndarray) -> list[str]:
        """One text per message; lengths are long-tailed (a few very long messages)."""
        n = len(topics)
        lengths = np.clip(
            self.rng.lognormal(mean=math.log(28), sigma=0.85, size=n), 3, 1200
        ).astype(int)
        out = []
        for topic, length in zip(topics, lengths, strict=True):
            n_topic = max(1, int(length * 0.3))
            words = np.concatenate(
                [
                    self.rng.choice(self._topic_arr[topic], size=n_topic),
                    self.rng.choice(self.common, size=length - n_topic),
                ]
            )
            self.rng.shuffle(words)
            out.append(" ".join(words))
        return out

    def vectors(self, topics: np.ndarray, subtopics: np.ndarray | None = None) -> np.ndarray:
        n = len(topics)
        if subtopics is None:
            subtopics = self.rng.integers(0, N_SUBTOPICS, size=n)
        dims, local = self.sizes.dims, self.sizes.local_dims
        v = self.centres[topics] + 0.7 * self.subs[topics, subtopics]
        if not local:
            v += 0.6 * self.rng.normal(size=(n, dims)) / math.sqrt(dims)
            return self._unit(v).astype(np.float32)
        z = self.rng.normal(size=(n, local)) / math.sqrt(local)
        group = topics * N_SUBTOPICS + subtopics
        for g in np.unique(group):
            rows = np.nonzero(group == g)[0]
            v[rows] += LOCAL_SPREAD * (z[rows] @ self.bases[g])
        v += ISOTROPIC_NOISE * self.rng.normal(size=(n, dims)) / math.sqrt(dims)
        return self._unit(v).astype(np.float32)

    def query(self, topic: int) -> tuple[str, np.ndarray]:
        """A keyword query (two words of the topic) and a query vector of the same topic."""
        words = self.rng.choice(self._topic_arr[topic], size=2, replace=False)
        return " ".join(words), self.vectors(np.array([topic]))[0]


# --- sizes ------------------------------------------------------------------------------------


def context_sizes(sizes: Sizes, rng: np.random.Generator) -> list[int]:
    """Message count per context: one holding half of everything, a few large, a long tail."""
    total, n = sizes.messages, sizes.contexts
    big = [sizes.largest_messages]
    for share in (20, 40, 80):
        if n > len(big) + 4 and total // share >= 10:
            big.append(total // share)
    rest_contexts = n - len(big)
    rest = total - sum(big)
    if rest_contexts <= 0 or rest < 2 * rest_contexts:
        raise ValueError("too few messages for that many contexts")
    weights = rng.lognormal(mean=0.0, sigma=1.0, size=rest_contexts)
    tail = rng.multinomial(rest - 2 * rest_contexts, weights / weights.sum()) + 2
    return big + [int(x) for x in tail]


def run_sizes(sizes: Sizes, rng: np.random.Generator) -> list[int]:
    """Steps per run: the long one, the transcript one, and short ones (1..60)."""
    n = sizes.runs
    firsts = [sizes.max_steps, sizes.transcript_steps][:n]
    tail = np.clip(
        rng.lognormal(mean=math.log(8), sigma=0.8, size=max(n - len(firsts), 0)), 2, 60
    ).astype(int)
    return firsts + [int(x) for x in tail]


# --- loading ----------------------------------------------------------------------------------

MESSAGE_COLUMNS = (
    "id",
    "context_id",
    "seq",
    "role",
    "name",
    "text",
    "tags",
    "metadata",
    "token_count",
    "tokenizer",
    "source_timestamp",
    "created_at",
    "updated_at",
    "pruned_at",
    "pruned_by",
)
STEP_COLUMNS = (
    "id",
    "run_id",
    "position",
    "kind",
    "step_number",
    "task",
    "plan",
    "model_output",
    "code_action",
    "observations",
    "error_type",
    "error_message",
    "start_time",
    "end_time",
    "duration",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "is_final_answer",
    "pruned_by",
    "created_at",
)
TOOLCALL_COLUMNS = (
    "id",
    "step_id",
    "position",
    "call_id",
    "name",
    "arguments",
    "output",
    "success",
    "duration",
    "created_at",
)
RUN_COLUMNS = (
    "id",
    "context_id",
    "task",
    "system_prompt",
    "agent_name",
    "framework",
    "status",
    "final_answer",
    "started_at",
    "finished_at",
    "duration",
    "step_count",
    "error_count",
    "last_position",
    "metadata",
    "created_at",
    "updated_at",
)
CONTEXT_COLUMNS = (
    "id",
    "keys",
    "keys_digest",
    "title",
    "metadata",
    "compressed_summary",
    "last_seq",
    "message_count",
    "token_count",
    "run_count",
    "created_at",
    "updated_at",
    "last_activity_at",
)
EMBEDDING_COLUMNS = ("message_id", "context_id", "model", "dimensions", "vector")
EMBEDDING_TYPES = ["int8", "int8", "text", "int4", "vector"]
# Messages generated, counted and loaded at a time (bounds the builder's memory).
CHUNK = 100_000
LOADED_TABLES = (
    "memory_app_message",
    "memory_app_messagesearch",
    "memory_app_step",
    "memory_app_toolcall",
    "memory_app_embedding",
)


def _copy_sql(table: str, columns: tuple[str, ...], binary: bool = False) -> str:
    return f"COPY {table} ({', '.join(columns)}) FROM STDIN" + (
        " WITH (FORMAT BINARY)" if binary else ""
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
    n_contexts = len(per_context)
    context_topics = {
        cid: [int(t) for t in rng.choice(N_TOPICS, size=3, replace=False)]
        for cid in range(1, n_contexts + 1)
    }
    tokenizer = tokens.default_tokenizer_name()

    connection.ensure_connection()
    pg = connection.connection
    from pgvector.psycopg import register_vector

    register_vector(pg)
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        dropped = []
        for table in LOADED_TABLES:
            for name, definition in _secondary_indexes(cursor, table):
                cursor.execute(f'DROP INDEX "{name}"')
                dropped.append(definition)

    raw = pg.cursor()
    # Contexts (counters filled in from the rows afterwards).
    with raw.copy(_copy_sql("memory_app_context", CONTEXT_COLUMNS)) as copy:
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

    # Messages and their vectors, context by context.
    message_id = 0
    roles = np.array(["user", "assistant", "tool-call", "tool-response"], dtype=object)
    t_msg = time.perf_counter()
    vec_seconds = 0.0
    for cid, count in enumerate(per_context, start=1):
        topics_of = np.array(context_topics[cid])
        topics = np.where(
            rng.random(count) < 0.85,
            rng.choice(topics_of, size=count),
            rng.integers(0, N_TOPICS, size=count),
        )
        role_of = rng.choice(roles, size=count, p=[0.42, 0.42, 0.08, 0.08])
        role_of[0] = "system"
        role_of[-1] = "user"  # the current prompt, as an agent's context holds it when it reads
        pruned = rng.random(count) < 0.01
        pruned[-1] = False
        step_seconds = max(1, 86400 * 25 / max(count, 1))
        # In chunks: a million-message context must not hold a million texts and vectors at once.
        for lo in range(0, count, chunk):
            hi = min(lo + chunk, count)
            texts = gen.texts(topics[lo:hi])
            if lo == 0:
                texts[0] = "You are a helpful assistant. " + texts[0]
            counts = tokens.count_tokens(texts, tokenizer=tokenizer)
            base_id = message_id
            with raw.copy(_copy_sql("memory_app_message", MESSAGE_COLUMNS)) as copy:
                for i in range(lo, hi):
                    message_id += 1
                    at = start + timedelta(seconds=int(i * step_seconds))
                    tags = ["important"] if i % 97 == 0 else []
                    copy.write_row(
                        (
                            message_id,
                            cid,
                            i + 1,
                            role_of[i],
                            "",
                            texts[i - lo],
                            tags,
                            "{}",
                            counts[i - lo],
                            tokenizer,
                            "",
                            at,
                            at,
                            at if pruned[i] else None,
                            "bench" if pruned[i] else "",
                        )
                    )
            tv = time.perf_counter()
            vectors = gen.vectors(topics[lo:hi])
            with raw.copy(
                _copy_sql("memory_app_embedding", EMBEDDING_COLUMNS, binary=True)
            ) as copy:
                copy.set_types(EMBEDDING_TYPES)
                for i in range(hi - lo):
                    copy.write_row(
                        (base_id + i + 1, cid, BENCH_MODEL, sizes.dims, vectors[i])
                    )
            vec_seconds += time.perf_counter() - tv
            if count > chunk:
                log(f"  messages: context {cid}, {hi:,}/{count:,} rows")
        if cid == 1 or cid % 200 == 0:
            log(f"  messages: context {cid}/{n_contexts}, {message_id:,} rows")
    timings["messages (COPY, incl. texts and token counts)"] = (
        time.perf_counter() - t_msg - vec_seconds
    )
    timings["vectors (COPY binary)"] = vec_seconds

    # Runs, steps, tool calls.
    t_runs = time.perf_counter()
    per_run = run_sizes(sizes, rng)
    step_id = 0
    call_id = 0
    with raw.copy(_copy_sql("memory_app_run", RUN_COLUMNS)) as run_copy:
        for rid, n_steps in enumerate(per_run, start=1):
            cid = 1 if rid <= 2 else int(rng.integers(1, n_contexts + 1))
            topic = context_topics[cid][0]
            task = gen.texts(np.array([topic]))[0]
            started = start + timedelta(seconds=int(rng.integers(0, 86400 * 25)))
            finished = started + timedelta(seconds=n_steps * 3)
            run_copy.write_row(
                (
                    rid,
                    cid,
                    task,
                    "You are an expert assistant who can solve any task using tools.",
                    "bench-agent",
                    "smolagents",
                    "success",
                    json.dumps("done"),
                    started,
                    finished,
                    n_steps * 3.0,
                    0,
                    0,
                    0,
                    "{}",
                    started,
                    finished,
                )
            )
    steps_rows = []
    calls_rows = []
    for rid, n_steps in enumerate(per_run, start=1):
        outputs = gen.texts(rng.integers(0, N_TOPICS, size=n_steps))
        observations = gen.texts(rng.integers(0, N_TOPICS, size=n_steps))
        t = time.time() - 86400
        for pos in range(1, n_steps + 1):
            step_id += 1
            kind = (
                "task"
                if pos == 1
                else ("final_answer" if pos == n_steps and n_steps > 2 else "action")
            )
            error = kind == "action" and rng.random() < 0.03
            tin, tout = int(rng.integers(500, 4000)), int(rng.integers(20, 400))
            steps_rows.append(
                (
                    step_id,
                    rid,
                    pos,
                    kind,
                    pos - 1 if kind == "action" else None,
                    outputs[pos - 1] if kind == "task" else None,
                    None,
                    json.dumps(outputs[pos - 1]) if kind == "action" else None,
                    None,
                    observations[pos - 1] if kind == "action" else None,
                    "AgentExecutionError" if error else None,
                    "tool failed: timeout" if error else None,
                    t,
                    t + 2.5,
                    2.5,
                    tin if kind == "action" else None,
                    tout if kind == "action" else None,
                    tin + tout if kind == "action" else None,
                    kind == "final_answer",
                    "",
                    now,
                )
            )
            t += 3
            if kind == "action":
                for cpos in range(1, int(rng.integers(1, 3)) + 1):
                    call_id += 1
                    tool = TOOLS[int(rng.integers(0, len(TOOLS)))]
                    calls_rows.append(
                        (
                            call_id,
                            step_id,
                            cpos,
                            f"call_{call_id}",
                            tool,
                            json.dumps({"query": observations[pos - 1][:60], "limit": 5}),
                            observations[pos - 1][:200],
                            not error,
                            1.2,
                            now,
                        )
                    )
    with raw.copy(_copy_sql("memory_app_step", STEP_COLUMNS)) as copy:
        for row in steps_rows:
            copy.write_row(row)
    with raw.copy(_copy_sql("memory_app_toolcall", TOOLCALL_COLUMNS)) as copy:
        for row in calls_rows:
            copy.write_row(row)
    raw.close()
    timings["runs, steps, tool calls (COPY)"] = time.perf_counter() - t_runs
    log(f"  runs: {len(per_run):,}, steps: {step_id:,}, tool calls: {call_id:,}")

    t_fts = time.perf_counter()
    with connection.cursor() as cursor:
        # The steady state: the indexer has parsed every message (memory_app.search.fulltext).
        cursor.execute(
            "INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)"
            " SELECT context_id, seq, to_tsvector(%s::regconfig, text) FROM memory_app_message"
            " WHERE pruned_at IS NULL ORDER BY context_id, seq",
            [FTS_CONFIG],
        )
    timings["full-text vectors (to_tsvector)"] = time.perf_counter() - t_fts
    t_idx = time.perf_counter()
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
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT coalesce(max(id), 1) FROM {table}))"  # noqa: S608
            )
    timings["indexes rebuilt, counters set"] = time.perf_counter() - t_idx
    t_hnsw = time.perf_counter()
    with connection.cursor() as cursor:
        # A million 384-d vectors need ~2 GB for the graph to be built in memory.
        _raise_maintenance_work_mem(cursor, "1GB" if sizes.messages <= 300_000 else "3GB")
    # In a transaction the index is built in one pass with parallel workers (CONCURRENTLY
    # would scan the table twice; nothing else writes to this database meanwhile).
    with transaction.atomic():
        indexer.ensure_model_index(model=BENCH_MODEL, dimensions=sizes.dims)
    timings[f"HNSW index (m={_hnsw_m()}, ef_construction={_hnsw_efc()})"] = (
        time.perf_counter() - t_hnsw
    )
    t_vac = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    timings["VACUUM ANALYZE"] = time.perf_counter() - t_vac
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
        UPDATE memory_app_context c SET last_seq = s.last_seq, search_seq = s.last_seq, message_count = s.n,
            token_count = s.tokens, last_activity_at = s.last_at, updated_at = s.last_at
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
