"""`manage.py seed_demo`: varied demo conversations, long-term memories, something in the audit
log, loaded once; every demo screen opens."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from memory_app.models import AuditEvent, Context, MemoryRecord, Message, Run
from tests.builders import make_user

pytestmark = pytest.mark.django_db


def test_seed_demo_loads_varied_data_once_and_every_screen_opens():
    call_command("seed_demo")
    contexts = Context.objects.filter(keys__demo=True)
    assert contexts.count() >= 5
    assert Run.objects.filter(context__in=contexts).count() >= 3
    # A turn that only calls a tool is shown and counted.
    tool_only = Message.objects.filter(context__in=contexts, text="", role="assistant").get()
    assert tool_only.content[0]["type"] == "tool_use" and tool_only.token_count > 0
    # Memories: shared by a user's chats, kept for one context, promoted from a message.
    records = MemoryRecord.objects.all()
    assert records.filter(context__isnull=True).count() >= 3
    assert records.filter(context__isnull=False).count() >= 2
    assert records.filter(source_message__isnull=False).exists()
    assert {r.kind for r in records} >= {"fact", "preference", "task", "tool"}
    # Curated history: an edit and a prune to look at (and undo) in the audit log.
    assert AuditEvent.objects.filter(action="edit", target_type="message").exists()
    assert AuditEvent.objects.filter(action="prune", target_type="message").exists()
    counts = (Context.objects.count(), Message.objects.count(), MemoryRecord.objects.count())
    call_command("seed_demo")
    assert (
        Context.objects.count(),
        Message.objects.count(),
        MemoryRecord.objects.count(),
    ) == counts

    client = Client()
    client.force_login(make_user(role="admin"))
    urls = [reverse("context", args=[c.pk]) for c in contexts]
    urls += [reverse("run", args=[r.pk]) for r in Run.objects.all()]
    urls += [reverse("memories"), reverse("audit"), reverse("contexts")]
    urls += [reverse("audit-entry", args=[e.pk]) for e in AuditEvent.objects.all()]
    for url in urls:
        response = client.get(url, follow=True)
        assert response.status_code == 200, url
