"""`manage.py benchmark --quick` still works: builds its own database, measures, writes Markdown.

No speed target is asserted here (CI machines differ); the default-size run is `make bench`.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest
from django.db import connections

from memory_app.bench import database
from memory_app.bench.dataset import Sizes, context_sizes
from tests.builders import run_benchmark

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "benchmarks.md"
    proc, db_name = run_benchmark("--quick", "--keep", db_suffix="bench", output=out, timeout=300)
    yield proc, out, db_name
    database.drop_database(db_name)


def _bench_conn(db_name: str):
    info = database._admin_conninfo(connections["default"].settings_dict)
    return psycopg.connect(**{**info, "dbname": db_name})


def test_quick_benchmark_exits_cleanly_and_writes_the_markdown_table(quick_run):
    proc, out, _ = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Benchmarks")
    assert "cores" in text and "- Date:" in text
    assert "| Area | Measure | Ours | Naive baseline | Ours / baseline | Target | Result |" in text
    # Areas that exist in every build: ingest through the API and semantic recall.
    assert "| ingest (API) | single append" in text
    assert "semantic recall@10" in text
    assert "| storage | messages with 384-d vectors, per 100,000 messages" in text
    # Batches with inline vectors, through the write path, the API and real HTTP (the scenario
    # fails, and the rows are missing, unless every vector sent was stored).
    for area in ("domain", "API", "HTTP"):
        assert f"| ingest ({area}) | batch of 100 messages with 384-d vectors" in text
    # The request path over real HTTP, each row a median of interleaved per-pair ratios.
    # OTLP exports over real HTTP to the site served as `serve` serves it, until mapped.
    assert "| ingest (OTLP) | exports until every span is mapped" in text
    assert "served over HTTP (1 uvicorn worker), mapped by the web workers'" in text
    assert "| request path | semantic search k=10" in text
    assert "| request path | single append: HTTP ÷ a minimal HTTP handler" in text
    assert text.count("per-pair ratios") >= 2


def test_every_target_row_says_met_or_missed(quick_run):
    proc, out, _ = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in out.read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| Area")
    ]
    with_target = [cells for cells in rows if cells[5]]
    assert with_target
    for cells in with_target:
        assert cells[6] in ("met", "**missed**"), cells


def test_the_dataset_keeps_the_write_paths_counters_consistent(quick_run):
    proc, _, db_name = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    with _bench_conn(db_name) as conn:
        bad_contexts = conn.execute(
            """
            SELECT count(*) FROM memory_app_context c
            LEFT JOIN (SELECT context_id, max(seq) s, count(*) n, sum(token_count) t
                       FROM memory_app_message GROUP BY context_id) m ON m.context_id = c.id
            WHERE c.last_seq <> coalesce(m.s, 0) OR c.message_count <> coalesce(m.n, 0)
               OR c.token_count <> coalesce(m.t, 0)
               OR c.run_count <> (SELECT count(*) FROM memory_app_run r WHERE r.context_id = c.id)
            """
        ).fetchone()[0]
        bad_runs = conn.execute(
            """
            SELECT count(*) FROM memory_app_run r
            WHERE r.step_count <> (SELECT count(*) FROM memory_app_step s WHERE s.run_id = r.id)
               OR r.last_position <> (
                   SELECT coalesce(max(position), 0) FROM memory_app_step s WHERE s.run_id = r.id
               )
            """
        ).fetchone()[0]
        gaps = conn.execute(
            "SELECT count(*) FROM (SELECT context_id FROM memory_app_message GROUP BY context_id "
            "HAVING max(seq) <> count(*)) g"
        ).fetchone()[0]
        hnsw = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'memory_app_embedding' AND "
            "indexdef ILIKE '%USING hnsw%'"
        ).fetchone()[0]
        vectors = conn.execute(
            "SELECT count(*) FROM memory_app_embedding WHERE vector IS NOT NULL"
        ).fetchone()[0]
        messages = conn.execute("SELECT count(*) FROM memory_app_message").fetchone()[0]
    assert (bad_contexts, bad_runs, gaps) == (0, 0, 0)
    assert hnsw == 1
    assert vectors > 0 and messages > 3000  # the dataset plus what the ingest measurement appended


def test_the_scale_dataset_holds_a_million_messages_in_one_context():
    sizes = Sizes.scale()
    per_context = context_sizes(sizes, np.random.default_rng(sizes.seed))
    assert per_context[0] == 1_000_000
    assert sum(per_context) == 1_200_000
    assert len(per_context) == sizes.contexts
    # The benchmark reads context 3 as the large context that is a small part of the store.
    assert per_context[2] == 30_000


def test_the_benchmark_refuses_the_sites_own_database():
    own = connections["default"].settings_dict["NAME"]
    with pytest.raises(database.BenchDatabaseError):
        database.switch_to(own)


def test_peers_missing_is_a_clear_error(monkeypatch):
    from memory_app.bench import peers

    monkeypatch.setitem(sys.modules, "langchain_postgres", None)
    with pytest.raises(peers.PeersMissing, match=r"agentmemory\[peers\]"):
        peers.load()


def _peers_installed() -> bool:
    from memory_app.bench import peers

    try:
        peers.load()
    except peers.PeersMissing:
        return False
    return True


@pytest.mark.skipif(
    not _peers_installed(), reason="the peers extra is absent (pip install 'agentmemory[peers]')"
)
def test_quick_peers_run_prints_ours_over_each_peer(tmp_path):
    out = tmp_path / "peers.md"
    proc, _ = run_benchmark(
        "--quick", "--only", "peers", db_suffix="peers", output=out, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in out.read_text().splitlines()
        if line.startswith("| peers |")
    ]
    peers_seen = {cells[1].split(" — vs ")[1] for cells in rows}
    assert {
        "langchain-postgres chat history",
        "LangGraph PostgresStore",
        "naive (ORM row by row)",
    } <= peers_seen
    # Every row has both figures and the ratio ours ÷ peer.
    assert all(cells[2] and cells[3] and cells[4].endswith("×") for cells in rows), rows
    assert "## Peers" in out.read_text()


def _local_intrinsic_dimension(vectors: np.ndarray, *, k: int = 20, queries: int = 500) -> float:
    """Levina-Bickel MLE of the local intrinsic dimension over `k` neighbours (unit vectors)."""
    rng = np.random.default_rng(0)
    sample = vectors[rng.choice(len(vectors), queries, replace=False)]
    dist = np.sqrt(np.maximum(2 - 2 * sample @ vectors.T, 0))
    dist.sort(axis=1)
    near = np.maximum(dist[:, 1 : k + 1], 1e-9)  # column 0 is the query itself
    return float(np.mean(-1 / np.mean(np.log(near[:, :-1] / near[:, -1:]), axis=1)))


def test_benchmark_vectors_spread_like_real_embeddings_where_a_large_context_searches():
    """Within one subtopic (where a big context's nearest neighbours lie) the default vectors have
    the local intrinsic dimension of real MiniLM sentence vectors (≈ 20); the isotropic stress
    vectors (`--local-dims 0`) are near-equidistant points of a far higher dimension."""
    from memory_app.bench.dataset import Generator

    def one_subtopic(local_dims: int) -> np.ndarray:
        gen = Generator(Sizes(local_dims=local_dims))
        vectors = gen.vectors(np.zeros(3000, dtype=int), np.zeros(3000, dtype=int))
        assert vectors.shape == (3000, 384)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
        return vectors

    assert 15 <= _local_intrinsic_dimension(one_subtopic(Sizes().local_dims)) <= 26
    assert _local_intrinsic_dimension(one_subtopic(0)) > 60


def test_a_dataset_built_before_the_spread_existed_is_not_reused_as_todays():
    from memory_app.bench.dataset import Dataset

    stored = Dataset(
        sizes=Sizes(), largest_context_id=1, small_context_id=2, long_run_id=1, transcript_run_id=2
    ).to_json()
    older = stored.replace(f', "local_dims": {Sizes().local_dims}', "")
    assert older != stored
    assert Dataset.from_json(stored).sizes == Sizes()
    assert Dataset.from_json(older).sizes.local_dims == 0
    assert Dataset.from_json(older).sizes != Sizes()


def test_the_storage_row_counts_every_table_a_message_occupies():
    """The message's own row, its full-text vector (MessageSearch), its embeddings, those still
    waiting for their HNSW graph and their retries."""
    from django.apps import apps

    from memory_app.bench.storage import STORED_TABLES
    from memory_app.models import Embedding, EmbeddingRetry, EmbeddingWaiting, Message

    holding = {
        m._meta.db_table
        for m in apps.get_app_config("memory_app").get_models()
        if m in (Message, Embedding, EmbeddingWaiting, EmbeddingRetry)
        or m._meta.db_table.startswith("memory_app_message")
    }
    assert holding == set(STORED_TABLES)


def test_paired_timing_turns_the_order_every_other_pair():
    from memory_app.bench.measure import time_pairs

    calls: list[tuple[str, int]] = []
    pairs = [
        (lambda n=n: calls.append(("a", n)), lambda n=n: calls.append(("b", n))) for n in range(4)
    ]
    ours, theirs, paired = time_pairs(pairs, warmup=0)
    # Neither side always runs second, on what the first left warm.
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("b", 3), ("a", 3)]
    assert ours.n == theirs.n == paired.n == 4


def test_the_request_path_times_enough_pairs_for_its_rows_whatever_the_samples():
    """A full run's default 50 samples left the rows' median ratios moving by more than their
    margin to the target; a quick run stays quick."""
    from types import SimpleNamespace

    from memory_app.bench import http_path

    def pairs(samples, quick):
        return http_path.pairs_for(SimpleNamespace(samples=samples, quick=quick))

    assert pairs(50, False) == http_path.MIN_PAIRS == 400
    assert pairs(1000, False) == 1000
    assert pairs(5, True) == 5


def test_the_request_path_alone_writes_its_section_with_its_rows_and_the_load(tmp_path):
    """`--only http_path --output FILE` puts its rows and notes in their own section and leaves
    the rest of the file as it was (the figures a run of the area alone gives are recorded)."""
    out = tmp_path / "benchmarks.md"
    before = (
        "# Benchmarks\n\nEarlier text.\n\n## Request path\n\nOld rows.\n\n## Where the time goes\n"
    )
    out.write_text(before + "\nProfiles.\n")
    proc, _ = run_benchmark(
        "--quick", "--only", "http_path", db_suffix="http_path", output=out, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\nEarlier text.\n\n## Request path\n\nWritten by ")
    assert "Old rows." not in text and text.endswith("## Where the time goes\n\nProfiles.\n")
    assert text.count("## Request path") == 1
    rows = [line for line in text.splitlines() if line.startswith("| semantic search k=10")]
    rows += [line for line in text.splitlines() if line.startswith("| single append: HTTP")]
    assert len(rows) == 2, text
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1].startswith("p50 ") and cells[2].startswith("p50 "), row
        assert "per-pair ratios" in cells[4] and "load" in cells[4], row
        assert cells[6] in ("met", "**missed**"), row
    assert "Load average (1/5/15 min) at the start:" in text
    assert "| Ours | Without it | Ours ÷ without it (pair median) |" in text
    # The work above the database, ours alone: each request's CPU in the serving worker.
    work = [line for line in text.splitlines() if line.startswith("| work above the database")]
    assert [line.split(",")[1].split(":")[0].strip() for line in work] == [
        "window k=20",
        "semantic search k=10",
        "single append",
    ], text
    for row in work:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1].startswith("p50 ") and cells[2:4] == ["—", "—"], row
        assert "the serving worker's CPU over" in cells[4] and "load" in cells[4], row
        assert cells[5] == "p50 ≤ 1 ms" and cells[6] in ("met", "**missed**"), row
        p50 = float(cells[1].split()[1])
        assert 0 < p50 < 200, row  # milliseconds of CPU, not seconds or nanoseconds


def test_a_process_s_cpu_per_call_counts_every_thread_and_only_the_call():
    """The request path's work above the database is the serving worker's CPU per request: the
    time each call keeps any of the process's threads on a core (as a server's pool thread
    answers it: the first call starts it), not the time it waits."""
    from concurrent.futures import ThreadPoolExecutor

    from memory_app.bench.http_path import worker_cpu

    def spin():
        end = time.thread_time() + 0.03
        while time.thread_time() < end:
            pass

    def wait_for_another_process():
        subprocess.run(["sleep", "0.03"], check=True)

    with ThreadPoolExecutor(max_workers=1) as pool:
        busy, busy_mean = worker_cpu(
            os.getpid(), [lambda: pool.submit(spin).result()] * 5, warmup=0
        )
    waiting, _ = worker_cpu(os.getpid(), [wait_for_another_process] * 5, warmup=0)
    assert busy.n == waiting.n == 5
    assert busy.p50 >= 25 and busy_mean >= 25, busy
    assert waiting.p50 < 15, waiting


def test_a_run_of_some_areas_writes_a_section_of_theirs_and_keeps_the_report(tmp_path):
    """`--only selectors --output FILE` on a full run's report: the report stays as it was, the
    selectors' rows go into a section of their own, which replaces the one an earlier such run
    wrote (a run of some areas used to write its few rows over the whole report). Into a file
    without a full run's report it writes a whole report, as before (tests above)."""
    out = tmp_path / "benchmarks.md"
    report = (
        "# Benchmarks\n\n- Command: `python manage.py benchmark --peers`\n\n## Results\n\n"
        "| startup | old row |\n"
    )
    stale = "## Measured alone: selectors\n\nStale rows.\n"
    profiles = "## Where the time goes (profiles)\n\nProfiles.\n"
    out.write_text(f"{report}\n{stale}\n{profiles}")
    proc, _ = run_benchmark(
        "--quick", "--only", "selectors", db_suffix="alone", output=out, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text.startswith(report) and text.endswith(profiles)
    assert "Stale rows." not in text and text.count("## Measured alone: selectors") == 1
    section = text[text.index("## Measured alone: selectors") : text.index(profiles)]
    rows = [line for line in section.splitlines() if line.startswith("| selectors (API) |")]
    assert rows and all(line.count("|") == 8 for line in rows), section
    assert "Written by `python manage.py benchmark --quick --only selectors" in section
    # Its figures go with the machine, its load and the dataset they were taken on, in the
    # lines a full run's report opens with.
    head = section[: section.index("| Area |")].splitlines()
    for start in ("- Date: ", "- Machine: ", "- Database: PostgreSQL ", "- Load average "):
        assert any(line.startswith(start) for line in head), section
    dataset = [line for line in head if line.startswith("- Dataset (own database `")]
    assert len(dataset) == 1 and f"psycopg {psycopg.__version__}" in dataset[0], section
    assert "3,000 messages over 12 contexts" in dataset[0], section


def _call_benchmark(**options) -> subprocess.CompletedProcess:
    """`call_command("benchmark", **options)` in a process of its own that is not `manage.py
    benchmark` (a script's or a test's call): its report's command line comes from the
    options, not from the process's arguments."""
    script = (
        "import json, sys, django; django.setup(); "
        "from django.core.management import call_command; "
        "call_command('benchmark', **json.loads(sys.argv[1]))"
    )
    return subprocess.run(
        [sys.executable, "-c", script, json.dumps(options)],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "agentmemory_site.settings"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_report_written_through_call_command_names_the_areas_it_measured(tmp_path):
    """A report that `call_command("benchmark", only=...)` writes names its `--only`: a bare
    `python manage.py benchmark` is a full run's command, and a second run of some areas into
    the file would take it for a full run's report and write a "measured alone" section."""
    out = tmp_path / "benchmarks.md"
    db_name = f"{os.environ.get('AGENTMEMORY_TEST_DB_NAME', 'test_agentmemory')}_called"
    common = {"quick": True, "db_name": db_name, "output": str(out)}
    try:
        first = _call_benchmark(**common, only="selectors", keep=True)
        assert first.returncode == 0, first.stderr[-3000:]
        commands = [line for line in out.read_text().splitlines() if line.startswith("- Command:")]
        assert len(commands) == 1, out.read_text()
        assert commands[0].startswith("- Command: `python manage.py benchmark --quick ")
        assert f"--db-name {db_name}" in commands[0] and "--keep" in commands[0]
        assert "--only selectors" in commands[0] and "--reuse" not in commands[0]
        second = _call_benchmark(**common, only="recall", reuse=True)
        assert second.returncode == 0, second.stderr[-3000:]
    finally:
        database.drop_database(db_name)
    text = out.read_text()
    assert "## Measured alone" not in text and text.count("- Command:") == 1, text
    assert "--only recall" in text and "| selectors (API) |" not in text, text


def test_a_section_title_is_found_as_a_whole_line_only():
    """A "measured alone" section holds its notes' headings one level down: the area's own
    section, written later, goes in place of its own title, not inside that heading."""
    from memory_app.bench import sections

    text = (
        "# Benchmarks\n\n## Measured alone: selectors,peers_http\n\n### Peers over HTTP\n\nA.\n"
        "\n## Where the time goes (profiles)\n\nProfiles.\n"
    )
    block = f"{sections.PEERS_HTTP}\n\nRows.\n"
    written = sections.with_section(text, sections.PEERS_HTTP, block)
    assert "### Peers over HTTP\n\nA.\n" in written
    assert written.index(block) < written.index("## Where the time goes")
    assert sections.with_section(written, sections.PEERS_HTTP, block) == written
