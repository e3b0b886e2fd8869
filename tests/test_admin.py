"""Django admin covers every model; pruned items are visible there and restorable."""

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from memory_app.models import (
    AuditEvent,
    Checkpoint,
    CheckpointBlob,
    CheckpointWrite,
    ContextKey,
    EmbeddingWaiting,
    MemoryEmbeddingWaiting,
    MemoryVersion,
    Message,
    MessageSearch,
    RunSearch,
    SpanQueue,
    Step,
    StoreNamespace,
    ToolCall,
)
from memory_app.services.contexts import context_get_or_create
from memory_app.services.curation import messages_set_pruned
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, steps_append
from memory_app.tokens import count_tokens


@pytest.fixture
def superuser_client(client, django_user_model):
    user = django_user_model.objects.create_superuser(username="root", password="pw-root-123")
    client.force_login(user)
    return client


@pytest.fixture
def history():
    context, _ = context_get_or_create(keys={"user": "ada"})
    result = messages_append(
        context=context,
        items=[{"role": "user", "text": "keep me"}, {"role": "assistant", "text": "prune me"}],
    )
    run, _ = run_create(context=context, task="t")
    steps = steps_append(
        run=run,
        items=[
            {"kind": "task", "task": "t"},
            {
                "kind": "action",
                "step_number": 1,
                "tool_calls": [{"name": "search", "arguments": {"q": "x"}}],
            },
        ],
    )
    return context, result.messages, run, steps.steps


# Derived rows, and rows with composite keys the admin cannot address: the full-text vectors
# follow their messages (triggers); the digest table follows the contexts' keys (an edit there
# would give one context's keys to another); a memory's versions are its history page's;
# LangGraph's checkpoints are serializer bytes (their runs are in the logbook); the run search's
# vectors follow steps and tool calls (triggers, keyed by context, kind and row); queued OTLP
# exports are the worker's to map (their backlog is in /healthz); the store's namespaces follow
# what agents put, delete and ask for; vectors waiting for their HNSW graph are the indexer's to
# move (their backlog is in /healthz).
NOT_IN_ADMIN = {
    EmbeddingWaiting,
    MemoryEmbeddingWaiting,
    RunSearch,
    SpanQueue,
    StoreNamespace,
    MessageSearch,
    ContextKey,
    MemoryEmbeddingWaiting,
    MemoryVersion,
    Checkpoint,
    CheckpointBlob,
    CheckpointWrite,
}


def admin_models():
    return set(apps.get_app_config("memory_app").get_models()) - NOT_IN_ADMIN


def test_every_model_is_registered_in_the_admin():
    assert admin_models() <= set(admin.site._registry)
    assert not NOT_IN_ADMIN & set(admin.site._registry)


@pytest.mark.django_db
def test_every_admin_changelist_and_change_page_renders(superuser_client, history):
    for model in admin_models():
        opts = model._meta
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        assert superuser_client.get(url).status_code == 200, url
        assert superuser_client.get(url, {"q": "me"}).status_code == 200, url
        obj = model.objects.first()
        if obj is not None:
            change = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
            assert superuser_client.get(change).status_code == 200, change


@pytest.mark.django_db
def test_pruned_messages_are_listed_and_restorable_in_the_admin(
    superuser_client, history, system_actor
):
    context, messages, _, _ = history
    pruned = messages[1]
    messages_set_pruned(context=context, ids=[pruned.pk], pruned=True, actor=system_actor)
    url = reverse("admin:memory_app_message_changelist")
    listing = superuser_client.get(url, {"pruned": "yes"}).content.decode()
    assert "prune me" in listing and "keep me" not in listing

    response = superuser_client.post(
        url, {"action": "restore_selected", "_selected_action": [pruned.pk]}, follow=True
    )
    assert response.status_code == 200
    pruned.refresh_from_db()
    assert pruned.pruned_at is None
    event = AuditEvent.objects.filter(action="restore", target_type="message").get()
    assert event.target_ids == [pruned.pk] and event.actor == "user:root"


