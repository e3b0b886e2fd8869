"""Long-term memory records."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.db.models import Q

from memory_app.models.contexts import Context
from memory_app.models.messages import Message
from memory_app.models.runs import Step
from memory_app.models.shared import FTS_CONFIG, MemoryKind, MemoryStatus, choices_check


class MemoryRecord(models.Model):
    """A long-term memory scoped to one context or to a key subset shared by many contexts."""

    # No database foreign keys into contexts, messages or steps (migration 0026): memory records
    # stay off the shards (a reference or local table on Citus), which may hold none into a
    # distributed table. Django still cascades and nulls them, as every delete here goes
    # through it.
    context = models.ForeignKey(
        Context,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="memory_records",
        db_constraint=False,
    )
    scope_keys = models.JSONField(default=dict, blank=True)
    scope_digest = models.CharField(max_length=64, editable=False)
    kind = models.CharField(max_length=20, choices=MemoryKind.choices, default=MemoryKind.FACT)
    content = models.TextField()
    content_hash = models.CharField(max_length=64, editable=False)
    thinking = models.TextField(blank=True, default="")
    keywords = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    source_message = models.ForeignKey(
        Message,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="memory_records",
        db_constraint=False,
    )
    source_step = models.ForeignKey(
        Step,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="memory_records",
        db_constraint=False,
    )
    recorded_by = models.CharField(max_length=200, blank=True, default="")
    # Only live records are recalled; a proposal waits for an operator's approval.
    status = models.CharField(
        max_length=20, choices=MemoryStatus.choices, default=MemoryStatus.LIVE
    )
    archived_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    search_vector = models.GeneratedField(
        expression=SearchVector("content", config=FTS_CONFIG),
        output_field=SearchVectorField(),
        db_persist=True,
    )

    class Meta:
        constraints = [
            # Recording the same content in the same scope returns the existing record.
            models.UniqueConstraint(
                fields=["scope_digest", "content_hash"], name="memory_scope_content_unique"
            ),
            choices_check("kind", MemoryKind, "memory_kind_valid"),
            choices_check("status", MemoryStatus, "memory_status_valid"),
        ]
        # A dashboard permission: no API key scope grants it.
        permissions = [("approve_memoryrecord", "Can approve proposed memories")]
        indexes = [
            GinIndex(fields=["search_vector"], name="memory_fts_gin"),
            GinIndex(fields=["scope_keys"], name="memory_scope_gin", opclasses=["jsonb_path_ops"]),
            GinIndex(fields=["keywords"], name="memory_keywords_gin"),
            # The review inbox: the (few) proposals, oldest first.
            models.Index(
                fields=["created_at", "id"],
                condition=Q(status="proposed"),
                name="memory_proposed_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.content[:80]
