"""Vectors of messages and memory records, and the retries of those a provider failed."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from pgvector.django import VectorField

from memory_app.models.contexts import Context
from memory_app.models.memories import MemoryRecord
from memory_app.models.messages import Message
from memory_app.models.shared import ContextRow, context_of_row


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


class Embedding(ContextRow):
    """A message's vector under one model; several models coexist (one HNSW index per model).
    Rows of one context: on Citus distributed by `context_id`, with the messages. A memory
    record's vectors are in `MemoryEmbedding` (migration 0031): they go with the memories.

    A row with `vector` NULL is pending: the embed worker claims it with FOR UPDATE SKIP LOCKED;
    a provider failure is kept beside it in `EmbeddingRetry` until it succeeds.
    The HNSW index for a model is a partial expression index created when the model is first
    used (`memory_app.embeddings.indexer.ensure_model_index`), because vector dimensions differ
    by model. Every row here is in that index: a large batch of client vectors waits for it in
    `EmbeddingWaiting` (COPY speed, no graph insertion) until the indexer
    (`memory_app.embeddings.indexer.index_pending`) moves it here; searches scan the waiting
    rows exactly meanwhile, so none is ever unsearchable, and each row here is written once.

    In the database the primary key is `(id, context_id)` and the message's foreign key
    `(message_id, context_id)` (migration 0031); Django follows `id` and `message_id`.
    """

    # No single-column indexes on the keys: the unique (message, model, context) index and
    # (context, model) lead with them and serve their lookups and cascades.
    message = models.ForeignKey(
        Message,
        on_delete=models.CASCADE,
        related_name="embeddings",
        db_index=False,
        db_constraint=False,
    )
    # Denormalised so a semantic search can filter one context without a join.
    context = models.ForeignKey(Context, on_delete=models.CASCADE, related_name="+", db_index=False)
    model = models.CharField(max_length=200)
    dimensions = models.IntegerField(null=True, blank=True)
    vector = VectorField(null=True, blank=True)
    # True for every row (those waiting for the graph are in `EmbeddingWaiting`): each model's
    # HNSW index names it in its predicate (migration 0011), so it stays rather than rebuild
    # them all (migration 0037). The database default fills it in on every insert.
    indexed = models.BooleanField(default=True, db_default=True, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["message", "model", "context"], name="embedding_message_model_unique"
            ),
        ]
        indexes = [
            models.Index(
                fields=["model", "id"],
                condition=Q(vector__isnull=True),
                name="embedding_pending_idx",
            ),
            models.Index(fields=["context", "model"], name="embedding_context_model_idx"),
        ]

    def __str__(self) -> str:
        pending = "" if self.vector is not None else " (pending)"
        return f"message {self.message_id} under {self.model}{pending}"


class MemoryEmbedding(models.Model):
    """A memory record's vector under one model: the rows that go with the memories (a
    key-subset memory belongs to no context), apart from the messages' vectors. The same
    columns, pending state, per-model partial HNSW index and waiting side table
    (`MemoryEmbeddingWaiting`) as `Embedding`."""

    memory_record = models.ForeignKey(
        MemoryRecord, on_delete=models.CASCADE, related_name="embeddings", db_index=False
    )
    model = models.CharField(max_length=200)
    dimensions = models.IntegerField(null=True, blank=True)
    vector = VectorField(null=True, blank=True)
    # True for every row, as `Embedding.indexed`.
    indexed = models.BooleanField(default=True, db_default=True, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["memory_record", "model"], name="memoryembedding_memory_model_unique"
            ),
        ]
        indexes = [
            models.Index(
                fields=["model", "id"],
                condition=Q(vector__isnull=True),
                name="memoryembedding_pending_idx",
            ),
        ]

    def __str__(self) -> str:
        pending = "" if self.vector is not None else " (pending)"
        return f"memory {self.memory_record_id} under {self.model}{pending}"


class EmbeddingWaiting(ContextRow):
    """A message's vector from a large batch, waiting for its model's HNSW graph: the indexer
    (`memory_app.embeddings.indexer.index_batch`) moves it into `Embedding` (insert there, delete
    here, one transaction), so the vector table's rows are written once, whole, and this
    table's space is reused batch after batch. Searches scan these rows exactly beside the
    walk. An item's vector under a model is in one of the two tables, never both.

    Rows of one context, like `Embedding`: in the database the primary key is `(id,
    context_id)` and the message's foreign key `(message_id, context_id)`, cascading (migration
    0037); Django follows `id` and `message_id`."""

    message = models.ForeignKey(
        Message, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )
    context = models.ForeignKey(Context, on_delete=models.CASCADE, related_name="+", db_index=False)
    model = models.CharField(max_length=200)
    dimensions = models.IntegerField()
    vector = VectorField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["message", "model", "context"], name="embeddingwaiting_message_model_unique"
            ),
        ]
        indexes = [
            # The searches' exact scan of a context's waiting rows.
            models.Index(fields=["context", "model"], name="embeddingwaiting_context_model"),
        ]

    def __str__(self) -> str:
        return f"message {self.message_id} under {self.model} (waiting for its index)"


class MemoryEmbeddingWaiting(models.Model):
    """A memory record's vector waiting for its model's HNSW graph, as `EmbeddingWaiting` is a
    message's: moved into `MemoryEmbedding` by the indexer."""

    memory_record = models.ForeignKey(
        MemoryRecord, on_delete=models.CASCADE, related_name="+", db_index=False
    )
    model = models.CharField(max_length=200)
    dimensions = models.IntegerField()
    vector = VectorField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["memory_record", "model"], name="memoryembeddingwaiting_memory_model"
            ),
        ]

    def __str__(self) -> str:
        return f"memory {self.memory_record_id} under {self.model} (waiting for its index)"


class EmbeddingRetry(ContextRow):
    """A pending message vector whose provider call failed: how often, why, and when it is due
    again (`MemoryEmbeddingRetry` for memory vectors).

    Only failed items have a row (deleted once the vector is written or the item's text changes):
    the queue's bookkeeping stays off the embedding rows, which a store holds by the million.

    The foreign key `(embedding_id, context_id)` cascades in the database (`ON DELETE CASCADE`,
    migrations 0015 and 0025), not in Django: deleting embeddings (a context, a purge,
    `reembed --drop-old`) stays one DELETE that never loads their vectors, and locks each
    embedding before its retry, the order the worker takes them in.
    """

    embedding = models.OneToOneField(
        Embedding,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        primary_key=True,
        related_name="retry",
    )
    # The embedding's context, copied; the composite foreign key holds it equal.
    context = context_of_row()
    attempts = models.IntegerField()
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "embedding retries"

    def __str__(self) -> str:
        return (
            f"embedding {self.embedding_id}: {self.attempts} attempts, next {self.next_attempt_at}"
        )


class MemoryEmbeddingRetry(models.Model):
    """A failed memory vector's retry, as `EmbeddingRetry` is a message vector's (its foreign
    key cascades in the database, migration 0031)."""

    embedding = models.OneToOneField(
        MemoryEmbedding,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        primary_key=True,
        related_name="retry",
    )
    attempts = models.IntegerField()
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "memory embedding retries"

    def __str__(self) -> str:
        return (
            f"memory embedding {self.embedding_id}: {self.attempts} attempts,"
            f" next {self.next_attempt_at}"
        )
