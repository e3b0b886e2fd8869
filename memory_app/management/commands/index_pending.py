"""Insert deferred vectors into their HNSW graph and write the full-text vectors of messages
stored in large batches: `manage.py index_pending [--batch-size N]`.

A batch of at least AGENTMEMORY_INDEX_DEFER_MIN client vectors is stored without the graph
insertion; each web process's indexer thread and `embed_worker` drain that backlog. This command
drains it once and stops (cron, or a deployment with the thread turned off and no provider).
Safe beside them: rows are claimed with FOR UPDATE SKIP LOCKED.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from memory_app.embeddings import indexer, queue
from memory_app.search import fulltext


class Command(BaseCommand):
    help = (
        "Insert the vectors waiting for their HNSW index and the full-text vectors waiting for "
        "the indexer, then stop."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=None, help="rows per transaction")

    def handle(self, *args, **opts):
        self.stdout.write(f"{queue.unindexed_count()} vectors waiting for their index")
        done = indexer.index_pending(batch_size=opts["batch_size"])
        self.stdout.write(f"done: {done} indexed, {queue.unindexed_count()} waiting")
        self.stdout.write(f"{fulltext.pending_count()} messages waiting for their full-text vector")
        parsed = fulltext.index_pending(batch_size=opts["batch_size"])
        self.stdout.write(f"done: {parsed} written, {fulltext.pending_count()} waiting")
