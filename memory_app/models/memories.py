"""Long-term memory records."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.db.models import Q

from memory_app.models.access import ApiKey, AuditEvent
from memory_app.models.contexts import Context
from memory_app.models.messages import Message
from memory_app.models.runs import Run, Step
from memory_app.models.shared import (
    FTS_CONFIG,
    MemoryKind,
    MemoryOrigin,
    MemoryStatus,
    OrderedJSONField,
    choices_check,
    gin_index,
)


class MemoryRecord(models.Model):
    """A long-term memory scoped to one context or to a key subset shared by many contexts."""

    # No database foreign keys into contexts, messages or steps (migration 0032): memory records
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
    metadata = OrderedJSONField(default=dict, blank=True)
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
    # No constraint in the database: a run's key there is (id, context_id). Django's delete
    # clears it (SET_NULL), as the run of a purged step goes.
    source_run = models.ForeignKey(
        Run,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="memory_records",
        db_constraint=False,
    )
    # Provenance the server sets from the request, never the client: who recorded the memory
    # (an API key, a dashboard user, an import), beside what it was derived from (above).
    origin = models.CharField(
        max_length=20, choices=MemoryOrigin.choices, default=MemoryOrigin.UNKNOWN
    )
    source_api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    source_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    recorded_by = models.CharField(max_length=200, blank=True, default="")
    # Only live records are recalled; a proposal waits for an operator's approval.
    status = models.CharField(
        max_length=20, choices=MemoryStatus.choices, default=MemoryStatus.LIVE
    )
    archived_at = models.DateTimeField(null=True, blank=True)
    # A namespace item (LangGraph's store): a record addressed by a namespace path and a key in
    # its key-subset scope, whose content is the JSON text of its value.
    namespace = ArrayField(models.TextField(), null=True, blank=True)
    item_key = models.TextField(null=True, blank=True)
    # Minutes an item lives after its last write (or read, when the reader refreshes it).
    item_ttl = models.FloatField(null=True, blank=True)
    item_expires_at = models.DateTimeField(null=True, blank=True)
    # Past `expires_at` a record is no longer recalled and the retention removes it; a pinned
    # record never expires, and one under legal hold is neither expired nor purged nor erased.
    expires_at = models.DateTimeField(null=True, blank=True)
    pinned = models.BooleanField(default=False, db_default=False)
    legal_hold = models.TextField(
        blank=True, default="", db_default="", help_text="why the record is held (empty: none)"
    )
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
            # One item per namespace and key in a scope: the namespace is the scope's data, so
            # it stays in the key of the constraint (and of every query) beside the scope.
            models.UniqueConstraint(
                fields=["scope_digest", "namespace", "item_key"],
                condition=Q(namespace__isnull=False),
                name="memory_store_item_unique",
            ),
            models.CheckConstraint(
                condition=Q(namespace__isnull=True, item_key__isnull=True)
                | Q(namespace__isnull=False, item_key__isnull=False, context__isnull=True),
                name="memory_store_item_shape",
            ),
            choices_check("kind", MemoryKind, "memory_kind_valid"),
            choices_check("status", MemoryStatus, "memory_status_valid"),
            choices_check("origin", MemoryOrigin, "memory_origin_valid"),
        ]
        # A dashboard permission: no API key scope grants it.
        permissions = [("approve_memoryrecord", "Can approve proposed memories")]
        indexes = [
            gin_index(fields=["search_vector"], name="memory_fts_gin"),
            gin_index(fields=["scope_keys"], name="memory_scope_gin", opclasses=["jsonb_path_ops"]),
            gin_index(fields=["keywords"], name="memory_keywords_gin"),
            # The review inbox: the (few) proposals, oldest first.
            models.Index(
                fields=["created_at", "id"],
                condition=Q(status="proposed"),
                name="memory_proposed_idx",
            ),
            # The expiry's worklist: records with a date, soonest first.
            models.Index(
                fields=["expires_at", "id"],
                condition=Q(expires_at__isnull=False),
                name="memory_expires_idx",
            ),
            # The store's sweep: namespace items past their time to live, soonest first.
            models.Index(
                fields=["item_expires_at", "id"],
                condition=Q(item_expires_at__isnull=False),
                name="memory_item_expires_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.content[:80]


class MemoryVersion(models.Model):
    """One version of a memory: what it said and how it stood after a change, who made the
    change and when. Version 1 is the record as created; every later change adds the next.

    Keyed by the memory's id and the version number (a key-subset memory has no context to
    shard by: its id is its distribution column), and read by memory id only. A purge deletes
    the versions with the record (their content goes with it)."""

    pk = models.CompositePrimaryKey("memory_id", "version")
    # The primary key leads with memory_id: no index of its own.
    memory = models.ForeignKey(
        MemoryRecord, on_delete=models.CASCADE, related_name="versions", db_index=False
    )
    version = models.PositiveIntegerField()
    content = models.TextField()
    kind = models.CharField(max_length=20)
    thinking = models.TextField(blank=True, default="")
    keywords = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    # As the memory's own: a restored version gives its metadata back in the order written.
    metadata = OrderedJSONField(default=dict, blank=True)
    status = models.CharField(max_length=20)
    archived_at = models.DateTimeField(null=True, blank=True)
    # What made this version (record, edit, archive, restore, approve, merge, import,
    # restore_version, undo...) and who: the actor's label as the audit names it.
    action = models.CharField(max_length=50)
    actor = models.CharField(max_length=200)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    audit_event = models.ForeignKey(
        AuditEvent, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    note = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        ordering = ["memory_id", "version"]

    def __str__(self) -> str:
        return f"memory {self.memory_id} v{self.version}"


class StoreNamespace(models.Model):
    """A namespace of LangGraph's store that an agent has touched in a key subset: put into,
    deleted from, or asked for an item. It stays listed after its items are deleted and orders
    the namespaces of a search, as `InMemoryStore`'s namespaces do (they come into being on first
    use and stay). Key-subset data like the items themselves: the scope's digest leads its key."""

    scope_digest = models.CharField(max_length=64)
    # The subset itself, so that erasing a subset finds its namespaces.
    scope_keys = models.JSONField(default=dict)
    namespace = ArrayField(models.TextField())
    # First use; the id orders the namespaces.
    touched_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["scope_digest", "namespace"], name="store_namespace_unique"
            )
        ]
        indexes = [
            gin_index(
                fields=["scope_keys"], name="store_namespace_keys_gin", opclasses=["jsonb_path_ops"]
            )
        ]

    def __str__(self) -> str:
        return "/".join(self.namespace)
