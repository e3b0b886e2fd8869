"""The domain: contexts, messages, runs, steps, tool calls, memory records, embeddings, audit, keys.

Integrity lives in the database (constraints and indexes below), not in `save()` overrides.
Writes go through `memory_app.services`; reads through `memory_app.queries`.
"""

from __future__ import annotations

import hashlib
import json

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.db.models import F, Q
from pgvector.django import VectorField

# Full-text configuration: `simple` would not stem; `english` ranks "weathers" with "weather".
# Migration 0013's triggers parse with it too: changing it needs a migration that replaces them
# and re-parses MessageSearch.
FTS_CONFIG = "english"


def keys_digest(keys: dict) -> str:
    """Order-insensitive digest of a context-keys dict (the identity of a context)."""
    canonical = json.dumps(keys, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class MessageRole(models.TextChoices):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    FUNCTION = "function"
    AGENT = "agent"
    LLM = "llm"
    TOOL_CALL = "tool-call"
    TOOL_RESPONSE = "tool-response"


class RunStatus(models.TextChoices):
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    MAX_STEPS_ERROR = "max_steps_error"
    CANCELLED = "cancelled"


class StepKind(models.TextChoices):
    TASK = "task"
    PLANNING = "planning"
    ACTION = "action"
    FINAL_ANSWER = "final_answer"


class MemoryKind(models.TextChoices):
    FACT = "fact"
    PREFERENCE = "preference"
    TASK = "task"
    TOOL = "tool"


def _choices_check(
    field: str, choices: type[models.TextChoices], name: str
) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)


class Context(models.Model):
    """One memory space, identified by a JSON dict of keys (get-or-create, order-insensitive)."""

    keys = models.JSONField()
    keys_digest = models.CharField(max_length=64, editable=False)
    title = models.CharField(max_length=500, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    # AgentScope 1.x working memory keeps a compressed summary beside its messages.
    compressed_summary = models.TextField(blank=True, default="")
    # Allocation counter for message seq: incremented under the row lock, so seq is gap-free
    # and strictly increasing however many writers append at once.
    last_seq = models.BigIntegerField(default=0)
    # Messages up to this seq have their full-text vector in MessageSearch; later ones are
    # matched from their text until the indexer catches up (`memory_app.search.fulltext`).
    search_seq = models.BigIntegerField(default=0, db_default=0)
    # Counters kept by the write path so lists never count millions of rows per page.
    message_count = models.IntegerField(default=0)
    token_count = models.BigIntegerField(default=0)
    run_count = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Indexed by context_activity_idx, which leads with it (a one-column index would repeat it).
    last_activity_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["keys_digest"], name="context_keys_digest_unique"),
            models.CheckConstraint(condition=Q(last_seq__gte=0), name="context_last_seq_nonneg"),
        ]
        indexes = [
            GinIndex(fields=["keys"], name="context_keys_gin", opclasses=["jsonb_path_ops"]),
            models.Index(fields=["-last_activity_at", "-id"], name="context_activity_idx"),
            # The full-text indexer's worklist: contexts with messages past their search_seq.
            models.Index(
                fields=["id"],
                condition=Q(search_seq__lt=F("last_seq")),
                name="context_search_behind_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.title or json.dumps(self.keys, sort_keys=True)


class Run(models.Model):
    """One execution of an agent inside a context."""

    # No index of its own: run_context_recent_idx leads with context.
    context = models.ForeignKey(
        Context, on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    client_id = models.CharField(max_length=200, null=True, blank=True)
    task = models.TextField(blank=True, default="")
    system_prompt = models.TextField(blank=True, default="")
    agent_name = models.CharField(max_length=200, blank=True, default="")
    framework = models.CharField(max_length=50, blank=True, default="")
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.RUNNING)
    final_answer = models.JSONField(null=True, blank=True)
    input_tokens = models.BigIntegerField(null=True, blank=True)
    output_tokens = models.BigIntegerField(null=True, blank=True)
    total_tokens = models.BigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration = models.FloatField(null=True, blank=True, help_text="seconds")
    step_count = models.IntegerField(default=0)
    error_count = models.IntegerField(default=0)
    last_position = models.IntegerField(default=0)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["context", "client_id"],
                condition=Q(client_id__isnull=False),
                name="run_client_id_unique",
            ),
            _choices_check("status", RunStatus, "run_status_valid"),
        ]
        indexes = [models.Index(fields=["context", "-created_at"], name="run_context_recent_idx")]

    def __str__(self) -> str:
        return f"run {self.pk}: {self.task[:60]}"


