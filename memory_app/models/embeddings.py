"""Vectors of messages and memory records, and the retries of those a provider failed."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from pgvector.django import VectorField

from memory_app.models.contexts import Context
from memory_app.models.memories import MemoryRecord
from memory_app.models.messages import Message
from memory_app.models.shared import context_of_row


class EmbeddingModel(models.Model):
    """A model vectors may be stored and searched under, with its dimensions: the store's one
    registry of names. Global, not per context: a name is an HNSW index and a claim on what
    vectors under it mean, so only an operator registers one (an unconfined admin key, the
    `embedding_model` command, the dashboard); the configured provider's model registers itself.
    A vector under any other name is refused, so tenants can neither squat the operator's next
    model nor add an index per request."""

    name = models.CharField(max_length=200, unique=True)
    dimensions = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    # The actor's label (`user:…`, `key:…`, `system:…`), as audit events name it.
    created_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["name"]
        constraints = [
            # What `vector` and the client-vector check take: 1 to 16,000 numbers.
            models.CheckConstraint(
                condition=Q(dimensions__gte=1) & Q(dimensions__lte=16000),
                name="embedding_model_dimensions_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.dimensions}-d)"


class Embedding(models.Model):
    """A vector for one item under one model; several models coexist (one HNSW index per model).

    A row with `vector` NULL is pending: the embed worker claims it with FOR UPDATE SKIP LOCKED;
    a provider failure is kept beside it in `EmbeddingRetry` until it succeeds.
    The HNSW index for a model is a partial expression index created when the model is first
    used (`memory_app.embeddings.indexer.ensure_model_index`), because vector dimensions differ
    by model. Only rows with `indexed` true are in that index: a large batch of client vectors is
    written with `indexed` false (COPY speed, no graph insertion) and the indexer
    (`memory_app.embeddings.indexer.index_pending`) adds them later; searches scan those rows
    exactly meanwhile, so none is ever unsearchable.

    The row holds eight columns and nothing else (migration 0015): a 384-d row is then 1,617
    bytes with a 24-byte header, so five fit a page where four did (a ninth column, or any
    column wider, puts it back to four).
    """

    # No single-column indexes on the three keys: the unique (message, model) and (memory_record,
    # model) indexes and (context, model) lead with them and serve their lookups and cascades.
    message = models.ForeignKey(
        Message,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="embeddings",
        db_index=False,
    )
    memory_record = models.ForeignKey(
        MemoryRecord,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="embeddings",
        db_index=False,
    )
    # Denormalised so a semantic search can filter one context without a join.
    context = models.ForeignKey(
        Context, on_delete=models.CASCADE, null=True, blank=True, related_name="+", db_index=False
    )
    model = models.CharField(max_length=200)
    dimensions = models.IntegerField(null=True, blank=True)
    vector = VectorField(null=True, blank=True)
    # False while the row waits for the indexer (deferred batch insertion into the HNSW graph).
    # The database default covers the raw INSERTs (reembed_enqueue) as well.
    indexed = models.BooleanField(default=True, db_default=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(message__isnull=False) & Q(memory_record__isnull=True))
                | (Q(message__isnull=True) & Q(memory_record__isnull=False)),
                name="embedding_one_item",
            ),
            models.UniqueConstraint(
                fields=["message", "model"],
                condition=Q(message__isnull=False),
                name="embedding_message_model_unique",
            ),
            models.UniqueConstraint(
                fields=["memory_record", "model"],
                condition=Q(memory_record__isnull=False),
                name="embedding_memory_model_unique",
            ),
        ]
        indexes = [
            models.Index(
                fields=["model", "id"],
                condition=Q(vector__isnull=True),
                name="embedding_pending_idx",
            ),
            models.Index(fields=["context", "model"], name="embedding_context_model_idx"),
            # The indexer's backlog and the searches' exact scan of it: empty in the steady state.
            models.Index(
                fields=["model", "context"], condition=Q(indexed=False), name="embedding_unindexed"
            ),
        ]

    def __str__(self) -> str:
        item = (
            f"message {self.message_id}" if self.message_id else f"memory {self.memory_record_id}"
        )
        return f"{item} under {self.model}" + ("" if self.vector is not None else " (pending)")


class EmbeddingRetry(models.Model):
    """A pending vector whose provider call failed: how often, why, and when it is due again.

    Only failed items have a row (deleted once the vector is written or the item's text changes):
    the queue's bookkeeping stays off the embedding rows, which a store holds by the million.

    The foreign key cascades in the database (`ON DELETE CASCADE`, migration 0015), not in
    Django: deleting embeddings (a context, a purge, `reembed --drop-old`) stays one DELETE
    that never loads their vectors, and locks each embedding before its retry, the order the
    worker takes them in.
    """

    embedding = models.OneToOneField(
        Embedding,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        primary_key=True,
        related_name="retry",
    )
    # The embedding's context, NULL as its is for a key-subset memory's vector. Copied, not
    # checked: the embedding's own foreign key takes the retry along.
    context = context_of_row(null=True)
    attempts = models.IntegerField()
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "embedding retries"

    def __str__(self) -> str:
        return (
            f"embedding {self.embedding_id}: {self.attempts} attempts, next {self.next_attempt_at}"
        )
