"""The admin page of each model (registered here), on the shared audited and purging bases."""

from django.contrib import admin

from memory_app.admin.audited import (
    AuditedAdmin,
    PrunedFilter,
    PurgeAdmin,
    prune_selected,
    restore_selected,
)
from memory_app.audit import Actor
from memory_app.models import (
    ApiKey,
    AuditEvent,
    Comment,
    Context,
    Embedding,
    EmbeddingModel,
    EmbeddingRetry,
    Label,
    MemoryEmbedding,
    MemoryEmbeddingRetry,
    MemoryRecord,
    Message,
    RetentionPolicy,
    ReviewQueue,
    Run,
    Score,
    Step,
    ToolCall,
    TraceSpan,
)


@admin.register(Context)
class ContextAdmin(PurgeAdmin):
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


# The message fields whose edits go through the write path (`message_edit`).
EDITED_BY_WRITE_PATH = ("text", "tags", "metadata")


@admin.register(Message)
class MessageAdmin(PurgeAdmin):
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

    def save_model(self, request, obj, form, change):
        # Text, tags and metadata change through the write path, as a dashboard edit does: the
        # token count is recounted, the vector re-queued, the edit audited with before and
        # after. The other fields are saved (and audited) as any admin edit.
        written = [f for f in EDITED_BY_WRITE_PATH if f in form.changed_data] if change else []
        if not written:
            return super().save_model(request, obj, form, change)
        from memory_app.services.messages import message_edit  # the write path, loaded when used

        values = {f: getattr(obj, f) for f in written}
        stored = Message.objects.get(pk=obj.pk)
        for f in written:
            setattr(obj, f, getattr(stored, f))
        form.changed_data = [f for f in form.changed_data if f not in written]
        if form.changed_data:
            super().save_model(request, obj, form, change)
        message_edit(message=obj, actor=Actor.for_user(request.user), **values)

    @admin.display(description="text")
    def short_text(self, obj):
        return obj.text[:80]


class CopiesItsContext:
    """A step's, tool call's or retry's context is its parent's, which the database's composite
    keys hold it to: set from the parent when saved, never edited, and the parent fixed once
    the row exists (moving it to another context would break its children's keys)."""

    parent = ""

    def get_readonly_fields(self, request, obj=None):
        fixed = ["context", *([self.parent] if obj is not None else [])]
        return [*super().get_readonly_fields(request, obj), *fixed]

    def save_model(self, request, obj, form, change):
        obj.context_id = getattr(obj, self.parent).context_id
        super().save_model(request, obj, form, change)

    def save_formset(self, request, form, formset, change):
        for row in formset.forms:  # a step's tool calls added inline
            row.instance.context_id = form.instance.context_id
        super().save_formset(request, form, formset, change)


class ToolCallInline(admin.TabularInline):
    model = ToolCall
    extra = 0
    # Deleting a tool call is a purge: its own delete page asks for the typed phrase.
    can_delete = False
    fields = ["position", "call_id", "name", "arguments", "output", "success", "duration"]


@admin.register(Step)
class StepAdmin(CopiesItsContext, PurgeAdmin):
    parent = "run"
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
class RunAdmin(PurgeAdmin):
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
class ToolCallAdmin(CopiesItsContext, PurgeAdmin):
    parent = "step"
    list_display = ["id", "step_id", "position", "call_id", "name", "success", "duration"]
    list_filter = ["name", "success"]
    search_fields = ["call_id", "name", "output"]
    raw_id_fields = ["step"]


