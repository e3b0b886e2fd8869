"""Rebuild the per-model HNSW indexes whose m / ef_construction differ from the settings.

    manage.py hnsw_rebuild [--check] [--model NAME] [--all] [--maintenance-work-mem 2GB]

AGENTMEMORY_HNSW_M and AGENTMEMORY_HNSW_EF_CONSTRUCTION shape new indexes only; an index built
earlier keeps its graph until it is rebuilt (`manage.py check --database default` warns about
it). Each rebuild runs CONCURRENTLY: writes go on and searches keep walking the old index until the
new one is ready (minutes per 100,000 vectors on a small machine; progress in PostgreSQL's
`pg_stat_progress_create_index`).
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from memory_app.embeddings import indexer, queue


class Command(BaseCommand):
    help = "Rebuild HNSW indexes built with other m / ef_construction than the settings ask for."

    def add_arguments(self, parser):
        parser.add_argument(
            "--check", action="store_true", help="only list them; exit 1 when one needs a rebuild"
        )
        parser.add_argument("--model", help="only this model's index")
        parser.add_argument(
            "--all", action="store_true", help="rebuild even the indexes whose parameters match"
        )
        parser.add_argument(
            "--maintenance-work-mem",
            default="1GB",
            help="memory for each build (the graph is built in memory when it fits: much faster)",
        )

    def handle(self, *args, **opts):
        indexes = indexer.built_indexes()
        if opts["model"]:
            indexes = [i for i in indexes if i.model == opts["model"]]
            if not indexes:
                raise CommandError(f"model {opts['model']!r} has no HNSW index")
        if not indexes:
            self.stdout.write(
                "No HNSW index yet (one is built when a model's first vector is stored)."
            )
            return
        m, efc = indexes[0].configured
        self.stdout.write(f"Settings: m={m}, ef_construction={efc}")
        todo = [i for i in indexes if opts["all"] or i.stale]
        for index in indexes:
            state = "to rebuild" if index in todo else "up to date"
            waiting = queue.unindexed_count(model=index.model)
            if waiting:  # a deferred batch's vectors, not yet in this graph (see index_pending)
                state += f", {waiting} vectors waiting for the indexer"
            self.stdout.write(f"  {index.describe()} — {state}")
        if opts["check"]:
            if todo:
                raise CommandError(
                    f"{len(todo)} index(es) built with other parameters", returncode=1
                )
            return
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('maintenance_work_mem', %s, false)",
                [opts["maintenance_work_mem"]],
            )
        for index in todo:
            self.stdout.write(f"Rebuilding the index of {index.describe()} CONCURRENTLY…")
            started = time.monotonic()
            try:
                rebuilt = indexer.rebuild_model_index(index)
            except indexer.IndexBusy as exc:
                raise CommandError(f"{exc}; try again when it is done") from exc
            self.stdout.write(
                self.style.SUCCESS(
                    f"  now {rebuilt.describe()} ({time.monotonic() - started:.0f} s)"
                )
            )
        if not todo:
            self.stdout.write("Nothing to rebuild.")
