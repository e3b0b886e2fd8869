"""Sections of the Markdown report that an area writes alone (`--only citus`, `--only fleet`,
`--only peers_http`, `--only http_path`): put in place of their earlier text, and carried over
as they are when a full run writes the rest of the file anew (or, for an area the full run
measures too, replaced by its own section of the same title). A run of some other areas puts
its rows into a full run's report as a section of theirs, which the next full run drops. Both
open with the same lines on the machine and the dataset (`run_head`)."""

from __future__ import annotations

import shlex
import sys
from argparse import ArgumentParser
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from memory_app.bench import database
from memory_app.bench.dataset import Dataset
from memory_app.bench.measure import Report, machine_lines, table

# The sections of the areas that run alone only (`--only citus`, `fleet`, `peers_http`,
# `--quality` and `--quality --keyword-messages`): kept by every other run.
CITUS = "## Single node vs Citus cluster"
FLEET = "## Runs table and search everything at fleet size"
PEERS_HTTP = "## Peers over HTTP"
QUALITY = "## Retrieval quality"
KEYWORD_SCALE = "## Keyword search in one large context"
KEPT = [CITUS, FLEET, PEERS_HTTP, QUALITY, KEYWORD_SCALE]
# How a report names the command that wrote it.
COMMAND = "- Command: `python manage.py benchmark"
# Before this heading when the file has no such section yet.
ANCHOR = "\n## Where the time goes"


def command_line(opts: dict, add_arguments: Callable[[ArgumentParser], None]) -> str:
    """The command a report names as its writer: the process's own arguments when it is
    `manage.py benchmark`; else (a `call_command`, a test's or a script's) the options it was
    given that differ from their defaults, as the command's parser (`add_arguments`) spells
    them, so that a run of some areas names its `--only` and is not taken for a full run."""
    argv = sys.argv
    if len(argv) > 1 and argv[0].endswith("manage.py") and argv[1] == "benchmark":
        return " ".join(["python manage.py", *argv[1:]])
    parser = ArgumentParser(add_help=False)
    add_arguments(parser)
    words = ["python manage.py benchmark"]
    for action in parser._actions:
        value = opts.get(action.dest, action.default)
        if not action.option_strings or value == action.default:
            continue
        words.append(max(action.option_strings, key=len))
        if action.nargs != 0:  # a flag (`--quick`) says it all by being there
            words.append(shlex.quote(str(value)))
    return " ".join(words)


def server_lines(db_name: str) -> Callable[[], list[str]]:
    """The machine's lines of a report written after the database `db_name` is dropped: its
    server's versions read now, while it is there; the date and load when called."""
    info = database.server_info(db_name)
    return lambda: machine_lines(info["server"], info["pgvector"])


def run_head(data: Dataset, db_name: str) -> tuple[list[str], str]:
    """The machine's lines (date, machine, database, load average now) and the dataset's line,
    which open a full run's report and a section measured alone alike: their figures are read
    with them. Read while the benchmark's database is still there."""
    return server_lines(db_name)(), dataset_line(data, db_name)


def dataset_line(data: Dataset, db_name: str) -> str:
    """What the figures were taken on: the database, its sizes, the vectors' model, psycopg."""
    s = data.sizes
    return (
        f"- Dataset (own database `{db_name}`): {s.messages:,} messages over "
        f"{s.contexts:,} contexts "
        f"(largest {data.largest_context_id and _largest(data)}), {s.runs:,} runs (longest "
        f"{s.max_steps:,} steps), "
        f"{s.dims}-dimension vectors for every message (model `{data.model}`; "
        + (
            f"spread along {s.local_dims} directions per subtopic, local intrinsic dimension "
            "near real sentence embeddings'"
            if s.local_dims
            else "isotropic noise in every dimension: the stress case"
        )
        + f"), psycopg {psycopg.__version__}"
    )


def _largest(data: Dataset) -> str:
    from memory_app.models import Context

    try:
        return f"{Context.objects.get(pk=data.largest_context_id).message_count:,} messages"
    except Context.DoesNotExist:
        return "?"


def opening(title: str, command: str, *, quick: bool) -> list[str]:
    """A section's title and the line saying which command wrote it and when."""
    return [
        title,
        "",
        f"Written by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        + (" (quick mode: checks the area runs; the figures mean nothing)" if quick else "")
        + "; the rest of this file comes from the full run and is left as it is.",
        "",
    ]