@pytest.mark.django_db
def test_steps_can_be_pruned_from_the_admin(superuser_client, history):
    _, _, _, steps = history
    url = reverse("admin:memory_app_step_changelist")
    superuser_client.post(
        url, {"action": "prune_selected", "_selected_action": [steps[1].pk]}, follow=True
    )
    assert Step.objects.get(pk=steps[1].pk).pruned_at is not None
    assert Step.objects.get(pk=steps[0].pk).pruned_at is None
    assert Message.objects.filter(pruned_at__isnull=False).count() == 0


# --- audited like the dashboard, purge with the typed phrase -------------------------------------


def _change_form_data(client, url) -> dict:
    """What the admin's change page would post back unchanged."""
    form = client.get(url).context["adminform"].form
    data = {}
    for name, field in form.fields.items():
        value = form[name].value()
        if hasattr(field.widget, "widgets"):  # split date and time
            parts = field.widget.decompress(value)
            for i, part in enumerate(parts):
                data[f"{name}_{i}"] = "" if part is None else str(part)
        elif value is not None:
            data[name] = value
    return data


@pytest.mark.django_db
def test_an_edit_in_the_admin_is_audited_with_before_and_after(superuser_client, history):
    context = history[0]
    url = reverse("admin:memory_app_context_change", args=[context.pk])
    data = _change_form_data(superuser_client, url)
    data["title"] = "renamed"
    response = superuser_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    event = AuditEvent.objects.get(action="edit", target_type="context")
    assert event.actor == "user:root" and event.target_ids == [context.pk]
    assert event.before["title"] == "" and event.after["title"] == "renamed"
    assert event.context_id == context.pk


@pytest.mark.django_db
def test_a_message_edit_in_the_admin_goes_through_the_write_path(superuser_client, history):
    context, (message, _), _, _ = history
    url = reverse("admin:memory_app_message_change", args=[message.pk])
    data = _change_form_data(superuser_client, url)
    data["text"] = "keep me, and these many more words in the edited text"
    data["name"] = "ada"
    response = superuser_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors

    message.refresh_from_db()
    context.refresh_from_db()
    assert message.text == data["text"] and message.name == "ada"
    # The token counts follow the text, as after a dashboard or API edit.
    assert message.token_count == count_tokens([data["text"]])[0]
    assert context.token_count == sum(Message.objects.values_list("token_count", flat=True))
    edit = AuditEvent.objects.get(action="edit", target_type="message", before__has_key="text")
    assert edit.actor == "user:root" and edit.before["text"] == "keep me"
    assert edit.after["text"] == data["text"]
    named = AuditEvent.objects.get(action="edit", target_type="message", before__has_key="name")
    assert named.before == {"name": ""} and named.after == {"name": "ada"}


@pytest.mark.django_db
def test_a_create_and_a_delete_in_the_admin_are_audited(superuser_client, history):
    from memory_app.models import ApiKey

    key = ApiKey.objects.create(name="k", prefix="abcdefabcdef", secret_hash="x" * 64)
    add = reverse("admin:memory_app_toolcall_add")
    data = _change_form_data(superuser_client, add)
    step = Step.objects.first()
    data.update({"step": step.pk, "position": 9, "name": "lookup", "arguments": "{}"})
    assert superuser_client.post(add, data).status_code == 302
    made = ToolCall.objects.get(step=step, position=9)
    event = AuditEvent.objects.get(action="create", target_type="toolcall")
    assert event.target_ids == [made.pk] and event.after["name"] == "lookup"

    delete = reverse("admin:memory_app_apikey_delete", args=[key.pk])
    assert superuser_client.post(delete, {"post": "yes"}).status_code == 302
    event = AuditEvent.objects.get(action="delete", target_type="apikey")
    assert event.target_ids == [key.pk] and event.actor == "user:root"


@pytest.mark.django_db
def test_the_admin_phrase_is_the_dashboard_purge_phrase():
    from memory_app import admin as memory_admin
    from memory_app.services.curation import PURGE_CONFIRMATION

    assert memory_admin.PURGE_PHRASE == PURGE_CONFIRMATION


