"""A run's transcript: every message of a long run, as the dashboard's logbook and a resumed
agent read it, against the naive baseline."""

from __future__ import annotations

from memory_app.bench import baseline
from memory_app.bench.harness import API, Bench, module_available, route_exists
from memory_app.bench.measure import Row, Target, time_calls
from memory_app.models import Run


def transcript(b: Bench) -> None:
    run = Run.objects.get(pk=b.data.transcript_run_id)
    label = f"transcript of a {run.step_count:,}-step run"
    path = f"{API}/runs/{run.pk}/messages"
    naive = time_calls(lambda: baseline.transcript(run.pk), n=max(3, b.samples // 10), warmup=1)
    target = Target("<=", 100, "≤ 100 ms")
    if route_exists(path):
        ours = time_calls(lambda: b.get(path), n=max(5, b.samples // 2))
        b.report.add(
            Row("transcript (API)", f"GET /runs/{{id}}/messages, {label}", ours, naive, target),
            b.log,
        )
    elif module_available("memory_app.transcripts"):
        from memory_app import transcripts

        ours = time_calls(lambda: transcripts.run_messages(run=run), n=max(5, b.samples // 2))
        b.report.add(
            Row(
                "transcript (domain)",
                label,
                ours,
                naive,
                target,
                note="transcripts.run_messages; GET /api/v1/runs/{id}/messages has not landed",
            ),
            b.log,
        )
    else:
        b.report.skip(label, "memory_app.transcripts has not landed", b.log)
