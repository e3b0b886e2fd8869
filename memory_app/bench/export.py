"""Export: how fast the backup streams a large context out, and that its memory stays flat
while it does."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable

from memory_app.bench import baseline
from memory_app.bench.harness import BASELINE_MAX_MESSAGES, Bench, context_size, module_available
from memory_app.bench.measure import Amount, Rate, Row, Target
from memory_app.models import Context, Message


def _export_once(fn: Callable[[], int]) -> tuple[float, int, float]:
    """(seconds, items, peak MB under tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    t = time.perf_counter()
    items = fn()
    seconds = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return seconds, items, peak / 1e6


def export(b: Bench) -> None:
    if not module_available("memory_app.backup"):
        b.report.skip("export", "memory_app.backup has not landed", b.log)
        return
    from memory_app.backup.export import contexts_matching, export_lines

    samples: list[float] = []

    def ours(cid: int) -> int:
        count = 0
        for line in export_lines(contexts=contexts_matching(context_ids=[cid])):
            if line.startswith('{"type":"message"'):
                count += 1
                if count % 500 == 0 and tracemalloc.is_tracing():
                    samples.append(tracemalloc.get_traced_memory()[0] / 1e6)
        return count

    def naive(cid: int) -> int:
        baseline.export(cid)
        return Message.objects.filter(context_id=cid).count()

    largest = b.data.largest_context_id
    # A context about a tenth the size of the largest one, to see whether memory grows with size.
    tenth = (
        Context.objects.filter(
            message_count__lte=max(Context.objects.get(pk=largest).message_count // 10, 1)
        )
        .order_by("-message_count")
        .values_list("pk", "message_count")
        .first()
    )
    o_sec, o_items, o_peak = _export_once(lambda: ours(largest))
    if context_size(largest) <= BASELINE_MAX_MESSAGES:
        n_sec, n_items, n_peak = _export_once(lambda: naive(largest))
        naive_rate, naive_peak = Rate(n_items / n_sec), Amount(n_peak, "MB")
    else:
        naive_rate = naive_peak = None
    b.report.add(
        Row(
            "export",
            f"backup.export_lines, largest context ({o_items:,} msgs), without tracemalloc",
            _rate_untraced(lambda: ours(largest)),
            naive_rate,
            Target(">=", 20000, "≥ 20,000 msg/s"),
        ),
        b.log,
    )
    # Flat memory: the memory held while the messages stream out does not rise from the first
    # third of the messages to the last.
    during = samples[:]
    note = ""
    if len(during) >= 3:
        third = max(len(during) // 3, 1)
        early, late = max(during[:third]), max(during[-third:])
        flat = late <= early * 1.5 + 1
        note = (
            f"held while messages stream: {early:.1f} MB in the first third, {late:.1f} MB "
            "in the last: "
            f"{'flat' if flat else 'grows'}"
        )
    if tenth:
        samples.clear()
        _, t_items, t_peak = _export_once(lambda: ours(tenth[0]))
        note += (
            f"; peak {t_peak:.1f} MB for a {t_items:,}-message context"
            " (peaks are per-chunk: 1,000 rows)"
        )
    b.report.add(
        Row(
            "export",
            "peak Python memory (tracemalloc), largest context",
            Amount(o_peak, "MB"),
            naive_peak,
            note=note,
        ),
        b.log,
    )


def _rate_untraced(fn: Callable[[], int]) -> Rate:
    gc.collect()
    t = time.perf_counter()
    items = fn()
    return Rate(items / (time.perf_counter() - t))
