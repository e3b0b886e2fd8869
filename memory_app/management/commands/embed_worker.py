"""Fill in pending embeddings: `manage.py embed_worker [--once] [--max-batches N] [--batch-size N]`.

Run as many as you like, on any machines: each batch is claimed with FOR UPDATE SKIP LOCKED, so
no item is embedded twice; a provider failure postpones the batch with exponential backoff.
Each turn also inserts a batch of deferred vectors into their HNSW graph (see index_pending) and
removes a batch of what is past its retention (expired memories, retention policies), and maps a
batch of queued OTLP exports into runs and steps. With no embedding provider configured it does
all of that but the embedding (the span mapping must not wait for a provider).
`--provider/--model/--base-url` embed another model's queue (e.g. during `reembed`).
"""

from __future__ import annotations

import logging
import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from memory_app import errors
from memory_app.backlog import run_worker
from memory_app.embeddings import providers, queue
from memory_app.services.retention import retention_batch
from memory_app.services.span_queue import ExportWait, spans_map_chore

log = logging.getLogger("memory_app.embeddings")


class Command(BaseCommand):
    help = "Compute pending embeddings with the configured provider (safe to run several at once)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--once", action="store_true", help="stop when nothing is due instead of waiting"
        )
        parser.add_argument(
            "--max-batches", type=int, default=None, help="stop after this many batches"
        )
        parser.add_argument("--batch-size", type=int, default=None, help="items per provider call")
        parser.add_argument(
            "--idle-sleep", type=float, default=2.0, help="seconds to wait when idle"
        )
        parser.add_argument(
            "--provider",
            choices=["local", "openai"],
            help="default: AGENTMEMORY_EMBEDDING_PROVIDER",
        )
        parser.add_argument("--model", help="default: AGENTMEMORY_EMBEDDING_MODEL")
        parser.add_argument("--base-url", help="openai: default AGENTMEMORY_OPENAI_BASE_URL")

    def handle(self, *args, **opts):
        provider = (
            None
            if not opts.get("provider") and providers.provider_kind() == "none"
            else provider_from_options(opts)
        )
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
        if provider is None:
            self.stdout.write(
                "no embedding provider configured: mapping spans, indexing and retention only"
            )
        else:
            self.stdout.write(
                f"embedding with {provider.describe()}: "
                f"{queue.pending_count(model=provider.model)} pending"
            )
        # An idle worker starts mapping when an export is queued, not at the end of its sleep:
        # it listens before its first look at the queue.
        idle = ExportWait(stop)
        try:
            if not opts["once"]:
                idle.listen()
            totals = run_worker(
                provider=provider,
                batch_size=opts["batch_size"],
                once=opts["once"],
                max_batches=opts["max_batches"],
                idle_sleep=opts["idle_sleep"],
                stop=stop,
                # A worker that keeps running maps at the background priority; `--once` (a
                # test, a cron job run by hand) leaves the calling process as it is.
                chores=[
                    retention_batch,
                    spans_map_chore if opts["once"] else _spans_map_background,
                ],
                idle=idle,
            )
        finally:
            idle.close()
        self.stdout.write(
            f"done: {totals.embedded} embedded, {totals.failed} postponed,"
            f" {totals.indexed} indexed, {totals.parsed} full-text written"
            + (f" (last error: {totals.error})" if totals.error else "")
            + (
                f", {queue.pending_count(model=provider.model)} pending"
                if provider is not None
                else ""
            )
        )


def _spans_map_background() -> int:
    return spans_map_chore(background=True)


def provider_from_options(opts) -> providers.EmbeddingProvider:
    kind = opts.get("provider") or providers.provider_kind()
    if kind == "none":
        raise CommandError(
            "no embedding provider configured: "
            "set AGENTMEMORY_EMBEDDING_PROVIDER or pass --provider"
        )
    model = opts.get("model") or (
        providers.active_model_name() if kind == providers.provider_kind() else None
    )
    try:
        return providers.build_provider(kind=kind, model=model, base_url=opts.get("base_url"))
    except errors.ProviderUnavailable as exc:
        raise CommandError(str(exc)) from exc
