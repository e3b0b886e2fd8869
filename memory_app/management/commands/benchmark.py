"""`manage.py benchmark`: speed at scale, against a naive baseline, in the same run.

Builds a synthetic dataset in its own database on the same server (default `agentmemory_bench`,
dropped and recreated unless `--reuse`), measures ingest, selectors, search, transcripts, export
and dashboard pages, prints a table and writes it as Markdown (default `docs/benchmarks.md`).
See `memory_app/bench/`.
"""

from __future__ import annotations

import os
import shutil
import time
import traceback
from pathlib import Path

import psycopg
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, connections
from django.test import Client

from memory_app.bench import (
    citus,
    citus_rows,
    dashboard,
    database,
    export,
    fleet,
    http_path,
    ingest,
    keyword_scale,
    otlp,
    peers,
    peers_http,
    quality,
    recall,
    sections,
    selectors,
    startup,
    storage,
    transcript,
)
from memory_app.bench.dataset import Dataset, Sizes
from memory_app.bench.harness import Bench, BenchError
from memory_app.bench.load import build
from memory_app.bench.measure import Report, plain_table, table

META_TABLE = "bench_meta"
# Hand-written profiles of the misses, appended to the report (re-check them after changes).
NOTES = Path(__file__).resolve().parents[2] / "bench" / "notes.md"
# Reads first, ingest last: the writes must not disturb what the reads see.
AREAS = {
    "startup": startup.run,
    "selectors": selectors.selectors,
    "recall": recall.recall,
    "transcript": transcript.transcript,
    "export": export.export,
    "dashboard": dashboard.dashboard,
    "storage": storage.storage,
    "http_path": http_path.run,
    "ingest": ingest.ingest,
    "otlp": otlp.otlp,
    # Only with --peers (or --only peers): needs the `peers` extra.
    "peers": peers.run,
    # Only with --only peers_http: the peers served in their venv (`make peers-venv`).
    "peers_http": peers_http.run,
}
# With --output, these alone write only their section (a full run writes the request path's
# itself; bench/sections.py keeps the sections of the areas that only run alone).
ALONE_SECTIONS = {"peers_http": peers_http, "http_path": http_path}


