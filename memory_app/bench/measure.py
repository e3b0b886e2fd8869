"""Timing helpers, result rows with targets, and the report (terminal table and Markdown)."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np


@dataclass(frozen=True)
class Latency:
    p50: float  # milliseconds
    p95: float
    n: int

    def __str__(self) -> str:
        return f"p50 {fmt_ms(self.p50)} · p95 {fmt_ms(self.p95)}"


@dataclass(frozen=True)
class Rate:
    per_second: float
    unit: str = "msg/s"

    def __str__(self) -> str:
        return f"{self.per_second:,.0f} {self.unit}"


@dataclass(frozen=True)
class Amount:
    value: float
    unit: str

    def __str__(self) -> str:
        if self.unit == "KB":
            return f"{self.value:,.1f} KB"
        if self.unit == "MB":
            return f"{self.value:,.1f} MB"
        if self.unit == "ms":
            return fmt_ms(self.value)
        return f"{self.value:.3f}" if self.value < 10 else f"{self.value:,.0f}"


Figure = Latency | Rate | Amount


@dataclass(frozen=True)
class Target:
    """`value <= limit` (op "<=") or `value >= limit` (op ">="), on the figure's headline number
    (p50 for a latency)."""

    op: str
    limit: float
    text: str
    # On the row's ratio (ours ÷ baseline) instead of our figure.
    of_ratio: bool = False

    def met(self, figure: Figure | float) -> bool:
        value = headline(figure)
        return value <= self.limit if self.op == "<=" else value >= self.limit


def headline(figure: Figure | float) -> float:
    if isinstance(figure, float | int):
        return float(figure)
    if isinstance(figure, Latency):
        return figure.p50
    if isinstance(figure, Rate):
        return figure.per_second
    return figure.value


def fmt_ms(ms: float) -> str:
    if ms < 10:
        return f"{ms:.2f} ms"
    if ms < 1000:
        return f"{ms:.1f} ms"
    return f"{ms / 1000:.2f} s"


@dataclass
class Row:
    area: str
    measure: str
    ours: Figure
    baseline: Figure | None = None
    target: Target | None = None
    note: str = ""
    # Interleaved pairs (ours, baseline, ours, ...): the median of the per-pair ratios.
    paired: Paired | None = None

    @property
    def ratio(self) -> float | None:
        if self.paired is not None:
            return self.paired.median
        if self.baseline is None or headline(self.baseline) == 0:
            return None
        return headline(self.ours) / headline(self.baseline)

    @property
    def status(self) -> str:
        if self.target is None:
            return ""
        figure = self.ratio if self.target.of_ratio else self.ours
        return "met" if figure is not None and self.target.met(figure) else "**missed**"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: datetime = field(default_factory=lambda: datetime.now(UTC))

    def add(self, row: Row, log: Callable[[str], None] | None = None) -> Row:
        self.rows.append(row)
        if log:
            log(
                f"  {row.area} · {row.measure}: {row.ours}"
                + (f" (baseline {row.baseline})" if row.baseline else "")
            )
        return row

    def skip(self, what: str, reason: str, log: Callable[[str], None] | None = None) -> None:
        line = f"{what} — not measured: {reason}"
        self.not_measured.append(line)
        if log:
            log(f"  {line}")

    def missed(self) -> list[Row]:
        return [r for r in self.rows if r.target is not None and r.status != "met"]


# A slow figure (the naive baseline on 100,000 messages) stops sampling after this many seconds,
# keeping at least MIN_SAMPLES: the run stays within minutes on shared cores.
BUDGET_SECONDS = 20.0
MIN_SAMPLES = 3


@dataclass(frozen=True)
class Paired:
    """Per-pair ratios of interleaved calls (A B, B A, A B ...): the median and the spread (the
    middle half and the extremes), so a row that swings shows it."""

    median: float
    p25: float
    p75: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return (
            f"median of {self.n} per-pair ratios {self.median:.2f}× "
            f"(middle half {self.p25:.2f}–{self.p75:.2f}×, all {self.low:.2f}–{self.high:.2f}×)"
        )


def time_pairs(
    pairs: list[tuple[Callable[[], object], Callable[[], object]]], *, warmup: int = 3
) -> tuple[Latency, Latency, Paired]:
    """Each pair's two calls one right after the other, the order turned every other pair (A B,
    B A, A B ...): the latencies of each side and the per-pair ratios (A ÷ B), so a load that
    comes and goes weighs on both sides of a ratio alike, and neither side always runs second,
    on what the first left warm (the same query's index pages and plan caches, a connection
    just used)."""
    for a, b in pairs[:warmup]:
        a(), b()
    ours, theirs = [], []
    for n, (a, b) in enumerate(pairs):
        calls = ((a, ours), (b, theirs))
        for fn, into in calls if n % 2 == 0 else calls[::-1]:
            t = time.perf_counter()
            fn()
            into.append((time.perf_counter() - t) * 1000)
    ratios = np.array(ours) / np.array(theirs)
    p25, median, p75 = (float(x) for x in np.percentile(ratios, [25, 50, 75]))
    paired = Paired(median, p25, p75, float(ratios.min()), float(ratios.max()), len(ratios))
    return latency_of(ours), latency_of(theirs), paired


def latency_of(samples: list[float]) -> Latency:
    arr = np.array(samples)
    return Latency(
        p50=float(np.percentile(arr, 50)), p95=float(np.percentile(arr, 95)), n=len(samples)
    )


def time_calls(
    fn: Callable[[], object], *, n: int, warmup: int = 3, budget: float = BUDGET_SECONDS
) -> Latency:
    """p50/p95 of up to `n` calls of `fn` (after `warmup` unmeasured ones), in milliseconds."""
    return time_each([fn] * n, warmup=warmup, budget=budget)


def time_each(
    fns: list[Callable[[], object]], *, warmup: int = 2, budget: float = BUDGET_SECONDS
) -> Latency:
    """p50/p95 over one call of each function (different queries), after a warm-up."""
    start = time.perf_counter()
    for fn in fns[:warmup]:
        fn()
        if time.perf_counter() - start > budget:
            break
    start = time.perf_counter()
    samples = []
    for fn in fns:
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
        if len(samples) >= MIN_SAMPLES and time.perf_counter() - start > budget:
            break
    return latency_of(samples)


# --- the report -------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_lines(server_version: str, pgvector_version: str) -> list[str]:
    return [
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {os.cpu_count()} cores ({_cpu_model()}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}",
        f"- Database: PostgreSQL {server_version}, pgvector {pgvector_version}",
        f"- Load average (1/5/15 min) when the report was written: {loadavg()} — the cores "
        "are shared, "
        "so figures taken under load are pessimistic",
    ]


def loadavg() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def load_span(start: str) -> str:
    """The report line of the load averages at an area's start (`start`, `loadavg()` then) and
    now, beside each row's own."""
    return (
        f"- Load average (1/5/15 min) at the start: {start}; at the end: {loadavg()} (each "
        f"row's 1-minute load as it ended beside it; the {os.cpu_count()} cores are shared)."
    )


def paired_note(paired) -> str:
    """A paired row's note: its spread, and the 1-minute load as it ended."""
    return f"{paired}; load {os.getloadavg()[0]:.2f}"


def table(rows: list[Row]) -> list[str]:
    out = [
        "| Area | Measure | Ours | Naive baseline | Ours / baseline | Target | Result |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "" if r.ratio is None else f"{r.ratio:.3g}×"
        note = f" ({r.note})" if r.note else ""
        out.append(
            f"| {r.area} | {r.measure}{note} | {r.ours} | {r.baseline or '—'} | {ratio} | "
            f"{r.target.text if r.target else ''} | {r.status} |"
        )
    return out


def plain_table(rows: list[Row]) -> str:
    headers = ("Area", "Measure", "Ours", "Baseline", "Ratio", "Target", "Result")
    data = [
        (
            r.area,
            r.measure,
            str(r.ours),
            str(r.baseline or "-"),
            "" if r.ratio is None else f"{r.ratio:.3g}x",
            r.target.text if r.target else "",
            r.status.replace("*", ""),
        )
        for r in rows
    ]
    widths = [
        max(len(h), *(len(d[i]) for d in data)) if data else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(d, widths, strict=True)) for d in data]
    return "\n".join(lines)
