"""Django admin for every model: power users' view of the raw store.

Pruned items stay visible (filter "pruned") and can be pruned/restored with audited actions.
"""

from collections import defaultdict

from django.contrib import admin

from memory_app.audit import Actor
from memory_app.models import (
    ApiKey,
    AuditEvent,
    Context,
    Embedding,
    EmbeddingRetry,
    MemoryRecord,
    Message,
    Run,
    Step,
    ToolCall,
    TraceSpan,
)


class PrunedFilter(admin.SimpleListFilter):
    title = "pruned"
    parameter_name = "pruned"

    def lookups(self, request, model_admin):
        return [("yes", "Pruned"), ("no", "Live")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(pruned_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(pruned_at__isnull=True)
        return queryset


def _set_pruned(modeladmin, request, queryset, *, prune: bool):
    """Prune or restore through the write path: one audited call per context (or run)."""
    # Imported here: every process loads the admin at startup, the write path (numpy, httpx,
    # the embedding providers) only when an action runs.
    from memory_app.services import curation

    actor = Actor.for_user(request.user)
    changed = 0
    if queryset.model is Message:
        groups = defaultdict(list)
        for pk, context_id in queryset.values_list("pk", "context_id"):
            groups[context_id].append(pk)
        for context in Context.objects.filter(pk__in=groups):
            ids, _ = curation.messages_set_pruned(
                context=context, ids=groups[context.pk], pruned=prune, actor=actor, note="via admin"
            )
            changed += len(ids)
    else:
        groups = defaultdict(list)
        for pk, run_id in queryset.values_list("pk", "run_id"):
            groups[run_id].append(pk)
        for run in Run.objects.filter(pk__in=groups):
            ids, _ = curation.steps_set_pruned(
                run=run, ids=groups[run.pk], pruned=prune, actor=actor, note="via admin"
            )
            changed += len(ids)
    noun = queryset.model._meta.verbose_name_plural
    modeladmin.message_user(request, f"{'Pruned' if prune else 'Restored'} {changed} {noun}.")


@admin.action(description="Prune selected (soft delete)")
def prune_selected(modeladmin, request, queryset):
    _set_pruned(modeladmin, request, queryset, prune=True)


@admin.action(description="Restore selected")
def restore_selected(modeladmin, request, queryset):
    _set_pruned(modeladmin, request, queryset, prune=False)


@admin.register(Context)
class ContextAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "title",
        "keys",
        "message_count",
        "run_count",
        "token_count",
        "last_activity_at",
    ]
    search_fields = ["title", "keys_digest"]
    # The counters and search_seq are the write path's (search_seq: up to where the full-text
    # vectors are stored; set by hand above that, messages would drop out of keyword search).
    readonly_fields = [
        "keys_digest",
        "last_seq",
        "search_seq",
        "message_count",
        "token_count",
        "run_count",
        "created_at",
        "updated_at",
    ]
    date_hierarchy = "last_activity_at"
    list_per_page = 50


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "context_id",
        "seq",
        "role",
        "name",
        "short_text",
        "token_count",
        "created_at",
        "pruned_at",
    ]
    list_filter = [PrunedFilter, "role"]
    search_fields = ["text", "client_id", "name"]
    raw_id_fields = ["run", "step"]
    # A message stays in its context at its seq (its full-text vector is keyed by them).
    readonly_fields = [
        "context",
        "seq",
        "token_count",
        "tokenizer",
        "created_at",
        "updated_at",
        "pruned_at",
        "pruned_by",
    ]
    actions = [prune_selected, restore_selected]
    list_per_page = 100
    show_full_result_count = False

    @admin.display(description="text")
    def short_text(self, obj):
        return obj.text[:80]


class ToolCallInline(admin.TabularInline):
    model = ToolCall
    extra = 0
    fields = ["position", "call_id", "name", "arguments", "output", "success", "duration"]


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "run_id",
        "position",
        "kind",
        "step_number",
        "error_type",
        "duration",
        "total_tokens",
        "pruned_at",
    ]
    list_filter = [PrunedFilter, "kind", "is_final_answer"]
    search_fields = ["observations", "error_message", "code_action", "client_id"]
    raw_id_fields = ["run"]
    inlines = [ToolCallInline]
    actions = [prune_selected, restore_selected]
    show_full_result_count = False


class StepInline(admin.TabularInline):
    model = Step
    extra = 0
    fields = [
        "position",
        "kind",
        "step_number",
        "error_type",
        "duration",
        "total_tokens",
        "pruned_at",
    ]
    readonly_fields = fields
    show_change_link = True
    max_num = 0


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "context_id",
        "agent_name",
        "framework",
        "status",
        "step_count",
        "error_count",
        "total_tokens",
        "created_at",
    ]
    list_filter = ["status", "framework"]
    search_fields = ["task", "agent_name", "client_id"]
    raw_id_fields = ["context"]
    inlines = [StepInline]


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin):
    list_display = ["id", "step_id", "position", "call_id", "name", "success", "duration"]
    list_filter = ["name", "success"]
    search_fields = ["call_id", "name", "output"]
    raw_id_fields = ["step"]


@admin.register(MemoryRecord)
class MemoryRecordAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "kind",
        "short_content",
        "context_id",
        "scope_keys",
        "recorded_by",
        "archived_at",
        "created_at",
    ]
    list_filter = ["kind", ("archived_at", admin.EmptyFieldListFilter)]
    search_fields = ["content", "thinking"]
    raw_id_fields = ["context", "source_message", "source_step"]
    readonly_fields = ["scope_digest", "content_hash"]

    @admin.display(description="content")
    def short_content(self, obj):
        return obj.content[:80]


@admin.register(Embedding)
class EmbeddingAdmin(admin.ModelAdmin):
    list_display = ["id", "model", "dimensions", "message_id", "memory_record_id", "indexed"]
    list_filter = ["model", "indexed"]
    raw_id_fields = ["message", "memory_record", "context"]
    exclude = ["vector"]
    show_full_result_count = False


@admin.register(EmbeddingRetry)
class EmbeddingRetryAdmin(admin.ModelAdmin):
    """Items whose provider call failed: the operator's view of a failing embedding provider."""

    list_display = ["embedding_id", "attempts", "next_attempt_at", "last_error"]
    raw_id_fields = ["embedding"]
    ordering = ["next_attempt_at"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "prefix",
        "scopes",
        "context_keys",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    # The secret is never stored in clear; its hash is not editable here.
    readonly_fields = ["prefix", "secret_hash", "created_at", "last_used_at"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["id", "at", "actor", "action", "target_type", "target_ids", "context_id"]
    list_filter = ["action", "target_type"]
    search_fields = ["actor", "note"]
    raw_id_fields = ["context", "user", "api_key", "undone_by"]

    def has_change_permission(self, request, obj=None):
        return False  # the audit trail is append-only

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(TraceSpan)
class TraceSpanAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "trace_id",
        "span_id",
        "parent_span_id",
        "name",
        "role",
        "context_id",
        "run_id",
        "received_at",
    ]
    list_filter = ["role"]
    search_fields = ["trace_id", "span_id", "name"]
    raw_id_fields = ["context", "run"]
    show_full_result_count = False

    def has_change_permission(self, request, obj=None):
        return False  # spans are kept as received