class Command(BaseCommand):
    help = (
        "Benchmark the server at scale against a naive in-process baseline; "
        "writes docs/benchmarks.md."
    )
    # System checks would open the site's database before the switch; nothing here needs them.
    requires_system_checks: list = []

    # One option after another, in the order --help lists them: split up, they are harder to find.
    def add_arguments(self, parser):
        d = Sizes()
        parser.add_argument(
            "--quick", action="store_true", help="tiny sizes for CI: checks the command works"
        )
        parser.add_argument(
            "--scale",
            action="store_true",
            help="the scale of the targets: 1,000,000 messages in one context, "
            "1,200,000 vectors in the store (database agentmemory_bench_1m unless --db-name; "
            "built once, then reused)",
        )
        parser.add_argument(
            "--peers",
            action="store_true",
            help="also run langchain-postgres chat history, LangGraph PostgresStore and the naive "
            "baseline on the same data and print ours ÷ peer (needs agentmemory[peers])",
        )
        parser.add_argument(
            "--quality",
            action="store_true",
            help="retrieval quality instead of speed: recall@5/10 and MRR of each search mode on "
            "LoCoMo (fetched from its public URL into var/bench/ on first use), beside "
            "in-process BM25 and exact dense baselines (needs agentmemory[bench,embeddings]; "
            "database agentmemory_bench_quality unless --db-name; its section of --output)",
        )
        parser.add_argument(
            "--dataset",
            default=None,
            help="with --quality: a LoCoMo JSON file (or a folder of its per-conversation files) "
            "to read instead of fetching it",
        )
        parser.add_argument(
            "--keyword-messages",
            type=int,
            default=None,
            help="with --quality: instead of the quality figures, time LoCoMo's questions in "
            "keyword mode on one context of this many messages (target at 1,000,000: p50 ≤ 30 "
            "ms; database agentmemory_bench_keyword unless --db-name, built once, then reused; "
            "its section of --output)",
        )
        parser.add_argument(
            "--messages",
            type=int,
            default=None,
            help=f"messages in the dataset (default {d.messages:,})",
        )
        parser.add_argument(
            "--contexts", type=int, default=None, help=f"contexts (default {d.contexts:,})"
        )
        parser.add_argument("--runs", type=int, default=None, help=f"runs (default {d.runs:,})")
        parser.add_argument(
            "--max-steps",
            type=int,
            default=None,
            help=f"steps of the longest run (default {d.max_steps:,})",
        )
        parser.add_argument(
            "--local-dims",
            type=int,
            default=None,
            help=f"directions of each subtopic's vector spread (default {d.local_dims}, calibrated "
            "on real sentence embeddings); 0: isotropic noise in every dimension, the stress-case "
            "vectors of the reports before 2026-11-23",
        )
        parser.add_argument(
            "--samples",
            type=int,
            default=None,
            help="timed calls per latency figure (default 50, quick 5)",
        )
        parser.add_argument(
            "--db-name", default=None, help="benchmark database (default agentmemory_bench[_quick])"
        )
        parser.add_argument(
            "--reuse",
            action="store_true",
            help="reuse the database of an earlier run with the same sizes",
        )
        parser.add_argument(
            "--rebuild",
            action="store_true",
            help="with --scale or --only fleet: drop and rebuild its database even if it holds no "
            "finished dataset "
            "(by default --scale reuses a finished one and refuses to drop an unfinished one: "
            "a build may be under way in another process)",
        )
        parser.add_argument(
            "--keep",
            action="store_true",
            help="keep the benchmark database afterwards (default: keep unless --quick)",
        )
        parser.add_argument(
            "--drop", action="store_true", help="drop the benchmark database afterwards"
        )
        parser.add_argument(
            "--only",
            default="",
            help="comma-separated areas to measure: " + ", ".join(AREAS) + " (default all); citus, "
            "fleet, peers_http or http_path alone write only their section: citus the single node "
            "against a Citus cluster, fleet the runs table and search everything at 100,000 runs, "
            "1,000,000 steps and 1,000,000 messages (database agentmemory_bench_fleet unless "
            "--db-name; built once, then reused)",
        )
        parser.add_argument(
            "--citus-tree",
            default=None,
            help="with --only citus: the Citus build to start a coordinator and 2 workers from "
            f"(default $AGENTMEMORY_CITUS_TREE, else {citus.DEFAULT_TREE})",
        )
        parser.add_argument(
            "--citus-url",
            default=None,
            help="with --only citus: a running coordinator's DATABASE_URL instead (its database "
            "empty, with the citus and vector extensions, the workers added)",
        )
        parser.add_argument(
            "--output",
            default=None,
            help="Markdown file (default docs/benchmarks.md; quick: none unless given)",
        )

    def log(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **opts):
        self.command_line = sections.command_line(opts, self.add_arguments)
        if opts["quality"]:
            return self._quality(opts)
        if "citus" in {a.strip() for a in opts["only"].split(",")}:
            if opts["only"].strip() != "citus":
                raise CommandError("--only citus runs alone (it builds its own two stores)")
            return self._citus(opts)
        if "fleet" in {a.strip() for a in opts["only"].split(",")}:
            if opts["only"].strip() != "fleet":
                raise CommandError("--only fleet runs alone (it builds its own database)")
            return self._fleet(opts)
        quick, scale = opts["quick"], opts["scale"]
        if quick and scale:
            raise CommandError("--quick and --scale exclude each other")
        base = Sizes.quick() if quick else Sizes.scale() if scale else Sizes()
        overrides = {
            k: opts[k]
            for k in ("messages", "contexts", "runs", "max_steps", "local_dims")
            if opts[k] is not None
        }
        sizes = Sizes(**{**base.as_dict(), **overrides})
        if sizes.max_steps < sizes.transcript_steps:
            sizes = Sizes(**{**sizes.as_dict(), "transcript_steps": max(1, sizes.max_steps // 2)})
        unknown = {a.strip() for a in opts["only"].split(",") if a.strip()} - set(AREAS)
        if unknown:
            raise CommandError(f"unknown areas {sorted(unknown)}: choose from {', '.join(AREAS)}")
        with_peers = opts["peers"] or "peers" in {a.strip() for a in opts["only"].split(",")}
        if with_peers:
            try:
                peers.load()
            except peers.PeersMissing as exc:
                raise CommandError(str(exc)) from exc
        db_name = opts["db_name"] or (
            "agentmemory_bench_quick"
            if quick
            else "agentmemory_bench_1m"
            if scale
            else "agentmemory_bench"
        )
        samples = opts["samples"] or (5 if quick else 50)
        output = _output(opts, quick=quick)
        if quick:
            # Exercise the HNSW path on the tiny dataset too (the default threshold is 3,000).
            settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 500

        # The scale dataset takes most of an hour to build: reused unless --rebuild.
        reuse = opts["reuse"] or (scale and not opts["rebuild"])
        data = self._prepare(
            db_name, sizes, reuse=reuse, quick=quick, guard=scale and not opts["rebuild"]
        )
        try:
            report = self._measure(
                data, samples=samples, quick=quick, only=opts["only"], with_peers=with_peers
            )
            machine, dataset = sections.run_head(data, db_name)
            text = self._markdown(report, data, machine, dataset, samples=samples, quick=quick)
        finally:
            connection.close()
            if opts["drop"] or (quick and not opts["keep"]):
                database.drop_database(db_name)
        self.log("")
        self.log(plain_table(report.rows))
        for line in report.not_measured:
            self.log(line)
        if output:
            only = opts["only"].strip()
            alone, command = ALONE_SECTIONS.get(only), self.command_line
            head = [*machine, dataset]
            written = sections.write_report(
                Path(output), text, report, only, alone, command, quick, head
            )
            self.log(f"\nwritten to {output}{written}")

    def _citus(self, opts) -> None:
        """The single node against a Citus cluster (memory_app/bench/citus.py)."""
        import os

        from memory_app.bench.load import build

        quick = opts["quick"]
        overrides = {k: opts[k] for k in ("messages", "contexts", "runs") if opts[k] is not None}
        data_sizes = citus.sizes(quick=quick, **overrides)
        db_name = opts["db_name"] or ("agentmemory_bench_citus" + ("_quick" if quick else ""))
        samples = opts["samples"] or (5 if quick else 50)
        output = _output(opts, quick=quick)
        tree = Path(
            opts["citus_tree"] or os.environ.get("AGENTMEMORY_CITUS_TREE") or citus.DEFAULT_TREE
        ).resolve()
        single_wrapper = connections["default"]
        pair = cluster = data_dir = None
        try:
            if opts["citus_url"]:
                cluster = citus.Cluster(url=opts["citus_url"], description="given coordinator")
            else:
                data_dir = Path(settings.BASE_DIR) / "var" / "bench" / f"citus-{db_name}"
                cluster = citus.start_cluster(tree, data_dir, db_name, self.log)
            pair, data = citus.prepare(
                db_name=db_name,
                data_sizes=data_sizes,
                cluster=cluster,
                log=self.log,
                build=lambda s: build(sizes=s, log=self.log, **({"chunk": 500} if quick else {})),
            )
            citus_rows.connect_clients(pair)
            self.log(f"measuring citus ({samples} calls per side)")
            rows, fanned = citus_rows.measure(pair, data, samples=samples, log=self.log)
            store = citus_rows.storage(pair, data)
            lines = citus_rows.section(
                rows,
                fanned,
                store,
                data,
                command=self.command_line,
                cluster=cluster.description,
                samples=samples,
                quick=quick,
            )
        except citus.BenchError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            citus.close(pair, single_wrapper)
            if cluster is not None and cluster.stop is not None:
                cluster.stop()
            if not opts["keep"]:
                database.drop_database(db_name)
                if data_dir is not None:
                    shutil.rmtree(data_dir, ignore_errors=True)
        self.log("\n" + "\n".join(lines))
        self._write_section(output, citus_rows.SECTION, lines)

    def _fleet(self, opts) -> None:
        """The runs table and search everything at their targets' size (bench/fleet.py)."""
        quick = opts["quick"]
        sizes = fleet.FleetSizes.quick() if quick else fleet.FleetSizes()
        db_name = opts["db_name"] or ("agentmemory_bench_fleet" + ("_quick" if quick else ""))
        samples = opts["samples"] or (5 if quick else 20)
        output = _output(opts, quick=quick)
        try:
            rows, lines = fleet.run(
                db_name=db_name,
                sizes=sizes,
                rebuild=opts["rebuild"] or quick,
                samples=samples,
                quick=quick,
                command=self.command_line,
                log=self.log,
            )
        except fleet.FleetError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            connection.close()
            if opts["drop"] or (quick and not opts["keep"]):
                database.drop_database(db_name)
        self.log("\n" + plain_table([r.row for r in rows]))
        self._write_section(output, fleet.SECTION, lines)

    def _quality(self, opts) -> None:
        path = Path(opts["dataset"] or Path(settings.BASE_DIR) / "var" / "bench" / "locomo10.json")
        if not opts["dataset"]:
            self.log(f"dataset: {path} (fetched from {quality.LOCOMO_URL} if absent)")
            quality.fetch_dataset(path)
        try:
            conversations = quality.read_locomo(path)
        except quality.DatasetError as exc:
            raise CommandError(str(exc)) from exc
        if opts["keyword_messages"]:
            return self._keyword_scale(conversations, opts["keyword_messages"], opts)
        settings.AGENTMEMORY_EMBEDDING_PROVIDER = "local"
        db_name = opts["db_name"] or "agentmemory_bench_quality"
        try:
            database.switch_to(db_name)
            database.recreate_database(db_name)
        except (database.BenchDatabaseError, psycopg.Error) as exc:
            raise CommandError(f"cannot prepare the benchmark database {db_name!r}: {exc}") from exc
        database.migrate()
        machine = sections.server_lines(db_name)
        self.log(
            f"{len(conversations)} conversations, "
            f"{sum(len(c.questions) for c in conversations)} questions"
        )
        try:
            result = quality.run(conversations, self.log)
        finally:
            connection.close()
            if not opts["keep"]:
                database.drop_database(db_name)
        self.log("")
        self.log("\n".join(quality.report(result)))
        lines = quality.section(result, conversations, command=self.command_line, machine=machine())
        self._write_section(_output(opts, quick=False), sections.QUALITY, lines)

    def _keyword_scale(self, conversations, messages: int, opts) -> None:
        db_name = opts["db_name"] or "agentmemory_bench_keyword"
        settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
        try:
            context = keyword_scale.prepare(db_name, conversations, messages, self.log)
        except (database.BenchDatabaseError, psycopg.Error) as exc:
            raise CommandError(f"cannot prepare the benchmark database {db_name!r}: {exc}") from exc
        questions = [q for c in conversations for q, _ in c.questions]
        step = max(len(questions) // keyword_scale.QUESTIONS, 1)
        result = keyword_scale.run(context, questions[::step][: keyword_scale.QUESTIONS], self.log)
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        self.log("\n".join(keyword_scale.report(result, messages, load)))
        machine = sections.server_lines(db_name)()
        lines = keyword_scale.section(
            result, messages, load=load, command=self.command_line, machine=machine
        )
        self._write_section(_output(opts, quick=False), sections.KEYWORD_SCALE, lines)

    def _write_section(self, output: str | None, title: str, lines: list[str]) -> None:
        """A run's own section (`title`) into the report `output`, if any."""
        if output:
            sections.write_section(Path(output), title, lines)
            self.log(f"\nwritten to {output} (its section {title!r})")

    # --- database and dataset -----------------------------------------------------------------

    def _prepare(
        self, db_name: str, sizes: Sizes, *, reuse: bool, quick: bool, guard: bool = False
    ) -> Dataset:
        try:
            exists = database.database_exists(db_name)
        except Exception as exc:  # the server is not reachable: say so plainly
            raise CommandError(f"cannot reach the PostgreSQL server: {exc}") from exc
        if reuse and exists:
            database.switch_to(db_name)
            data = self._load_meta()
            if data is not None and data.sizes == sizes:
                self.log(f"reusing database {db_name} ({sizes.messages:,} messages)")
                # Migrations added since the build (an index, say) must be measured too.
                database.migrate()
                with connection.cursor() as cursor:
                    cursor.execute("ANALYZE")
                return data
            if guard:
                raise CommandError(
                    f"database {db_name} holds no finished dataset of these sizes (a build may be "
                    "under way in another process: wait for it); --rebuild drops and rebuilds it"
                )
            self.log(f"database {db_name} holds other sizes (or none): rebuilding")
            connection.close()
        try:
            database.switch_to(db_name)
        except database.BenchDatabaseError as exc:
            raise CommandError(str(exc)) from exc
        self.log(f"creating database {db_name}")
        try:
            database.recreate_database(db_name)
        except psycopg.Error as exc:
            raise CommandError(
                f"cannot create the benchmark database {db_name!r}: {exc} (the database user needs "
                "CREATEDB; or give --db-name of a database it may drop and recreate)"
            ) from exc
        database.migrate()
        self.log(
            f"building the dataset: {sizes.messages:,} messages over {sizes.contexts:,} contexts, "
            f"{sizes.runs:,} runs (up to {sizes.max_steps:,} steps), {sizes.dims}-dim vectors"
        )
        # Quick mode loads in small chunks so that the chunked path is exercised too.
        data = build(sizes=sizes, log=self.log, **({"chunk": 500} if quick else {}))
        for name, seconds in data.build_seconds.items():
            self.log(f"  {name}: {seconds:.1f} s")
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE TABLE {META_TABLE} (data jsonb NOT NULL)")
            cursor.execute(f"INSERT INTO {META_TABLE} (data) VALUES (%s)", [data.to_json()])  # noqa: S608
        return data

    def _load_meta(self) -> Dataset | None:
        raw = database.stored_meta(META_TABLE)
        return None if raw is None else Dataset.from_json(raw)

    # --- measurements -------------------------------------------------------------------------

    def _measure(
        self, data: Dataset, *, samples: int, quick: bool, only: str = "", with_peers: bool = False
    ) -> Report:
        from memory_app import auth

        report = Report()
        issued = auth.apikey_create(name="benchmark", scopes=["read", "write", "admin"])
        api = Client(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(
            username="benchmark", defaults={"is_superuser": True, "is_staff": True}
        )
        web = Client()
        web.force_login(user)
        bench = Bench(
            data=data,
            report=report,
            api=api,
            web=web,
            log=self.log,
            samples=samples,
            quick=quick,
            api_secret=issued.secret,
        )
        only = [a.strip() for a in only.split(",") if a.strip()]
        for name, fn in AREAS.items():
            unasked = (name == "peers" and not with_peers) or (name == "peers_http" and not only)
            if (only and name not in only) or unasked:
                continue
            self.log(f"measuring {name}")
            t = time.perf_counter()
            try:
                fn(bench)
            except Exception as exc:  # one broken area must not lose the others' figures
                report.skip(name, f"failed: {type(exc).__name__}: {str(exc)[:300]}", self.log)
                if not isinstance(exc, BenchError):
                    traceback.print_exc(file=self.stderr)
            self.log(f"  ({time.perf_counter() - t:.1f} s)")
        return report

    # --- report -------------------------------------------------------------------------------

    def _markdown(
        self,
        report: Report,
        data: Dataset,
        machine: list[str],
        dataset: str,
        *,
        samples: int,
        quick: bool,
    ) -> str:
        lines = [
            "# Benchmarks",
            "",
            "Written by `python manage.py benchmark` (`make bench`); do not edit by hand.",
            "",
            *machine,
            f"- Command: `{self.command_line}`"
            + (" (quick mode: CI smoke check, figures mean nothing)" if quick else ""),
            dataset,
            f"- Latencies: p50 / p95 over {samples} timed calls after a warm-up (baseline: "
            "fewer calls); "
            "server time is the time until the response is complete, through Django's full "
            "WSGI stack "
            "in-process (`django.test.Client`) with a real API key or a logged-in user.",
            "- Naive baseline: the same work done as an in-process memory does it (load the "
            "context's "
            "messages into Python and select there; one ORM INSERT per message, step and "
            "tool call; "
            "load everything then serialise for export). It runs without the HTTP layer. "
            "Dashboard pages "
            "and recall have no baseline (an in-process memory has no pages; recall is "
            "against the exact scan).",
            "- Ours / baseline: the ratio of the headline figures (p50 for latencies, rate "
            "for throughput): "
            "below 1 is faster for latencies, above 1 is faster for rates.",
            "",
            "## Results",
            "",
            *table(report.rows),
            "",
        ]
        if report.not_measured:
            lines += ["## Not measured", "", *[f"- {line}" for line in report.not_measured], ""]
        if data.build_seconds:
            lines += [
                "## Dataset build",
                "",
                *[f"- {k}: {v:.1f} s" for k, v in data.build_seconds.items()],
                "",
            ]
        missed = report.missed()
        if missed:
            lines += [
                "## Targets missed",
                "",
                *[
                    f"- {r.area}: {r.measure} — {r.ours} (target {r.target.text}; {_gap(r)})"
                    for r in missed
                ],
                "",
            ]
        lines += report.notes
        if NOTES.exists() and not quick:
            lines += ["", NOTES.read_text().strip(), ""]
        return "\n".join(lines).rstrip() + "\n"


def _gap(row) -> str:
    """How far a missed figure is from its target."""
    from memory_app.bench.measure import headline

    value, limit = headline(row.ours), row.target.limit
    if row.target.of_ratio:
        value = row.ratio if row.ratio is not None else value
    if row.target.op == "<=":
        return f"{value / limit:.2f}× the limit"
    return f"{value / limit:.0%} of the target"


def _output(opts, *, quick: bool) -> str | None:
    """The report a run writes: `--output`, else docs/benchmarks.md (a quick run: none)."""
    return opts["output"] or (
        None if quick else str(Path(settings.BASE_DIR) / "docs" / "benchmarks.md")
    )
