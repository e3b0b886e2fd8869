"""Apply the trace span retention once: `manage.py expire_spans [--batch-size N]`.

Spans received more than AGENTMEMORY_SPAN_RETENTION_DAYS ago are deleted in committed batches
(the runs and steps made from them stay). `embed_worker` does the same, one batch a turn; this
command is for cron, or a deployment without an embedding provider. Safe beside them: rows are
taken with FOR UPDATE SKIP LOCKED.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from memory_app import backlog


class Command(BaseCommand):
    help = "Delete the trace spans older than AGENTMEMORY_SPAN_RETENTION_DAYS, then stop."

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch-size",
            type=int,
            default=backlog.SPAN_EXPIRE_BATCH,
            help="spans per transaction",
        )

    def handle(self, *args, **opts):
        days = settings.AGENTMEMORY_SPAN_RETENTION_DAYS
        if days <= 0:
            self.stdout.write("AGENTMEMORY_SPAN_RETENTION_DAYS is 0: trace spans are kept")
            return
        expired = backlog.expire_spans(batch_size=opts["batch_size"])
        self.stdout.write(f"done: {expired} trace spans older than {days} days expired")
