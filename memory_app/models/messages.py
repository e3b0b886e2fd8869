"""A context's chat history: the messages and their full-text vectors, kept beside them."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.db.models import Q

from memory_app.models.contexts import Context
from memory_app.models.runs import Run, Step
from memory_app.models.shared import (
    ContextRow,
    MessageRole,
    OrderedJSONField,
    choices_check,
    gin_index,
)


class Message(ContextRow):
    """One entry of a context's chat history, ordered by a per-context `seq`."""

    # Foreign keys without their own index: message_context_seq_unique leads with context; run
    # and step are indexed where set only (message_run_idx, message_step_idx), as most messages
    # belong to no run.
    context = models.ForeignKey(
        Context, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    seq = models.BigIntegerField()
    client_id = models.CharField(max_length=200, null=True, blank=True)
    role = models.CharField(max_length=20, choices=MessageRole.choices)
    name = models.CharField(max_length=200, blank=True, default="")
    text = models.TextField(blank=True, default="")
    content = OrderedJSONField(null=True, blank=True, help_text="structured content blocks")
    tags = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    metadata = OrderedJSONField(default=dict, blank=True)
    # Messages stored while `content` and `metadata` were jsonb (which sorts object keys) keep
    # their framework's key order here; their columns keep it themselves since migration 0028.
    key_order = models.JSONField(
        null=True, blank=True, help_text="memory_app.interop.key_order skeleton of content/metadata"
    )
    # In the database these foreign keys are (run_id, context_id) and (step_id, context_id)
    # (migration 0020): a message points at a run or step of its own context only.
    run = models.ForeignKey(
        Run,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="messages",
        db_index=False,
        db_constraint=False,
    )
    step = models.ForeignKey(
        Step,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="messages",
        db_index=False,
        db_constraint=False,
    )
    token_count = models.IntegerField(default=0)
    tokenizer = models.CharField(max_length=50, blank=True, default="")
    # The client's own timestamp string, kept verbatim (AgentScope's is local time, no zone).
    source_timestamp = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    pruned_at = models.DateTimeField(null=True, blank=True)
    pruned_by = models.CharField(max_length=200, blank=True, default="")
    # The full-text vector lives in MessageSearch, computed off the write path.

    class Meta:
        ordering = ["context", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["context", "seq"], name="message_context_seq_unique"),
            models.UniqueConstraint(
                fields=["context", "client_id"],
                condition=Q(client_id__isnull=False),
                name="message_client_id_unique",
            ),
            models.CheckConstraint(condition=Q(seq__gte=1), name="message_seq_positive"),
            models.CheckConstraint(condition=Q(token_count__gte=0), name="message_tokens_nonneg"),
            choices_check("role", MessageRole, "message_role_valid"),
        ]
        indexes = [
            gin_index(fields=["tags"], name="message_tags_gin"),
            # The agent's hot read: a context's latest live messages. Not message_context_seq_unique
            # walked backwards: a history pruned as a whole (AgentScope's clear()) would be read
            # row by row to find the live ones.
            models.Index(
                fields=["context", "-seq"],
                condition=Q(pruned_at__isnull=True),
                name="message_live_recent_idx",
            ),
            # Composite's system message, however far back it lies (the last user message is
            # found walking back message_live_recent_idx over the current turn, which composite
            # reads anyway).
            models.Index(
                fields=["context", "seq"],
                condition=Q(pruned_at__isnull=True, role="system"),
                name="message_live_system_idx",
            ),
            models.Index(fields=["run"], condition=Q(run__isnull=False), name="message_run_idx"),
            models.Index(fields=["step"], condition=Q(step__isnull=False), name="message_step_idx"),
            # token_window's skip policy reads on only rows that can still fit the budget.
            models.Index(
                fields=["context", "token_count", "seq"],
                condition=Q(pruned_at__isnull=True),
                name="message_live_tokens_idx",
            ),
            # Finding rows counted under another tokenizer (to recount them) without a scan.
            models.Index(fields=["context", "tokenizer"], name="message_tokenizer_idx"),
            # Pruned rows only: the dashboard's live/pruned counts and purge's "pruned before".
            models.Index(
                fields=["context", "pruned_at"],
                condition=Q(pruned_at__isnull=False),
                name="message_pruned_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.role}: {self.text[:60]}"

    @property
    def is_pruned(self) -> bool:
        return self.pruned_at is not None


class MessageSearch(ContextRow):
    """The full-text vector of a live message (`memory_app_search_vector(FTS_CONFIG, text)`: the
    vector of its first `memory_app_search_chars()` characters, migration 0018), kept beside the
    message rather than in it, so that storing a message does not wait for its text to be parsed.

    Keyed like the message's own natural key, (context, seq): keyword search walks a context's
    vectors newest first on this primary key, or takes the GIN index for rare words, without
    touching the messages, and joins them only for the few candidates it ranks.

    Small appends write their vectors in their own transaction; a large batch leaves them to the
    indexer (`memory_app.search.fulltext`), and keyword search matches those messages from their
    text meanwhile: every message past its context's `search_seq` is read exactly, none is ever
    unsearchable. Database triggers (migration 0013) keep it in step with the messages, whoever
    writes them: an edited text is parsed again, a pruned or deleted message takes its vector
    along, a restored one gets it back.

    A vector that cannot be written leaves `search_vector` null and the database's `error`: the
    indexer goes on past it, and keyword search does not find that message until its text is
    edited (parsed again, the error cleared).
    """

    pk = models.CompositePrimaryKey("context_id", "seq")
    context_id = models.BigIntegerField()
    seq = models.BigIntegerField()
    search_vector = SearchVectorField(null=True)
    error = models.TextField(null=True)

    class Meta:
        indexes = [gin_index(fields=["search_vector"], name="message_search_gin")]

    def __str__(self) -> str:
        return f"context {self.context_id} #{self.seq}"
