"""`manage.py benchmark --only peers_http`: ours and the peers each behind an HTTP server of the
same kind, interleaved. The quick run needs the peers' venv (`make peers-venv`); CI does not
build it, so there it is skipped with the reason (the figures come from the command, not from
tests, as with `--peers`)."""

import ast
import sys
from pathlib import Path

import pytest

from memory_app.bench import peers_http
from memory_app.bench.harness import BenchError
from tests.builders import run_benchmark

ROOT = Path(__file__).resolve().parent.parent


def _venv_missing() -> str:
    try:
        peers_http.venv_python()
    except BenchError as exc:
        return str(exc)
    return ""


def test_a_missing_peers_venv_is_a_clear_error_naming_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTMEMORY_PEERS_VENV", str(tmp_path / "absent"))
    with pytest.raises(BenchError, match=r"`make peers-venv` makes it"):
        peers_http.venv_python()


def test_the_peer_handlers_import_neither_django_nor_the_product():
    """They run in the peers' venv, where neither is installed."""
    tree = ast.parse((ROOT / "memory_app" / "bench" / "peer_handlers.py").read_text())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
    }
    assert imported, "no imports found"
    assert not imported & {"django", "ninja", "memory_app", "agentmemory_site", "pgvector"}


def test_the_peers_venv_installs_the_peers_extra_and_the_products_server_versions():
    import tomllib

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import peers_requirements
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    wanted = peers_requirements.requirements(ROOT / "pyproject.toml")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(project["optional-dependencies"]["peers"]) <= set(wanted)
    for name in ("gunicorn", "uvicorn-worker", "orjson", "psycopg[binary,pool]"):
        spec = next(s for s in project["dependencies"] if s.startswith(name))
        assert spec in wanted


@pytest.mark.slow
@pytest.mark.skipif(bool(_venv_missing()), reason=_venv_missing() or "the peers' venv exists")
def test_quick_peers_http_run_writes_its_section_with_a_paired_row_per_measure(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\nEarlier text.\n\n## Where the time goes\n\nProfiles.\n")
    proc, _ = run_benchmark(
        "--quick", "--only", "peers_http", db_suffix="peers_http", output=out, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    # Its own section, the rest of the file left as it was.
    assert text.startswith("# Benchmarks\n\nEarlier text.\n")
    assert text.index(peers_http.SECTION) < text.index("## Where the time goes")
    assert "not measured" not in text, text
    rows = {
        cells[0]: cells
        for cells in (
            [c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines()
            if " — vs " in line and line.startswith("|")
        )
    }
    lc, lg = peers_http.LANGCHAIN, peers_http.LANGGRAPH
    expected = [
        f"window k=20 of 300 messages — vs {lc}",
        f"window k=20 of 300 messages — vs {lg}",
        f"token window 2000 tokens (contiguous) of 300 messages — vs {lc}",
        f"token window 2000 tokens (contiguous) of 300 messages — vs {lg}",
        f"keyword search k=10 in 300 messages — vs {lc} + full text",
        f"semantic search k=10 in 300 messages — vs {lg}",
        f"semantic search k=10 in 600 messages — vs {lg}",
        # Where ours walks its HNSW graph (600 is above the quick run's exact threshold).
        f"semantic search k=10 in 600 messages — vs {lg} at our walk's settings",
        f"single append — vs {lc}",
        f"single append — vs {lg}",
        f"text batch of 100 (time per batch) — vs {lc}",
        f"text batch of 100 (time per batch) — vs {lg}",
        f"batch of 100 with 384-d vectors (time per batch) — vs {lg}",
    ]
    assert sorted(rows) == sorted(expected)
    for measure, ours, peer, ratio, spread, _target, result in rows.values():
        assert ours.startswith("p50 ") and peer.startswith("p50 "), measure
        assert ratio.endswith("×") and "per-pair ratios" in spread and "load" in spread
        assert result in ("met", "**missed**")
    # Each semantic row's recall against the exact scan, both sides, and the settings stated.
    lines = text.splitlines()
    assert len([line for line in lines if "recall@10 against the exact scan" in line]) == 2
    assert len([line for line in lines if line.startswith("  - LangGraph")]) == 3
    assert "hnsw.ef_search 40" in text and "our walk's settings: ef_search" in text
    assert "cl100k_base" in text
