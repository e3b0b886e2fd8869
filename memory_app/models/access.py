"""Who may act and what they did: API keys and the audit trail."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from memory_app.models.contexts import Context
from memory_app.models.shared import (
    MemoryReview,
    OrderedJSONField,
    choices_check,
    gin_index,
)


class ApiKey(models.Model):
    """An agent's credential. The secret is shown once; only its SHA-256 is stored.

    Secrets are 256-bit random tokens, so a fast hash is safe (no dictionary to attack) and keeps
    per-request verification cheap.
    """

    SCOPES = ("read", "write", "admin")

    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = ArrayField(models.CharField(max_length=10), default=list)
    # A key confined to {"tenant": "acme"} sees only contexts whose keys contain tenant=acme.
    context_keys = models.JSONField(default=dict, blank=True)
    # Memories this key records are live at once, or proposed for an operator's review.
    memory_review = models.CharField(
        max_length=10, choices=MemoryReview.choices, default=MemoryReview.LIVE
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(scopes__contained_by=["read", "write", "admin"]),
                name="apikey_scopes_valid",
            ),
            choices_check("memory_review", MemoryReview, "apikey_memory_review_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def actor(self) -> str:
        return f"key:{self.prefix}"


class AuditEvent(models.Model):
    """Who changed what and when, with before/after: makes every curation reversible."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=200, help_text="user:<name> or key:<prefix>")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, blank=True)
    action = models.CharField(max_length=50, db_index=True)
    target_type = models.CharField(max_length=50)
    target_ids = ArrayField(models.BigIntegerField(), default=list, blank=True)
    # No database foreign key (migration 0032): the operator's trail is a local table on Citus,
    # which may hold none into the distributed contexts; Django nulls it when a context goes.
    context = models.ForeignKey(
        Context,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="audit_events",
        db_constraint=False,
    )
    # As written, key order included: undoing an edit writes `before` back.
    before = OrderedJSONField(null=True, blank=True)
    after = OrderedJSONField(null=True, blank=True)
    note = models.TextField(blank=True, default="")
    undone_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["target_type", "-at"], name="audit_target_idx"),
            gin_index(fields=["target_ids"], name="audit_target_ids_gin"),
            models.Index(fields=["actor", "-at"], name="audit_actor_idx"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.target_type} "
            f"{self.target_ids[:5]}"
        )