@pytest.mark.django_db
def test_deleting_a_message_in_the_admin_needs_the_typed_phrase(superuser_client, history):
    context, messages, _, _ = history
    gone = messages[1]
    url = reverse("admin:memory_app_message_delete", args=[gone.pk])
    page = superuser_client.get(url).content.decode()
    assert 'name="confirmation"' in page and "purge pruned items" in page
    refused = superuser_client.post(url, {"post": "yes"}, follow=True)
    assert "nothing was deleted" in refused.content.decode()
    refused = superuser_client.post(url, {"post": "yes", "confirmation": "yes"})
    assert Message.objects.filter(pk=gone.pk).exists()
    done = superuser_client.post(url, {"post": "yes", "confirmation": "purge pruned items"})
    assert done.status_code == 302
    assert not Message.objects.filter(pk=gone.pk).exists()
    context.refresh_from_db()
    assert context.message_count == 1  # the write path's purge keeps the counters
    event = AuditEvent.objects.get(action="purge", target_type="message")
    assert event.target_ids == [gone.pk] and event.actor == "user:root"


@pytest.mark.django_db
def test_delete_selected_in_the_admin_needs_the_typed_phrase(superuser_client, history):
    _, _, run, steps = history
    url = reverse("admin:memory_app_step_changelist")
    chosen = {"action": "delete_selected", "_selected_action": [s.pk for s in steps]}
    page = superuser_client.post(url, chosen).content.decode()
    assert 'name="confirmation"' in page and "purge pruned items" in page
    refused = superuser_client.post(url, {**chosen, "post": "yes", "confirmation": "nope"})
    assert refused.status_code == 200 and "nothing was deleted" in refused.content.decode()
    assert Step.objects.filter(run=run).count() == 2
    superuser_client.post(url, {**chosen, "post": "yes", "confirmation": "purge pruned items"})
    assert not Step.objects.filter(run=run).exists()
    run.refresh_from_db()
    assert run.step_count == 0
    event = AuditEvent.objects.get(action="purge", target_type="step")
    assert sorted(event.target_ids) == sorted(s.pk for s in steps)


@pytest.mark.django_db
def test_deleting_a_memory_or_a_context_in_the_admin_needs_the_typed_phrase(
    superuser_client, history, system_actor
):
    from memory_app.memories import Scope
    from memory_app.models import Context, MemoryRecord
    from memory_app.services.memories import memories_record

    context = history[0]
    items = [{"content": "ada likes tea"}]
    record = memories_record(scope=Scope(context=context), items=items, actor=system_actor)[0]
    record = MemoryRecord.objects.get(pk=getattr(record, "record", record).pk)
    for obj, name in ((record, "memoryrecord"), (context, "context")):
        url = reverse(f"admin:memory_app_{name}_delete", args=[obj.pk])
        superuser_client.post(url, {"post": "yes"})
        assert type(obj).objects.filter(pk=obj.pk).exists()
        superuser_client.post(url, {"post": "yes", "confirmation": "purge pruned items"})
        assert not type(obj).objects.filter(pk=obj.pk).exists()
        assert AuditEvent.objects.filter(action="purge", target_type=name).exists()
    assert not Message.objects.exists() and not MemoryRecord.objects.exists()
    assert not Context.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_delete_selected_in_the_admin_is_all_or_nothing(superuser_client):
    from django.db import connection

    from memory_app.models import Context

    first, _ = context_get_or_create(keys={"user": "ada"})
    second, _ = context_get_or_create(keys={"user": "bob"})
    for context in (first, second):
        messages_append(context=context, items=[{"role": "user", "text": "hello"}])
    # A database fault on the second context's purge, after the first is already deleted.
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF OLD.id = {second.pk} THEN RAISE EXCEPTION 'refused'; END IF; RETURN OLD; END $$"
        )
        cursor.execute(
            "CREATE TRIGGER test_refuse BEFORE DELETE ON memory_app_context "
            "FOR EACH ROW EXECUTE FUNCTION test_refuse()"
        )
    try:
        url = reverse("admin:memory_app_context_changelist")
        data = {
            "action": "delete_selected",
            "_selected_action": [first.pk, second.pk],
            "post": "yes",
            "confirmation": "purge pruned items",
        }
        with pytest.raises(Exception, match="refused"):
            superuser_client.post(url, data)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_refuse ON memory_app_context")
            cursor.execute("DROP FUNCTION test_refuse()")
    assert Context.objects.filter(pk__in=[first.pk, second.pk]).count() == 2
    assert Message.objects.count() == 2
    assert not AuditEvent.objects.filter(action="purge").exists()
