"""An agent's runs and their logbook: steps, tool calls, and the OpenTelemetry spans traces
bring."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce

from memory_app.models.contexts import Context
from memory_app.models.shared import (
    ContextRow,
    OrderedJSONField,
    RunStatus,
    StepKind,
    choices_check,
    context_of_row,
    gin_index,
)

# What the runs table sorts by, as indexed below.
RUN_STARTED = Coalesce("started_at", "created_at")
RUN_DURATION = Coalesce("duration", Value(-1.0))
RUN_COST = Coalesce("cost", Value(-1.0))


class Run(ContextRow):
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
    final_answer = OrderedJSONField(null=True, blank=True)
    input_tokens = models.BigIntegerField(null=True, blank=True)
    output_tokens = models.BigIntegerField(null=True, blank=True)
    total_tokens = models.BigIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration = models.FloatField(null=True, blank=True, help_text="seconds")
    step_count = models.IntegerField(default=0)
    error_count = models.IntegerField(default=0)
    last_position = models.IntegerField(default=0)
    # Kept by the write path (steps appended, purged, restored) so the runs table lists, filters
    # and sorts runs without reading their steps: tool calls, the models the steps and the run's
    # `metadata.model` name (sorted), and the cost of the steps, as reported or priced when written.
    tool_call_count = models.IntegerField(default=0, db_default=0)
    model_names = ArrayField(
        models.CharField(max_length=200), default=list, blank=True, db_default=Value([])
    )
    cost = models.FloatField(null=True, blank=True, help_text="USD")
    metadata = OrderedJSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["context", "client_id"],
                condition=Q(client_id__isnull=False),
                name="run_client_id_unique",
            ),
            choices_check("status", RunStatus, "run_status_valid"),
        ]
        indexes = [
            models.Index(fields=["context", "-created_at"], name="run_context_recent_idx"),
            # The runs table's orders (memory_app.queries.runs_table), each a keyset on
            # (value, id); an unknown start, duration or cost sorts as the server's creation
            # time or -1.
            models.Index(RUN_STARTED, F("id"), name="run_started_idx"),
            models.Index(F("status"), RUN_STARTED, F("id"), name="run_status_started_idx"),
            models.Index(RUN_DURATION, F("id"), name="run_duration_idx"),
            models.Index(RUN_COST, F("id"), name="run_cost_idx"),
            gin_index(fields=["model_names"], name="run_model_names_gin"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk}: {self.task[:60]}"


class Step(ContextRow):
    """One entry of a run's logbook (smolagents TaskStep / PlanningStep / ActionStep / final
    answer).

    Normalised columns serve the dashboard and the transcripts; `payload` keeps the framework's
    own dict verbatim so an export gives back exactly what was imported.
    """

    # No index of its own: step_run_position_unique leads with run. The database's foreign key
    # is (run_id, context_id) (migration 0020): Django, which cannot follow a composite key,
    # neither writes nor checks one of its own.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="steps", db_index=False, db_constraint=False
    )
    # The run's context, part of every key of the row (see docs/scale-out.md).
    context = context_of_row()
    position = models.IntegerField()
    client_id = models.CharField(max_length=200, null=True, blank=True)
    kind = models.CharField(max_length=20, choices=StepKind.choices)
    step_number = models.IntegerField(null=True, blank=True)
    task = models.TextField(null=True, blank=True)
    plan = models.TextField(null=True, blank=True)
    model_input_messages = OrderedJSONField(null=True, blank=True)
    model_output_message = OrderedJSONField(null=True, blank=True)
    model_output = OrderedJSONField(null=True, blank=True)
    code_action = models.TextField(null=True, blank=True)
    observations = models.TextField(null=True, blank=True)
    action_output = OrderedJSONField(null=True, blank=True)
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
    payload = OrderedJSONField(null=True, blank=True)
    pruned_at = models.DateTimeField(null=True, blank=True)
    pruned_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "position", "context"], name="step_run_position_unique"
            ),
            models.UniqueConstraint(
                fields=["run", "client_id", "context"],
                condition=Q(client_id__isnull=False),
                name="step_client_id_unique",
            ),
            models.CheckConstraint(condition=Q(position__gte=1), name="step_position_positive"),
            choices_check("kind", StepKind, "step_kind_valid"),
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


class ToolCall(ContextRow):
    """One tool invocation inside a step."""

    # No index of its own: toolcall_step_position_unique leads with step. In the database the
    # foreign key is (step_id, context_id), as Step.run's.
    step = models.ForeignKey(
        Step,
        on_delete=models.CASCADE,
        related_name="tool_calls",
        db_index=False,
        db_constraint=False,
    )
    context = context_of_row()
    position = models.IntegerField()
    call_id = models.CharField(max_length=200, blank=True, default="")
    name = models.CharField(max_length=200)
    arguments = OrderedJSONField(null=True, blank=True)
    output = models.TextField(null=True, blank=True)
    success = models.BooleanField(null=True, blank=True)
    duration = models.FloatField(null=True, blank=True, help_text="seconds")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["step", "position", "context"], name="toolcall_step_position_unique"
            ),
        ]
        indexes = [models.Index(fields=["name"], name="toolcall_name_idx")]

    def __str__(self) -> str:
        return f"{self.name}({self.call_id})"


class RunSearch(models.Model):
    """The full-text vector of what a run wrote, for the search across contexts
    (`memory_app.queries.search_all`): one row per step output (`output`: plan, code, model
    output, observations, action output), per step error (`error`: type and message) and per
    tool call (`tool`: name, arguments, output).

    Written by database triggers on steps and tool calls (migration 0035), whoever writes them,
    with the vector of the first `memory_app_search_chars()` characters as messages' vectors
    are; keyed by the row's context (the distribution column) and the step's or tool call's id.
    A pruned step keeps its rows: the search joins the step and leaves it out while it is
    pruned, so a restore needs no rewrite.
    """

    pk = models.CompositePrimaryKey("context_id", "kind", "ref_id")
    context_id = models.BigIntegerField()
    kind = models.CharField(max_length=10)
    # The step's id (`output`, `error`) or the tool call's (`tool`).
    ref_id = models.BigIntegerField()
    run_id = models.BigIntegerField()
    step_id = models.BigIntegerField()
    search_vector = SearchVectorField()

    class Meta:
        # One GIN index per kind: a search reads each kind's matches (`search_all`), and one
        # index of every kind made each of the three reads build a bitmap of all three's.
        indexes = [
            gin_index(
                fields=["search_vector"], name=f"run_search_{kind}_gin", condition=Q(kind=kind)
            )
            for kind in ("output", "error", "tool")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.ref_id} of run {self.run_id}"


class TraceSpan(ContextRow):
    """An OpenTelemetry span as received at /v1/traces, kept until (and after) it became steps.

    Spans of one trace arrive in several requests, children before their parents (an exporter
    sends a span when it ends). Keeping them lets a later request build a step from spans an
    earlier one brought; the steps themselves are written through `memory_app.services.runs`.
    A purged step's spans keep only their ids, name, role and times (`data` is `{"purged": true}`)
    so that the trace's later spans do not make it again.

    A log event of a span (`POST /v1/logs`) is kept here too, as role `log`: its parent is the
    span it belongs to, its span id the first 16 hex digits of a digest of its content (a log
    record has no id), its times its timestamp, `data` its body and attributes. So it shares the
    spans' context, run, idempotency, purge and retention.
    """

    context = models.ForeignKey(Context, on_delete=models.CASCADE, related_name="+")
    # Deleted with their run: kept, they would make its steps again when the trace's next span
    # arrives. The database's foreign key is (run_id, context_id).
    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
        db_constraint=False,
    )
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True, default="")
    name = models.CharField(max_length=500, blank=True, default="")
    role = models.CharField(max_length=10, help_text="agent, step, llm, tool or other")
    start_ns = models.BigIntegerField()
    end_ns = models.BigIntegerField()
    # As received, key order included: the mapping reads structured attributes (OTLP key-value
    # lists: a model's tool-call arguments, messages) from here into the run's steps.
    data = OrderedJSONField(help_text="status, attributes, events, resource and scope as received")
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["context", "trace_id", "span_id"], name="tracespan_ids_unique"
            ),
        ]
        indexes = [
            # The retention's batches (AGENTMEMORY_SPAN_RETENTION_DAYS) take the oldest first.
            models.Index(fields=["received_at"], name="tracespan_received_idx"),
            # The receiver finds the context a trace went to, whatever the context.
            models.Index(fields=["trace_id"], name="tracespan_trace_idx"),
        ]

    def __str__(self) -> str:
        return f"span {self.span_id} ({self.role}) of trace {self.trace_id}"


class SpanQueue(ContextRow):
    """One OTLP export's spans (or log events) of one context, acknowledged and waiting to be
    mapped into runs and steps (`memory_app.services.span_queue`).

    The receiver reads, authenticates and places an export in its contexts, then answers:
    mapping costs several statements a trace, which the worker spends in bulk, many exports of
    one context at a time. Rows are deleted in the transaction that maps them. A trace export is
    kept as received: `body` is the protobuf of the context's spans, zlib-compressed (the mapper
    decodes it); a log export's records are `payload`, JSON text of the decoded records (in the
    order received, keys as sent). `trace_ids` is what a reader needs to tell that a run's spans
    are still queued.
    """

    context = models.ForeignKey(Context, on_delete=models.CASCADE, related_name="+")
    trace_ids = ArrayField(models.CharField(max_length=32))
    span_count = models.IntegerField()
    payload = models.TextField(blank=True, default="")
    body = models.BinaryField(null=True)
    received_at = models.DateTimeField(auto_now_add=True)
    # Why the mapping refused this export: kept aside, out of the backlog, for the operator.
    error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [gin_index(fields=["trace_ids"], name="spanqueue_trace_ids_gin")]

    def __str__(self) -> str:
        return f"{self.span_count} queued spans of context {self.context_id}"
