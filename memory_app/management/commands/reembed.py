"""Move a context, or the whole store, to another embedding model without downtime.

    manage.py reembed --provider openai --model text-embedding-3-large [--context 42] [--once]

Queues a row for the new model beside every item's existing ones and fills them in (the same
SKIP LOCKED batches as `embed_worker`, so extra workers with the same --provider/--model help).
Searches keep using the configured model's rows meanwhile; when the command reports the new
model complete, switch AGENTMEMORY_EMBEDDING_MODEL (and provider) to it, then run it once more to
catch items written in between. `--drop-old MODEL` deletes a retired model's rows afterwards.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from memory_app.backlog import run_worker
from memory_app.embeddings import providers, queue
from memory_app.management.commands.embed_worker import provider_from_options
from memory_app.models import (
    Context,
    Embedding,
    EmbeddingWaiting,
    MemoryEmbedding,
    MemoryEmbeddingWaiting,
)


class Command(BaseCommand):
    help = (
        "Embed every item (or one context's) with another model while the current one keeps "
        "serving."
    )

    def add_arguments(self, parser):
        parser.add_argument("--provider", choices=["local", "openai"])
        parser.add_argument("--model", help="the new model name")
        parser.add_argument("--base-url")
        parser.add_argument("--context", type=int, help="only this context")
        parser.add_argument("--batch-size", type=int, default=None)
        parser.add_argument(
            "--queue-only", action="store_true", help="queue rows; let embed_worker fill them"
        )
        parser.add_argument(
            "--drop-old", metavar="MODEL", help="delete this model's rows (after the switch)"
        )

    def handle(self, *args, **opts):
        if opts["drop_old"]:
            if opts["drop_old"] == providers.active_model_name():
                raise CommandError(
                    "refusing to drop the model searches use now (AGENTMEMORY_EMBEDDING_MODEL)"
                )
            deleted = 0
            for table, context_field in (
                (Embedding, "context_id"),
                (EmbeddingWaiting, "context_id"),
                (MemoryEmbedding, "memory_record__context_id"),
                (MemoryEmbeddingWaiting, "memory_record__context_id"),
            ):
                qs = table.objects.filter(model=opts["drop_old"])
                if opts["context"]:
                    qs = qs.filter(**{context_field: opts["context"]})
                deleted += qs.delete()[1].get(table._meta.label, 0)
            self.stdout.write(f"deleted {deleted} rows of {opts['drop_old']}")
            return
        if opts["context"] and not Context.objects.filter(pk=opts["context"]).exists():
            raise CommandError(f"context {opts['context']} not found")
        provider = provider_from_options(opts)
        queued = queue.reembed_enqueue(model=provider.model, context_id=opts["context"])
        self.stdout.write(f"queued {queued} items for {provider.model}")
        if not opts["queue_only"]:
            totals = run_worker(provider=provider, batch_size=opts["batch_size"], once=True)
            self.stdout.write(f"embedded {totals.embedded}, postponed {totals.failed}")
        done, total = queue.model_coverage(model=provider.model, context_id=opts["context"])
        state = "complete" if done == total else "incomplete"
        self.stdout.write(f"{provider.model}: {done}/{total} embedded ({state})")