class Step(models.Model):
    """One entry of a run's logbook (smolagents TaskStep / PlanningStep / ActionStep / final
    answer).

    Normalised columns serve the dashboard and the transcripts; `payload` keeps the framework's
    own dict verbatim so an export gives back exactly what was imported.
    """

    # No index of its own: step_run_position_unique leads with run.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    position = models.IntegerField()
    client_id = models.CharField(max_length=200, null=True, blank=True)
    kind = models.CharField(max_length=20, choices=StepKind.choices)
    step_number = models.IntegerField(null=True, blank=True)
    task = models.TextField(null=True, blank=True)
    plan = models.TextField(null=True, blank=True)
    model_input_messages = models.JSONField(null=True, blank=True)
    model_output_message = models.JSONField(null=True, blank=True)
    model_output = models.JSONField(null=True, blank=True)
    code_action = models.TextField(null=True, blank=True)
    observations = models.TextField(null=True, blank=True)
    action_output = models.JSONField(null=True, blank=True)
    error_type = models.CharField(max_length=200, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    start_time = models.FloatField(null=True, blank=True, help_text="unix epoch seconds")
    end_time = models.FloatField(null=True, blank=True, help_text="unix epoch seconds")
    duration = models.FloatField(null=True, blank=True, help_text="seconds")
    input_tokens = models.IntegerField(null=True, blank=True)
    output_tokens = models.IntegerField(null=True, blank=True)
    total_tokens = models.IntegerField(null=True, blank=True)
    # The model that wrote this step and what the call cost, when the agent or trace says so
    # (the dashboard otherwise prices tokens with settings.AGENTMEMORY_MODEL_PRICES).
    model = models.CharField(max_length=200, blank=True, default="", db_default="")
    cost = models.FloatField(null=True, blank=True, help_text="USD, as reported by the agent")
    is_final_answer = models.BooleanField(default=False)
    payload = models.JSONField(null=True, blank=True)
    pruned_at = models.DateTimeField(null=True, blank=True)
    pruned_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="step_run_position_unique"),
            models.UniqueConstraint(
                fields=["run", "client_id"],
                condition=Q(client_id__isnull=False),
                name="step_client_id_unique",
            ),
            models.CheckConstraint(condition=Q(position__gte=1), name="step_position_positive"),
            _choices_check("kind", StepKind, "step_kind_valid"),
        ]
        indexes = [
            models.Index(
                fields=["run", "position"],
                condition=Q(error_type__isnull=False),
                name="step_run_errors_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"step {self.position} ({self.kind}) of run {self.run_id}"

    @property
    def is_pruned(self) -> bool:
        return self.pruned_at is not None


class ToolCall(models.Model):
    """One tool invocation inside a step."""

    # No index of its own: toolcall_step_position_unique leads with step.
    step = models.ForeignKey(
        Step, on_delete=models.CASCADE, related_name="tool_calls", db_index=False
    )
    position = models.IntegerField()
    call_id = models.CharField(max_length=200, blank=True, default="")
    name = models.CharField(max_length=200)
    arguments = models.JSONField(null=True, blank=True)
    output = models.TextField(null=True, blank=True)
    success = models.BooleanField(null=True, blank=True)
    duration = models.FloatField(null=True, blank=True, help_text="seconds")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["step", "position"], name="toolcall_step_position_unique"
            ),
        ]
        indexes = [models.Index(fields=["name"], name="toolcall_name_idx")]

    def __str__(self) -> str:
        return f"{self.name}({self.call_id})"


