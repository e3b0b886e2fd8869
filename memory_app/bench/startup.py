"""How long a process takes to load the settings and the app registry (`django.setup()`): every
command, worker and test session pays it. Measured in fresh interpreters, as they start in real
use, with a new empty data folder and no DATABASE_URL: loading the settings starts no database."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memory_app.bench.measure import Row, Target, latency_of

ROOT = Path(__file__).resolve().parents[2]
SETUP = (
    "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'agentmemory_site.settings'; "
    "django.setup()"
)
TARGET = Target("<=", 1000, "p50 ≤ 1 s, no PostgreSQL started")


def _setup_seconds(data_dir: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["AGENTMEMORY_DATA_DIR"] = data_dir
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", SETUP], cwd=ROOT, env=env, check=True, timeout=120)
    return time.perf_counter() - started


def run(b) -> None:
    runs = 3 if b.quick else 9
    with tempfile.TemporaryDirectory(prefix="agentmemory-startup-") as data_dir:
        samples = [_setup_seconds(data_dir) * 1000 for _ in range(runs)]
        started_server = (Path(data_dir) / "pgdata").exists()
    note = (
        "a data folder was initialised: the settings started PostgreSQL" if started_server else ""
    )
    b.report.add(
        Row("startup", "django.setup(), fresh process", latency_of(samples), None, TARGET, note),
        b.log,
    )