@admin.register(MemoryRecord)
class MemoryRecordAdmin(PurgeAdmin):
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
    list_filter = ["kind", "status", ("archived_at", admin.EmptyFieldListFilter)]
    search_fields = ["content", "thinking"]
    raw_id_fields = ["context", "source_message", "source_step", "source_run"]
    # A proposal is decided in the review inbox (the approve permission); who recorded it is
    # the server's word; a legal hold is set and lifted on the dashboard, by admins; a store
    # item's address and time to live are LangGraph's.
    readonly_fields = ["scope_digest", "content_hash", "status", "legal_hold", "origin"]
    readonly_fields += ["recorded_by", "source_api_key", "source_user"]
    readonly_fields += ["namespace", "item_key", "item_ttl", "item_expires_at"]  # the store's

    def save_model(self, request, obj, form, change):
        # Through the write path, as on the dashboard: audited, a version in the memory's history.
        from memory_app.services.memories import memory_admin_save  # loaded when used

        rest = memory_admin_save(obj, form.changed_data if change else None, request.user)
        if rest:
            form.changed_data = rest
            super().save_model(request, obj, form, change)

    @admin.display(description="content")
    def short_content(self, obj):
        return obj.content[:80]


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(AuditedAdmin):
    list_display = ["id", "name", "kind", "max_age_days", "enabled", "last_applied_at"]
    readonly_fields = ["progress", "last_applied_at", "last_summary", "created_by"]


class VectorAdmin(AuditedAdmin):
    list_filter, exclude, show_full_result_count = ["model"], ["vector"], False


@admin.register(Embedding)
class EmbeddingAdmin(CopiesItsContext, VectorAdmin):
    parent = "message"
    list_display = ["id", "model", "dimensions", "message_id"]
    raw_id_fields = ["message"]


@admin.register(MemoryEmbedding)
class MemoryEmbeddingAdmin(VectorAdmin):
    list_display = ["id", "model", "dimensions", "memory_record_id"]
    raw_id_fields = ["memory_record"]


@admin.register(EmbeddingRetry)
class EmbeddingRetryAdmin(CopiesItsContext, AuditedAdmin):
    """Items whose provider call failed: the operator's view of a failing embedding provider."""

    parent = "embedding"
    list_display = ["embedding_id", "attempts", "next_attempt_at", "last_error"]
    raw_id_fields = ["embedding"]
    ordering = ["next_attempt_at"]


admin.site.register(MemoryEmbeddingRetry, AuditedAdmin)  # its __str__ names the attempts


@admin.register(ApiKey)
class ApiKeyAdmin(AuditedAdmin):
    list_display = [
        "id",
        "name",
        "prefix",
        "scopes",
        "context_keys",
        "memory_review",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["memory_review", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    # The secret is never stored in clear; its hash is not editable here.
    readonly_fields = ["prefix", "secret_hash", "created_at", "last_used_at"]


def _never(self, request, obj=None) -> bool:
    return False


@admin.register(EmbeddingModel)
class EmbeddingModelAdmin(AuditedAdmin):
    """The registry of names agents may send vectors under. Read-only here: a registration goes
    through the keys page, the API or `manage.py embedding_model` (checked and audited there),
    and a name's dimensions never change once vectors are stored under it."""

    list_display = ["name", "dimensions", "created_at", "created_by"]
    search_fields = ["name"]
    has_add_permission = has_change_permission = has_delete_permission = _never


@admin.register(AuditEvent)
class AuditEventAdmin(AuditedAdmin):
    """The audit trail: written by the changes it records, append-only."""

    list_display = ["id", "at", "actor", "action", "target_type", "target_ids", "context_id"]
    list_filter = ["action", "target_type"]
    search_fields = ["actor", "note"]
    raw_id_fields = ["context", "user", "api_key", "undone_by"]
    has_add_permission = has_change_permission = has_delete_permission = _never


@admin.register(TraceSpan)
class TraceSpanAdmin(PurgeAdmin):
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


# Written, and audited, by the dashboard, the Agent API and MCP: read-only here.
@admin.register(Score, Label, Comment, ReviewQueue)
class ReviewAdmin(AuditEventAdmin):
    list_display = ["__str__", "created_at"]
    list_filter = search_fields = raw_id_fields = ()
