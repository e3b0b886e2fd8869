"""What every admin page of the store shares: each create, edit and delete leaves an audit
event, as the dashboard's changes do; pruned items stay visible and are pruned or restored by
audited actions; deleting what agents wrote is a purge, which asks for the dashboard's typed
purge phrase and goes through the write path's purge (counters kept, text erased from edit events
and trace spans)."""

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
    Context,
    MemoryRecord,
    Message,
    Run,
    Step,
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


def _refused(modeladmin, request, ids) -> bool:
    """Whether the purge is refused (said on the page): the phrase not typed, or a memory under
    legal hold among what it would delete."""
    if request.POST.get("confirmation", "").strip() != PURGE_PHRASE:
        why = f"Type {PURGE_PHRASE!r} to confirm"
    else:
        held = {MemoryRecord: "pk__in", Context: "context_id__in"}.get(modeladmin.model)
        rows = MemoryRecord.objects.filter(**{held: ids}).exclude(legal_hold="") if held else []
        why = held and rows and f"Under legal hold: memory {', '.join(str(r.pk) for r in rows)}"
    if why:
        modeladmin.message_user(request, f"{why}: nothing was deleted.", messages.ERROR)
    return bool(why)


@admin.action(permissions=["delete"], description="Delete selected %(verbose_name_plural)s")
def purge_selected(modeladmin, request, queryset):
    """Django's "Delete selected" whose confirmation page asks for the purge phrase."""
    if request.POST.get("post") and _refused(modeladmin, request, [o.pk for o in queryset]):
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
        if request.method == "POST" and _refused(self, request, [object_id]):
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
