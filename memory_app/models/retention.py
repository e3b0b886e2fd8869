"""Retention policies: what is deleted for good once it is older than a number of days, in the
contexts whose keys contain a key subset."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from memory_app.models.shared import choices_check


class RetentionKind(models.TextChoices):
    MESSAGES = "messages"
    RUNS = "runs"
    SPANS = "spans"


class RetentionPolicy(models.Model):
    """An operator's rule, e.g. "messages of {"tenant": "acme"} older than 90 days". Global
    configuration, not a context's rows (a reference table on Citus): it names contexts by keys.

    `progress` holds what the current pass removed so far (committed batch by batch), so a pass
    that stops halfway goes on where it was; when a pass finds nothing more to remove its totals
    go into one audited summary and `last_summary`, and `progress` empties."""

    name = models.CharField(max_length=200)
    scope_keys = models.JSONField(
        default=dict, blank=True, help_text="contexts whose keys contain these; {} is every context"
    )
    kind = models.CharField(max_length=20, choices=RetentionKind.choices)
    max_age_days = models.PositiveIntegerField(help_text="older than this many days is removed")
    enabled = models.BooleanField(default=True)
    progress = models.JSONField(default=dict, blank=True, editable=False)
    last_applied_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_summary = models.JSONField(null=True, blank=True, editable=False)
    created_by = models.CharField(max_length=200, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "retention policies"
        ordering = ["pk"]
        constraints = [
            choices_check("kind", RetentionKind, "retention_kind_valid"),
            models.CheckConstraint(
                condition=Q(max_age_days__gte=1), name="retention_max_age_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}: {self.kind} older than {self.max_age_days} days"

    def clean(self) -> None:
        # The Django admin's form checks this too (the dashboard's goes through the service).
        keys = self.scope_keys
        if not isinstance(keys, dict) or not all(
            isinstance(v, str | int | float | bool) for v in keys.values()
        ):
            raise ValidationError({"scope_keys": "an object of plain values"})
