"""Django admin covers every model; pruned items are visible there and restorable."""

import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from memory_app.models import AuditEvent, Message, MessageSearch, Step
from memory_app.services.contexts import context_get_or_create
from memory_app.services.curation import messages_set_pruned
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, steps_append


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


# Derived data, not edited by hand: the full-text vectors follow their messages (triggers).
NOT_IN_ADMIN = {MessageSearch}


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
