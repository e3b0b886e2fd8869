"""The dashboard's URLs: reading (contexts, runs), then curation (prune/edit/undo, bulk prune,
playground, memories, audit, keys, purge, retention and erasure)."""

from django.urls import path

from memory_app.views import (
    accounts,
    audit,
    context_detail,
    contexts,
    curate,
    inbox,
    keys,
    memories,
    playground,
    retention,
    run_compare,
    run_table,
    runs,
    scores,
    search_all,
    users,
)

reading_urlpatterns = [
    path("accounts/login/", accounts.login, name="login"),
    path("accounts/logout/", accounts.logout, name="logout"),
    path("", contexts.home, name="home"),
    path("contexts/", contexts.context_list, name="contexts"),
    path("contexts/<int:context_id>/", context_detail.context_page, name="context"),
    path("contexts/<int:context_id>/runs/", context_detail.context_runs, name="context-runs"),
    path(
        "contexts/<int:context_id>/messages/<int:message_id>/prune/",
        context_detail.message_prune,
        name="message-prune",
    ),
    path("runs/", run_table.run_table, name="runs"),
    path("runs/compare/", run_compare.run_compare, name="run-compare"),
    path("search/", search_all.search_page, name="search"),
    path("runs/<int:run_id>/", runs.run_start, name="run"),
    path("runs/<int:run_id>/live/", runs.run_live, name="run-live"),
    path("runs/<int:run_id>/steps/<int:position>/", runs.run_step, name="run-step"),
    path(
        "runs/<int:run_id>/steps/<int:position>/model-input/",
        runs.step_model_input,
        name="step-model-input",
    ),
    path(
        "runs/<int:run_id>/steps/<int:position>/transcript/",
        runs.step_transcript,
        name="step-transcript",
    ),
    path("runs/<int:run_id>/steps/<int:position>/prune/", runs.step_prune, name="step-prune"),
    path(
        "runs/<int:run_id>/steps/<int:position>/outputs/",
        run_compare.step_outputs,
        name="step-outputs",
    ),
    # Review queues and the scores download: read by viewers, written by curators.
    path("queues/", scores.queues, name="queues"),
    path("queues/<int:queue_id>/", scores.queue, name="queue"),
    path("scores/export/", scores.scores_download, name="scores-export"),
]

# Kept as their own list: tests walk every curation URL to check its permissions.
curation_urlpatterns = [
    path("contexts/<int:context_id>/curate/", curate.curate_history, name="curate-history"),
    path("contexts/<int:context_id>/curate/prune/", curate.curate_set_pruned, name="curate-prune"),
    path(
        "contexts/<int:context_id>/curate/messages/<int:message_id>/",
        curate.message_row,
        name="curate-message-row",
    ),
    path(
        "contexts/<int:context_id>/curate/messages/<int:message_id>/edit/",
        curate.message_edit_view,
        name="curate-message-edit",
    ),
    path("contexts/<int:context_id>/bulk-prune/", curate.bulk_prune, name="curate-bulk"),
    path(
        "contexts/<int:context_id>/bulk-prune/apply/",
        curate.bulk_prune_apply,
        name="curate-bulk-apply",
    ),
    path("contexts/<int:context_id>/playground/", playground.playground, name="playground"),
    path("runs/<int:run_id>/curate/", curate.curate_run, name="curate-run"),
    path(
        "runs/<int:run_id>/curate/prune/",
        curate.curate_steps_set_pruned,
        name="curate-steps-prune",
    ),
    path("memories/", memories.memory_list, name="memories"),
    path("memories/merge/", memories.memory_merge, name="memory-merge"),
    path("memories/inbox/", inbox.inbox, name="memory-inbox"),
    path("memories/inbox/decide/", inbox.inbox_decide, name="memory-inbox-decide"),
    path("memories/inbox/merge/", inbox.inbox_merge, name="memory-inbox-merge"),
    path("memories/inbox/<int:memory_id>/edit/", inbox.inbox_edit, name="memory-inbox-edit"),
    path("memories/<int:memory_id>/edit/", memories.memory_edit, name="memory-edit"),
    path("memories/<int:memory_id>/archive/", memories.memory_archive, name="memory-archive"),
    path("memories/<int:memory_id>/purge/", memories.memory_purge_view, name="memory-purge"),
    path("memories/<int:memory_id>/history/", memories.memory_history, name="memory-history"),
    path("memories/<int:memory_id>/restore/", memories.memory_restore, name="memory-restore"),
    path("memories/<int:memory_id>/undo/", memories.memory_undo_view, name="memory-undo"),
    path(
        "messages/<int:message_id>/promote/",
        memories.promote_message,
        name="memory-promote-message",
    ),
    path("steps/<int:step_id>/promote/", memories.promote_step, name="memory-promote-step"),
    path("runs/<int:run_id>/review/", scores.run_review_change, name="run-review"),
    path("audit/", audit.audit_log, name="audit"),
    path("audit/<int:event_id>/", audit.audit_entry, name="audit-entry"),
    path("audit/<int:event_id>/undo/", audit.audit_undo_view, name="audit-undo"),
    path("keys/", keys.keys, name="keys"),
    path("keys/<int:key_id>/revoke/", keys.key_revoke, name="key-revoke"),
    path("keys/<int:key_id>/review/", keys.key_review, name="key-review"),
    path("keys/embedding-models/", keys.embedding_model_add, name="embedding-model-add"),
    path("users/", users.users, name="users"),
    path("users/<int:user_id>/role/", users.user_role, name="user-role"),
    path("users/<int:user_id>/active/", users.user_active, name="user-active"),
    path("users/<int:user_id>/password/", users.user_password, name="user-password"),
    path("purge/", audit.purge, name="purge"),
    path("retention/", retention.retention_policies, name="retention"),
    path("erasure/", retention.erasure_page, name="erasure"),
    path("memories/<int:memory_id>/expiry/", retention.memory_expiry, name="memory-expiry"),
    path(
        "memories/<int:memory_id>/legal-hold/",
        retention.memory_legal_hold,
        name="memory-legal-hold",
    ),
]

urlpatterns = [*reading_urlpatterns, *curation_urlpatterns]
