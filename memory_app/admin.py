"""Django admin for every model: power users' view of the raw store.

Pruned items stay visible (filter "pruned") and can be pruned/restored with audited actions.
Every create, edit and delete made here leaves an audit event, as the dashboard's changes do.
Deleting what agents wrote (contexts, messages, runs, steps, tool calls, memories, trace spans)
is a purge: irreversible, so Django admin's own delete pages (one object, or "Delete selected")
ask for the dashboard's typed purge phrase, and messages, steps, runs and memories go through the
purge of the write path (counters kept, their text erased from edit events and trace spans).
"""

import json
from collections import defaultdict

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse

from memory_app.audit import Actor, audit_record
from memory_app.models import (
    ApiKey,
    AuditEvent,
    Context,
    Embedding,
    EmbeddingModel,
    EmbeddingRetry,
    MemoryEmbedding,
    MemoryEmbeddingRetry,
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


# --- audit of every change, typed confirmation of every purge -----------------------------------

# The dashboard's purge phrase (services.curation.PURGE_CONFIRMATION, tests/test_admin.py holds
# them equal), copied so that loading the admin at startup does not load the write path.
PURGE_PHRASE = "purge pruned items"


def _attnames(model, names) -> list[str]:
    return [f.attname for f in model._meta.concrete_fields if f.name in set(names)]


def _values(model, pk, attnames: list[str]) -> dict | None:
    if not attnames:
        return None
    row = model._default_manager.filter(pk=pk).values(*attnames).first()
    # As JSON stores them: datetimes as ISO text, decimals and UUIDs as strings.
    return json.loads(json.dumps(row, cls=DjangoJSONEncoder)) if row is not None else None


def _context_id(obj) -> int | None:
    if isinstance(obj, Context):
        return obj.pk
    return getattr(obj, "context_id", None)


def _audit(request, action, model, ids, *, context_id=None, before=None, after=None):
    audit_record(
        actor=Actor.for_user(request.user),
        action=action,
        target_type=model._meta.model_name,
        target_ids=list(ids),
        context_id=context_id,
        before=before,
        after=after,
        note="via admin",
    )


class AuditedAdmin(admin.ModelAdmin):
    """Creates, edits (before/after of the changed fields) and deletes leave audit events."""

    delete_action = "delete"

    def save_model(self, request, obj, form, change):
        fields = _attnames(type(obj), form.changed_data)
        before = _values(type(obj), obj.pk, fields) if change else None
        super().save_model(request, obj, form, change)
        if change and not fields:
            return  # saved unchanged: nothing to record
        after = _values(type(obj), obj.pk, fields)
        action = "edit" if change else "create"
        _audit(
            request,
            action,
            type(obj),
            [obj.pk],
            context_id=_context_id(obj),
            **{
                "before": before,
                "after": after,
            },
        )

    def save_formset(self, request, form, formset, change):
        model = formset.model
        deleted = [f.instance.pk for f in formset.deleted_forms if f.instance.pk]
        edited = {
            f.instance.pk: _attnames(model, f.changed_data)
            for f in formset.initial_forms
            if f.instance.pk and f.has_changed() and f.instance.pk not in deleted
        }
        before = {pk: _values(model, pk, fields) for pk, fields in edited.items()}
        super().save_formset(request, form, formset, change)
        context_id = _context_id(form.instance)
        for obj in formset.new_objects:
            _audit(request, "create", model, [obj.pk], context_id=context_id)
        for pk, fields in edited.items():
            if fields:
                after = _values(model, pk, fields)
                _audit(
                    request,
                    "edit",
                    model,
                    [pk],
                    context_id=context_id,
                    before=before[pk],
                    after=after,
                )
        if deleted:
            _audit(request, self.delete_action, model, deleted, context_id=context_id)

    def delete_model(self, request, obj):
        # A deleted context's events keep its id in target_ids (the column points at live rows).
        pk, context_id = obj.pk, None if isinstance(obj, Context) else _context_id(obj)
        with transaction.atomic():
            self.delete_ids(request, [pk])
            _audit(request, self.delete_action, type(obj), [pk], context_id=context_id)

    def delete_queryset(self, request, queryset):
        # All or nothing: Django's "delete selected" action runs outside a transaction.
        with transaction.atomic():
            ids = list(queryset.values_list("pk", flat=True))
            self.delete_ids(request, ids)
            _audit(request, self.delete_action, queryset.model, ids)

    def delete_ids(self, request, ids):
        self.model._default_manager.filter(pk__in=ids).delete()


def _typed(request) -> bool:
    return request.POST.get("confirmation", "").strip() == PURGE_PHRASE


def _refused(modeladmin, request):
    modeladmin.message_user(
        request, f"Type {PURGE_PHRASE!r} to confirm: nothing was deleted.", messages.ERROR
    )


@admin.action(permissions=["delete"], description="Delete selected %(verbose_name_plural)s")
def purge_selected(modeladmin, request, queryset):
    """Django's "Delete selected" whose confirmation page asks for the purge phrase."""
    if request.POST.get("post") and not _typed(request):
        _refused(modeladmin, request)
        request.POST = request.POST.copy()
        del request.POST["post"]  # shows the confirmation page again
    response = delete_selected(modeladmin, request, queryset)
    if isinstance(response, TemplateResponse):
        response.context_data["purge_phrase"] = PURGE_PHRASE
    return response


# Deleted (and audited) by the write path's purge, which also erases their derived copies.
WRITE_PATH_PURGES = (Message, Step, Run, MemoryRecord)


class PurgeAdmin(AuditedAdmin):
    """Deleting agent content is a purge: the typed phrase on both of Django's delete pages."""

    delete_action = "purge"
    delete_confirmation_template = "admin/memory_app/purge_delete_confirmation.html"
    delete_selected_confirmation_template = (
        "admin/memory_app/purge_delete_selected_confirmation.html"
    )

    def get_actions(self, request):
        actions = super().get_actions(request)
        if "delete_selected" in actions:
            actions["delete_selected"] = (
                purge_selected,
                "delete_selected",
                purge_selected.short_description,
            )
        return actions

    def delete_view(self, request, object_id, extra_context=None):
        if request.method == "POST" and not _typed(request):
            _refused(self, request)
            return HttpResponseRedirect(request.get_full_path())
        extra = {"purge_phrase": PURGE_PHRASE, **(extra_context or {})}
        return super().delete_view(request, object_id, extra)

    def delete_model(self, request, obj):
        if self.model in WRITE_PATH_PURGES:
            self.delete_ids(request, [obj.pk])  # the write path's purge audits it
        else:
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        if self.model in WRITE_PATH_PURGES:
            with transaction.atomic():  # several purges (one per context): all or none
                self.delete_ids(request, list(queryset.values_list("pk", flat=True)))
        else:
            super().delete_queryset(request, queryset)

    def delete_ids(self, request, ids):
        from memory_app.services import curation  # the write path, loaded when used
        from memory_app.services.memories import memory_purge

        # Messages, steps, runs and memories (and those a context takes with it) go through the
        # write path's purge: counters kept, their text erased from edit events, trace spans and
        # audit payloads, one event per context.
        message_ids, step_ids, run_ids, memory_ids = [], [], [], []
        if self.model is Context:
            message_ids = list(
                Message.objects.filter(context_id__in=ids).values_list("pk", flat=True)
            )
            run_ids = list(Run.objects.filter(context_id__in=ids).values_list("pk", flat=True))
            memory_ids = list(
                MemoryRecord.objects.filter(context_id__in=ids).values_list("pk", flat=True)
            )
        elif self.model is Run:
            run_ids = ids
        elif self.model is Message:
            message_ids = ids
        elif self.model is Step:
            step_ids = ids
        elif self.model is MemoryRecord:
            memory_ids = ids
        actor = Actor.for_user(request.user)
        if message_ids or step_ids or run_ids:
            curation.selected_purge(
                message_ids=message_ids,
                step_ids=step_ids,
                run_ids=run_ids,
                confirmation=request.POST.get("confirmation", ""),
                actor=actor,
                note="via admin",
            )
        for record in MemoryRecord.objects.filter(pk__in=memory_ids):
            memory_purge(record=record, actor=actor, note="via admin")
        if self.model not in WRITE_PATH_PURGES:
            super().delete_ids(request, ids)


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
    raw_id_fields = ["context", "source_message", "source_step"]
    # A proposal is decided in the review inbox (the approve permission), not here.
    readonly_fields = ["scope_digest", "content_hash", "status"]

    @admin.display(description="content")
    def short_content(self, obj):
        return obj.content[:80]


class VectorAdmin(AuditedAdmin):
    list_filter, exclude, show_full_result_count = ["model", "indexed"], ["vector"], False


@admin.register(Embedding)
class EmbeddingAdmin(CopiesItsContext, VectorAdmin):
    parent = "message"
    list_display = ["id", "model", "dimensions", "message_id", "indexed"]
    raw_id_fields = ["message"]


@admin.register(MemoryEmbedding)
class MemoryEmbeddingAdmin(VectorAdmin):
    list_display = ["id", "model", "dimensions", "memory_record_id", "indexed"]
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


@admin.register(EmbeddingModel)
class EmbeddingModelAdmin(AuditedAdmin):
    """The registry of names agents may send vectors under. Read-only here: a registration goes
    through the keys page, the API or `manage.py embedding_model` (checked and audited there),
    and a name's dimensions never change once vectors are stored under it."""

    list_display = ["name", "dimensions", "created_at", "created_by"]
    search_fields = ["name"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(AuditedAdmin):
    list_display = ["id", "at", "actor", "action", "target_type", "target_ids", "context_id"]
    list_filter = ["action", "target_type"]
    search_fields = ["actor", "note"]
    raw_id_fields = ["context", "user", "api_key", "undone_by"]

    def has_add_permission(self, request):
        return False  # the audit trail is written by the changes it records

    def has_change_permission(self, request, obj=None):
        return False  # the audit trail is append-only

    def has_delete_permission(self, request, obj=None):
        return False


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
