"""`manage.py benchmark --only citus --quick` runs end to end on a tiny dataset: a coordinator and
two workers started from the Citus build, the same rows on both sides, every operation measured
on both, the report's section written alone into the Markdown file. No speed is asserted (the
figures of a quick run mean nothing). Skipped where there is no Citus build, as in CI without
one (AGENTMEMORY_CITUS_TREE, else var/citus-pg)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memory_app.bench import citus_rows, sections
from tests.builders import run_benchmark

ROOT = Path(__file__).resolve().parent.parent
TREE = Path(os.environ.get("AGENTMEMORY_CITUS_TREE") or ROOT / "var" / "citus-pg")

OTHER = "# Benchmarks\n\n## Results\n\n| a |\n\n## Where the time goes (profiles)\n\nnotes\n"


def test_the_section_goes_in_alone_and_a_full_rewrite_keeps_it(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text(OTHER)
    sections.write_section(path, citus_rows.SECTION, [citus_rows.SECTION, "", "first"])
    text = path.read_text()
    # Placed before the profiles, the rest untouched.
    assert text.replace(citus_rows.SECTION + "\n\nfirst\n\n", "") == OTHER
    sections.write_section(path, citus_rows.SECTION, [citus_rows.SECTION, "", "second"])
    assert "first" not in path.read_text() and path.read_text().count(citus_rows.SECTION) == 1
    # A full run writes the whole file anew: the section of the citus run is carried over.
    kept = sections.kept_section(path, citus_rows.SECTION)
    rewritten = sections.with_section(OTHER.replace("| a |", "| b |"), citus_rows.SECTION, kept)
    assert "second" in rewritten and "| b |" in rewritten
    assert rewritten.index("second") < rewritten.index("## Where the time goes")
    assert sections.kept_section(tmp_path / "absent.md", citus_rows.SECTION) is None


@pytest.mark.slow
@pytest.mark.skipif(
    not (TREE / "lib" / "postgresql" / "citus.so").exists(),
    reason="no Citus build (scripts/build_citus.sh SOURCE_DIR var/citus-pg makes one)",
)
def test_quick_citus_area_runs_end_to_end(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text(OTHER)
    # The single node is the embedded server even where the suite itself runs on a cluster.
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DATABASE_REPLICA_URL")}
    proc, db_name = run_benchmark(
        "--only",
        "citus",
        "--quick",
        "--citus-tree",
        str(TREE),
        db_suffix="citusbench",
        output=out,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Benchmarks\n\n## Results\n\n| a |")  # the rest left as it was
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.split(citus_rows.SECTION, 1)[1].splitlines()
        if line.startswith("| ") and "Operation" not in line
    ]
    by_op = {cells[0]: cells for cells in rows if len(cells) == 8}
    for op in (
        "window k=20",
        "keyword search k=10",
        "semantic search k=10",
        "get-or-create a context by keys (existing)",
        "single append",
    ):
        cells = by_op[op]
        assert cells[1].startswith("p50 ") and cells[2].startswith("p50 ")
        assert cells[5] in ("met", "**missed**")
        # Every statement of an agent's read is classified on the cluster, none fanned out.
        assert "routed" in cells[6] and "fan-out" not in cells[6], cells
    # The store's storage was read on both sides: the vectors are on the shards.
    storage = {c[0]: c for c in rows if len(c) == 3}
    assert storage["`memory_app_embedding`"][2] != "—"
    # The cluster has its own model index on every shard (built there, not taken as built).
    assert storage["HNSW per vector"][2] != "0 B"
    assert "per message" in text
    # The cluster this run started is stopped and its folders gone.
    assert not (ROOT / "var" / "bench" / f"citus-{db_name}").exists()
