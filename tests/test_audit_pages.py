"""Audit event pages and the links that lead to them; the compact before/after diff; viewers
reading memories; the "Recent changes" list after an undo."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from memory_app.audit import Actor
from memory_app.models import AuditEvent, MemoryRecord, Message
from memory_app.rendering import change_diff
from memory_app.services import curation
from memory_app.services.curation import messages_set_pruned
from memory_app.services.memories import memory_promote
from memory_app.services.messages import message_edit
from tests.builders import make_context, make_user

pytestmark = pytest.mark.django_db

EVENT_LINK = re.compile(r'href="(/audit/(\d+)/)"')


def client_for(role: str) -> Client:
    client = Client()
    client.force_login(make_user(role=role))
    return client


def event_links(html: str) -> dict[str, int]:
    return {url: int(pk) for url, pk in EVENT_LINK.findall(html)}


def assert_event_pages_open(client: Client, links: dict[str, int]) -> None:
    assert links
    for url, pk in links.items():
        response = client.get(url)
        assert response.status_code == 200, f"{url}: {response.status_code}"
        assert f"Event {pk}:" in response.content.decode()


@pytest.fixture
def history():
    """A context with an edit, a prune, an undone prune and an undo: every kind of audit link."""
    context = make_context(messages=6)
    actor = Actor.system("seed")
    first, second, third = Message.objects.filter(context=context).order_by("seq")[:3]
    message_edit(message=first, actor=actor, text="line one\nline two\nline three\nline four")
    message_edit(message=first, actor=actor, text="line one\nline 2\nline three\nline four")
    messages_set_pruned(context=context, ids=[second.pk], pruned=True, actor=actor)
    _, undone = messages_set_pruned(context=context, ids=[third.pk], pruned=True, actor=actor)
    curation.audit_undo(event=undone, actor=actor)
    return context


def test_every_event_link_of_the_audit_log_opens_its_page(history):
    client = client_for("curator")
    links = event_links(client.get(reverse("audit")).content.decode())
    # one "event N" link per event, plus "undone by event N" for the undone prune
    assert set(links.values()) == set(AuditEvent.objects.values_list("pk", flat=True))
    assert_event_pages_open(client, links)


def test_curate_details_links_open_their_events(history):
    client = client_for("curator")
    html = client.get(reverse("curate-history", args=[history.pk])).content.decode()
    details = re.findall(r'<a href="(/audit/(\d+)/)">details</a>', html)
    # the two edits and the prune in force; the undone prune and the restore that undid it
    # cancel out
    assert len(details) == 3
    undone = AuditEvent.objects.get(undone_by__isnull=False)
    assert undone.pk not in {int(pk) for _, pk in details}
    assert_event_pages_open(client, {url: int(pk) for url, pk in details})


def test_links_after_a_purge_open_their_events(history):
    client = client_for("admin")
    later = (timezone.now() + timezone.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    response = client.post(
        reverse("purge"), {"older_than": later, "confirmation": curation.PURGE_CONFIRMATION}
    )
    assert response.status_code == 200
    links = event_links(response.content.decode())
    purges = set(AuditEvent.objects.filter(action="purge").values_list("pk", flat=True))
    assert purges and set(links.values()) == purges
    assert_event_pages_open(client, links)


def test_an_event_page_offers_undo_and_says_when_it_was_undone(history):
    client = client_for("curator")
    prune = AuditEvent.objects.filter(action="prune", undone_by__isnull=True).get()
    html = client.get(reverse("audit-entry", args=[prune.pk])).content.decode()
    assert f'action="/audit/{prune.pk}/undo/"' in html
    client.post(reverse("audit-undo", args=[prune.pk]))
    prune.refresh_from_db()
    html = client.get(reverse("audit-entry", args=[prune.pk])).content.decode()
    assert f'action="/audit/{prune.pk}/undo/"' not in html
    assert f'undone by <a href="/audit/{prune.undone_by_id}/">' in html


def test_an_unknown_event_is_404():
    assert client_for("curator").get(reverse("audit-entry", args=[987654])).status_code == 404


def test_an_edit_shows_only_the_changed_lines_with_one_line_of_context(history):
    edit = AuditEvent.objects.filter(action="edit").latest("id")
    html = client_for("curator").get(reverse("audit-entry", args=[edit.pk])).content.decode()
    diff = html[html.index('class="change-diff"') :]
    assert '<span class="del">-line two</span>' in diff
    assert '<span class="ins">+line 2</span>' in diff
    assert '<span class="ctx"> line one</span>' in diff
    assert "line four" not in diff  # two lines away from the change
    assert "unchanged</dt><dd" in diff and "tags, metadata" in diff


def test_change_diff_of_values_fields_and_one_sided_events():
    changes, same = change_diff({"a": True, "b": 1, "c": "x"}, {"a": False, "b": 1, "d": None})
    assert same == ["b"]
    assert [(c.field, c.old, c.new) for c in changes] == [
        ("a", "true", "false"),
        ("c", '"x"', None),
        ("d", None, "null"),
    ]
    [created], _ = change_diff(None, {"name": "k"})
    assert (created.old, created.new) == (None, '{"name": "k"}')
    assert change_diff({"x": 1}, {"x": 1}) == ([], ["x"])


def test_agent_text_in_a_diff_is_escaped():
    context = make_context(messages=1)
    message = Message.objects.get(context=context)
    message_edit(message=message, actor=Actor.system("t"), text="<script>alert(1)</script>\nx")
    edit = AuditEvent.objects.get(action="edit")
    html = client_for("curator").get(reverse("audit-entry", args=[edit.pk])).content.decode()
    assert "<script>alert" not in html and "+&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_viewers_read_memories_but_see_no_button_to_change_them():
    context = make_context(messages=1)
    message = Message.objects.get(context=context)
    record, _ = memory_promote(actor=Actor.system("t"), message=message)
    viewer = client_for("viewer")
    page = viewer.get(reverse("memories"))
    html = page.content.decode()
    assert page.status_code == 200 and f'id="mem-{record.pk}"' in html
    assert 'href="/memories/"' in html  # in the navigation
    for control in ("Merge selected", "/edit/", "/archive/", 'name="ids"'):
        assert control not in html
    assert viewer.get(reverse("memories") + f"?id={record.pk}").status_code == 200
    assert (
        viewer.post(reverse("memory-edit", args=[record.pk]), {"content": "x"}).status_code == 403
    )
    assert viewer.post(reverse("memory-archive", args=[record.pk])).status_code == 403
    assert viewer.post(reverse("memories")).status_code == 405
    assert MemoryRecord.objects.get(pk=record.pk).archived_at is None


def test_curators_see_the_memory_controls():
    context = make_context(messages=1)
    memory_promote(actor=Actor.system("t"), message=Message.objects.get(context=context))
    html = client_for("curator").get(reverse("memories")).content.decode()
    assert "Merge selected" in html and "/archive/" in html


def test_recent_changes_stop_offering_undo_once_the_event_is_undone():
    context = make_context(messages=3)
    client = client_for("curator")
    ids = list(Message.objects.filter(context=context).values_list("pk", flat=True)[:1])
    client.post(reverse("curate-prune", args=[context.pk]), {"ids": ids, "pruned": "1"})
    event = AuditEvent.objects.get(action="prune")
    url = reverse("curate-history", args=[context.pk])
    recent = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="recent-changes")
    html = recent.content.decode()
    assert html.lstrip().startswith('<div id="recent-changes"')
    assert f'action="/audit/{event.pk}/undo/"' in html
    undo = client.post(reverse("audit-undo", args=[event.pk]), HTTP_HX_REQUEST="true")
    # The list listens for this event and asks for itself again.
    assert undo["HX-Trigger"] == "curation-changed"
    assert 'hx-trigger="curation-changed from:body"' in html
    html = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="recent-changes").content.decode()
    assert f'action="/audit/{event.pk}/undo/"' not in html
    assert "Undo" not in html
