"""`manage.py benchmark --only fleet --quick` runs end to end on a tiny fleet: its own database
built by SQL (runs, steps, tool calls, scores, labels, messages and both search side tables,
with the counters the write path keeps), every row measured through the real views and API, its
section written alone into the Markdown file, which a full run's rewrite keeps. No speed is
asserted (the figures of a quick run mean nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connections

from memory_app.bench import citus_rows, database, fleet, sections

ROOT = Path(__file__).resolve().parent.parent
OTHER = "# Benchmarks\n\n## Results\n\n| a |\n\n## Where the time goes (profiles)\n\nnotes\n"


def test_a_full_rewrite_keeps_both_sections_each_written_alone(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text(OTHER)
    sections.write_section(path, fleet.SECTION, [fleet.SECTION, "", "fleet one"])
    sections.write_section(path, citus_rows.SECTION, [citus_rows.SECTION, "", "citus one"])
    sections.write_section(path, fleet.SECTION, [fleet.SECTION, "", "fleet two"])
    text = path.read_text()
    assert "fleet one" not in text and text.count(fleet.SECTION) == 1
    assert "citus one" in text and "| a |" in text
    rewritten = sections.keep_sections(
        path, OTHER.replace("| a |", "| b |"), [citus_rows.SECTION, fleet.SECTION]
    )
    assert "| b |" in rewritten and "| a |" not in rewritten
    assert "fleet two" in rewritten and "citus one" in rewritten
    assert rewritten.index("fleet two") < rewritten.index("## Where the time goes")
    assert sections.keep_sections(tmp_path / "absent.md", OTHER, [fleet.SECTION]) == OTHER


def _bench_rows(db_name: str, sql: str) -> list[tuple]:
    info = database._admin_conninfo(connections["default"].settings_dict)
    with psycopg.connect(**{**info, "dbname": db_name}) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.slow
def test_quick_fleet_area_runs_end_to_end(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text(OTHER)
    db_name = f"{os.environ.get('AGENTMEMORY_TEST_DB_NAME', 'test_agentmemory')}_fleetbench"
    try:
        proc = subprocess.run(
            [sys.executable, "manage.py", "benchmark", "--only", "fleet", "--quick", "--keep"]
            + ["--db-name", db_name, "--output", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        # What the write path keeps agrees with the rows: each run's counters with its steps
        # and tool calls, and every step, error and tool call has its full-text vector.
        drift = _bench_rows(
            db_name,
            """
            SELECT r.id FROM memory_app_run r
            JOIN (SELECT s.run_id, count(*) AS n, max(s.position) AS last,
                         count(*) FILTER (WHERE s.error_type IS NOT NULL) AS errors,
                         sum(s.total_tokens) AS tokens, sum(s.cost) AS cost,
                         count(t.id) AS calls
                  FROM memory_app_step s
                  LEFT JOIN memory_app_toolcall t
                      ON t.context_id = s.context_id AND t.step_id = s.id
                  GROUP BY s.run_id) s ON s.run_id = r.id
            WHERE (r.step_count, r.last_position, r.error_count, r.total_tokens,
                   r.tool_call_count) <> (s.n, s.last, s.errors, s.tokens, s.calls)
               OR abs(r.cost - s.cost) > 1e-9
            """,
        )
        assert drift == []
        counts = dict(
            _bench_rows(
                db_name,
                "SELECT 'runs', count(*) FROM memory_app_run"
                " UNION ALL SELECT 'statuses', count(DISTINCT status) FROM memory_app_run"
                " UNION ALL SELECT 'models', count(DISTINCT model_names) FROM memory_app_run"
                " UNION ALL SELECT 'failed', count(*) FROM memory_app_run WHERE error_count > 0"
                " UNION ALL SELECT 'messages', count(*) FROM memory_app_message"
                " UNION ALL SELECT 'message vectors', count(*) FROM memory_app_messagesearch"
                " UNION ALL SELECT 'steps', count(*) FROM memory_app_step"
                " UNION ALL SELECT 'errors', count(*) FROM memory_app_step"
                "     WHERE error_type IS NOT NULL"
                " UNION ALL SELECT 'tool calls', count(*) FROM memory_app_toolcall"
                " UNION ALL SELECT kind, count(*) FROM memory_app_runsearch GROUP BY kind"
                " UNION ALL SELECT 'scores', count(*) FROM memory_app_score"
                " UNION ALL SELECT 'labels', count(*) FROM memory_app_label",
            )
        )
        sizes = fleet.FleetSizes.quick()
        assert counts["runs"] == sizes.runs and counts["steps"] == sizes.steps
        assert counts["messages"] == counts["message vectors"] == sizes.messages
        assert counts["output"] == counts["tool"] == counts["tool calls"] == sizes.steps
        assert counts["error"] == counts["errors"] > 0
        assert counts["statuses"] == 5 and counts["models"] == 4
        assert 0 < counts["failed"] < sizes.runs
        assert counts["scores"] > 0 and counts["labels"] > 0
        # The triggers that keep the run-search vectors are on again after the load.
        disabled = _bench_rows(
            db_name,
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgenabled = 'D'",
        )
        assert disabled == []
    finally:
        database.drop_database(db_name)
    text = out.read_text()
    # The section alone is written, before the profiles; the rest of the file as it was.
    start = text.index(fleet.SECTION)
    end = text.index("\n## Where the time goes")
    assert text[:start] + text[end + 1 :] == OTHER
    block = text[start:end]
    assert "quick mode" in block and "Load average" in block
    rows = [line for line in block.splitlines() if line.startswith("| ") and "p50 " in line]
    # Each search measured through the page and the API.
    for q, _ in fleet.QUERIES:
        assert sum(f": {q} |" in line for line in rows) >= 2, q
    assert all(line.endswith(" |") and ("| met |" in line or "**missed**" in line) for line in rows)
    for what in (
        "runs table, page 2 by cursor",
        "home page",
        "a word in every message",
        "confined",
    ):
        assert what in block, what


def test_the_fleet_area_runs_alone():
    proc = subprocess.run(
        [sys.executable, "manage.py", "benchmark", "--only", "fleet,dashboard", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "--only fleet runs alone" in proc.stderr