class Message(models.Model):
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
    content = models.JSONField(null=True, blank=True, help_text="structured content blocks")
    tags = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # jsonb sorts object keys; a framework's own key order of `content` and `metadata` (where it
    # differs) is kept here so an export gives the agent back the exact same prompt text.
    key_order = models.JSONField(
        null=True, blank=True, help_text="memory_app.interop.key_order skeleton of content/metadata"
    )
    run = models.ForeignKey(
        Run,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="messages",
        db_index=False,
    )
    step = models.ForeignKey(
        Step,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="messages",
        db_index=False,
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
            _choices_check("role", MessageRole, "message_role_valid"),
        ]
        indexes = [
            GinIndex(fields=["tags"], name="message_tags_gin"),
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


class MessageSearch(models.Model):
    """The full-text vector (`to_tsvector(FTS_CONFIG, text)`) of a live message, kept beside the
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
    """

    pk = models.CompositePrimaryKey("context_id", "seq")
    context_id = models.BigIntegerField()
    seq = models.BigIntegerField()
    search_vector = SearchVectorField()

    class Meta:
        indexes = [GinIndex(fields=["search_vector"], name="message_search_gin")]

    def __str__(self) -> str:
        return f"context {self.context_id} #{self.seq}"


class MemoryRecord(models.Model):
    """A long-term memory scoped to one context or to a key subset shared by many contexts."""

    context = models.ForeignKey(
        Context, on_delete=models.CASCADE, null=True, blank=True, related_name="memory_records"
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
        Message, on_delete=models.SET_NULL, null=True, blank=True, related_name="memory_records"
    )
    source_step = models.ForeignKey(
        Step, on_delete=models.SET_NULL, null=True, blank=True, related_name="memory_records"
    )
    recorded_by = models.CharField(max_length=200, blank=True, default="")
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
            _choices_check("kind", MemoryKind, "memory_kind_valid"),
        ]
        indexes = [
            GinIndex(fields=["search_vector"], name="memory_fts_gin"),
            GinIndex(fields=["scope_keys"], name="memory_scope_gin", opclasses=["jsonb_path_ops"]),
            GinIndex(fields=["keywords"], name="memory_keywords_gin"),
        ]

    def __str__(self) -> str:
        return self.content[:80]


class Embedding(models.Model):
    """A vector for one item under one model; several models coexist (one HNSW index per model).

    A row with `vector` NULL is pending: the embed worker claims it with FOR UPDATE SKIP LOCKED;
    a provider failure is kept beside it in `EmbeddingRetry` until it succeeds.
    The HNSW index for a model is a partial expression index created when the model is first
    used (`memory_app.embeddings.ensure_model_index`), because vector dimensions differ by model.
    Only rows with `indexed` true are in that index: a large batch of client vectors is written
    with `indexed` false (COPY speed, no graph insertion) and the indexer
    (`memory_app.embeddings.index_pending`) adds them later; searches scan those rows exactly
    meanwhile, so none is ever unsearchable.

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
    attempts = models.IntegerField()
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "embedding retries"

    def __str__(self) -> str:
        return (
            f"embedding {self.embedding_id}: {self.attempts} attempts, next {self.next_attempt_at}"
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
    context = models.ForeignKey(
        Context, on_delete=models.SET_NULL, null=True, blank=True, related_name="audit_events"
    )
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    note = models.TextField(blank=True, default="")
    undone_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["target_type", "-at"], name="audit_target_idx"),
            GinIndex(fields=["target_ids"], name="audit_target_ids_gin"),
            models.Index(fields=["actor", "-at"], name="audit_actor_idx"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.target_type} "
            f"{self.target_ids[:5]}"
        )


class TraceSpan(models.Model):
    """An OpenTelemetry span as received at /v1/traces, kept until (and after) it became steps.

    Spans of one trace arrive in several requests, children before their parents (an exporter
    sends a span when it ends). Keeping them lets a later request build a step from spans an
    earlier one brought; the steps themselves are written through `memory_app.services.runs`.
    """

    context = models.ForeignKey(Context, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True, default="")
    name = models.CharField(max_length=500, blank=True, default="")
    role = models.CharField(max_length=10, help_text="agent, step, llm, tool or other")
    start_ns = models.BigIntegerField()
    end_ns = models.BigIntegerField()
    data = models.JSONField(help_text="status, attributes, events, resource and scope as received")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["context", "trace_id", "span_id"], name="tracespan_ids_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"span {self.span_id} ({self.role}) of trace {self.trace_id}"
