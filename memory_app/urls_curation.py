"""Dashboard II URLs: curation (prune/edit/undo, bulk prune), playground, memories, audit, keys, purge."""

from django.urls import path

from memory_app.views import audit, curate, keys, memories, playground

urlpatterns = [
    path("contexts/<int:context_id>/curate/", curate.curate_history, name="curate-history"),
    path("contexts/<int:context_id>/curate/prune/", curate.curate_set_pruned, name="curate-prune"),
    path("contexts/<int:context_id>/curate/messages/<int:message_id>/", curate.message_row, name="curate-message-row"),
    path("contexts/<int:context_id>/curate/messages/<int:message_id>/edit/", curate.message_edit_view,
         name="curate-message-edit"),
    path("contexts/<int:context_id>/bulk-prune/", curate.bulk_prune, name="curate-bulk"),
    path("contexts/<int:context_id>/bulk-prune/apply/", curate.bulk_prune_apply, name="curate-bulk-apply"),
    path("contexts/<int:context_id>/playground/", playground.playground, name="playground"),
    path("runs/<int:run_id>/curate/", curate.curate_run, name="curate-run"),
    path("runs/<int:run_id>/curate/prune/", curate.curate_steps_set_pruned, name="curate-steps-prune"),
    path("memories/", memories.memory_list, name="memories"),
    path("memories/merge/", memories.memory_merge, name="memory-merge"),
    path("memories/<int:memory_id>/edit/", memories.memory_edit, name="memory-edit"),
    path("memories/<int:memory_id>/archive/", memories.memory_archive, name="memory-archive"),
    path("messages/<int:message_id>/promote/", memories.promote_message, name="memory-promote-message"),
    path("steps/<int:step_id>/promote/", memories.promote_step, name="memory-promote-step"),
    path("audit/", audit.audit_log, name="audit"),
    path("audit/<int:event_id>/", audit.audit_entry, name="audit-entry"),
    path("audit/<int:event_id>/undo/", audit.audit_undo_view, name="audit-undo"),
    path("keys/", keys.keys, name="keys"),
    path("keys/<int:key_id>/revoke/", keys.key_revoke, name="key-revoke"),
    path("purge/", audit.purge, name="purge"),
]
