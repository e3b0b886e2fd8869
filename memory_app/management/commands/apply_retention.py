"""Apply the retention once: `manage.py apply_retention [--policy ID] [--batch-size N]`.

Removes the memories past their expiry date, then runs each enabled retention policy's pass to
its end, in committed batches, printing each batch; every pass ends with an audited summary.
Interrupted, it loses nothing: the next run (or `embed_worker`) goes on where it stopped.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from memory_app.errors import Invalid
from memory_app.models import RetentionPolicy
from memory_app.services import retention


class Command(BaseCommand):
    help = "Remove expired memories and apply the retention policies, then stop."

    def add_arguments(self, parser):
        parser.add_argument("--policy", type=int, help="only this policy (and no memory expiry)")
        parser.add_argument(
            "--batch-size", type=int, default=retention.BATCH_SIZE, help="rows per transaction"
        )

    def handle(self, *args, **opts):
        size = opts["batch_size"]
        try:
            retention.check_batch_size(size)
        except Invalid as exc:
            raise CommandError(str(exc)) from exc
        policies = RetentionPolicy.objects.filter(enabled=True).order_by("pk")
        if opts["policy"] is not None:
            policies = RetentionPolicy.objects.filter(pk=opts["policy"])
            if not policies.exists():
                raise CommandError(f"retention policy {opts['policy']} not found")
        else:
            expired = 0
            while removed := retention.memories_expire_batch(batch_size=size):
                expired += removed
                self.stdout.write(f"memories: {removed} expired ({expired} so far)")
            self.stdout.write(f"memories: {expired} expired memories removed")

        def progress(policy, done):
            if done.removed:
                self.stdout.write(
                    f"policy {policy.pk} ({policy.name}): {done.removed} {policy.kind} removed"
                    f" ({done.total} so far)"
                )

        for policy in policies:
            if not policy.enabled:
                self.stdout.write(f"policy {policy.pk} ({policy.name}) is disabled: skipped")
                continue
            done = retention.policy_apply(policy=policy, batch_size=size, progress=progress)
            self.stdout.write(
                f"policy {policy.pk} ({policy.name}): done, {done.total} {policy.kind} older"
                f" than {policy.max_age_days} days removed (audit event {done.summary_event_id})"
            )