def paired_section(
    report, title: str, *, command: str, quick: bool, sides: tuple[str, str]
) -> list[str]:
    """The section of an area whose rows pair two sides call by call (its rows, then its notes
    after `title` in the report, the machine among them; their own heading left out: the
    section's title is it). `sides`: the two columns' names, ours first; a row measured on our
    side alone has a dash in the other's columns."""
    notes = report.notes[report.notes.index(title) + 1 :] if title in report.notes else []
    skipped = [f"- not measured: {line}" for line in report.not_measured]
    ours, other = sides
    return [
        *opening(title, command, quick=quick),
        f"| Measure | {ours} | {other} | {ours} ÷ {other.lower()} (pair median) | Spread, load "
        "| Target | Result |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r.measure} | {r.ours} | {r.baseline or '—'} | "
            f"{'—' if r.ratio is None else f'{r.ratio:.3g}×'} | {r.note} | {r.target.text} | "
            f"{r.status} |"
            for r in report.rows
        ),
        *notes,
        *([""] + skipped if skipped else []),
    ]


def measured_alone(
    report: Report, areas: str, *, command: str, quick: bool, head: list[str]
) -> tuple[str, list[str]]:
    """The title and section of a run of some of the full run's areas (`--only otlp`): their
    rows and notes beside the full run's report, which they leave as it is (a full run drops
    the section: it measures them again), after the run's own machine and dataset lines
    (`head`, `run_head`'s). The notes' own headings sit one level down, inside it."""
    title = f"## Measured alone: {areas}"
    notes = [f"#{line}" if line.startswith("## ") else line for line in report.notes]
    skipped = [f"- not measured: {line}" for line in report.not_measured]
    lines = [*opening(title, command, quick=quick), *head, "", *table(report.rows), "", *notes]
    return title, [*lines, *([""] + skipped if skipped else [])]


def write_report(
    path: Path,
    text: str,
    report: Report,
    only: str,
    alone,
    command: str,
    quick: bool,
    head: list[str],
) -> str:
    """Write a run's report into `path`; what to say after "written to": an area with a
    section of its own (`alone`, its module) writes that section only; a run of some other
    areas (`only`) a section of theirs (`measured_alone`, opening with `head`) into a full
    run's report, never over it; otherwise the whole file (`text`), the sections of the areas
    that only run alone (`KEPT`) carried over as they are."""
    if alone is not None:
        write_section(path, alone.SECTION, alone.section(report, command=command, quick=quick))
        return f" (its section {alone.SECTION!r})"
    if only and _holds_a_full_run(path):
        title, lines = measured_alone(report, only, command=command, quick=quick, head=head)
        write_section(path, title, lines)
        return f" (its section {title!r})"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(keep_sections(path, text, KEPT))
    return ""


def _holds_a_full_run(path: Path) -> bool:
    """Whether `path` holds the report of a run of every area (its command has no `--only`)."""
    if not path.exists():
        return False
    commands = [line for line in path.read_text().splitlines() if line.startswith(COMMAND)]
    return bool(commands) and "--only" not in commands[0]


def write_section(path: Path, title: str, lines: list[str]) -> None:
    """Put the section (its first line is `title`) into `path` in place of the one there (else
    before the profiles, else at the end), leaving the rest of the file as it is."""
    old = path.read_text() if path.exists() else ""
    path.write_text(with_section(old, title, "\n".join(lines).rstrip() + "\n"))


def _title_at(text: str, title: str) -> int:
    """Where the line `title` starts in `text` (-1 for none): a whole line, so a heading one
    level down that ends with the same words is not it."""
    if text.startswith(title + "\n"):
        return 0
    found = text.find("\n" + title + "\n")
    return found + 1 if found >= 0 else -1


def with_section(text: str, title: str, block: str) -> str:
    start = _title_at(text, title)
    if start >= 0:
        end = text.find("\n## ", start + len(title))
        return text[:start] + block + ("\n" + text[end + 1 :] if end >= 0 else "")
    anchor = text.find(ANCHOR)
    if anchor >= 0:
        return text[: anchor + 1] + block + "\n" + text[anchor + 1 :]
    return (text.rstrip() + "\n\n" if text.strip() else "") + block


def kept_section(old_path: Path, title: str) -> str | None:
    """The section of `old_path` headed `title`, which a full run's rewrite carries over."""
    if not old_path.exists():
        return None
    text = old_path.read_text()
    start = _title_at(text, title)
    if start < 0:
        return None
    end = text.find("\n## ", start + len(title))
    return text[start : end + 1 if end >= 0 else len(text)].rstrip() + "\n"


def keep_sections(old_path: Path, text: str, titles: list[str]) -> str:
    """`text` (a full run's report) with the sections of `old_path` headed `titles`."""
    for title in titles:
        kept = kept_section(old_path, title)
        if kept:
            text = with_section(text, title, kept)
    return text
