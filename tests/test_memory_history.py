"""Memory history: every change path (REST, dashboard, admin, review inbox, merge, import)
records the memory's next version with who and when; the history page diffs each version
against the one before; restoring a version is a new, audited version; undo reverses the last
edit or archive from the memory itself; a purge takes the versions with it."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from memory_app.audit import Actor
from memory_app.errors import Forbidden
from memory_app.memories import Scope
from memory_app.models import ApiKey, AuditEvent, Context, MemoryRecord, MemoryVersion
from memory_app.services.memories import memories_merge, memories_record, memory_purge
from memory_app.services.memory_history import memory_restore_version
from memory_app.services.memory_review import proposal_merge
from tests.api_helpers import make_key, new_context
from tests.builders import make_user
from tests.test_admin import _change_form_data

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup():
    api = make_key(name="scribe")
    cid = new_context(api, {"user": "ada", "chat": "1"})
    curator = make_user(role="curator", username="cura")
    dashboard = Client()
    dashboard.force_login(curator)
    return api, Context.objects.get(pk=cid), curator, dashboard


def _versions(pk: int) -> list[tuple]:
    return list(
        MemoryVersion.objects.filter(memory_id=pk)
        .order_by("version")
        .values_list("version", "action", "actor", "content")
    )


def _record(api, cid, content="Ada prefers tea", **extra) -> int:
    response = api.post("/api/v1/memories", {"context_id": cid, "content": content, **extra})
    assert response.status_code == 201, response.content
    return response.json()["items"][0]["memory"]["id"]


def test_rest_changes_are_versions_with_who_and_the_audit_event(setup):
    api, context, _, _ = setup
    pk = _record(api, context.pk, keywords=["tea"])
    label = api.key.actor
    assert api.patch(f"/api/v1/memories/{pk}", {"content": "Ada prefers coffee"}).status_code == 200
    assert api.post(f"/api/v1/memories/{pk}/archive", {}).status_code == 200
    assert api.post(f"/api/v1/memories/{pk}/restore", {}).status_code == 200
    assert _versions(pk) == [
        (1, "record", label, "Ada prefers tea"),
        (2, "edit", label, "Ada prefers coffee"),
        (3, "archive", label, "Ada prefers coffee"),
        (4, "unarchive", label, "Ada prefers coffee"),
    ]
    versions = list(MemoryVersion.objects.filter(memory_id=pk).order_by("version"))
    assert all(v.api_key_id == api.key.pk and v.user_id is None for v in versions)
    assert versions[2].archived_at is not None and versions[3].archived_at is None
    edit = AuditEvent.objects.get(action="edit", target_type="memoryrecord")
    assert versions[1].audit_event_id == edit.pk
    # An edit that changes nothing is no version.
    api.patch(f"/api/v1/memories/{pk}", {"content": "Ada prefers coffee"})
    assert len(_versions(pk)) == 4


def test_the_history_page_diffs_each_version_and_escapes_what_agents_wrote(setup):
    api, context, _, dashboard = setup
    pk = _record(api, context.pk, content="Ada drinks <b>tea</b> daily", metadata={"z": 1, "a": 2})
    api.patch(f"/api/v1/memories/{pk}", {"content": "Ada drinks <b>coffee</b> daily"})
    api.patch(f"/api/v1/memories/{pk}", {"keywords": ["coffee"], "kind": "preference"})
    page = dashboard.get(reverse("memory-history", args=[pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "<b>" not in html
    assert "<del>&lt;b&gt;tea&lt;/b&gt;</del><ins>&lt;b&gt;coffee&lt;/b&gt;</ins>" in html
    assert "<dt>kind</dt><dd><del>fact</del> → <ins>preference</ins></dd>" in html
    assert (
        html.index('id="version-3"') < html.index('id="version-2"') < html.index('id="version-1"')
    )
    assert "Restore version 1" in html and "Restore version 3" not in html
    # The memories page links to it and offers the undo of the last change.
    card = dashboard.get(reverse("memories") + f"?id={pk}").content.decode()
    assert reverse("memory-history", args=[pk]) in card and "Undo edit" in card


def test_restore_a_version_is_a_new_audited_version(setup):
    api, context, curator, dashboard = setup
    pk = _record(api, context.pk, keywords=["tea"])
    api.patch(f"/api/v1/memories/{pk}", {"content": "Ada prefers coffee", "keywords": ["coffee"]})
    api.post(f"/api/v1/memories/{pk}/archive", {})
    response = dashboard.post(reverse("memory-restore", args=[pk]), {"version": 1})
    assert response.status_code == 302 and response["Location"].endswith(f"/memories/{pk}/history/")
    record = MemoryRecord.objects.get(pk=pk)
    assert (record.content, record.keywords, record.archived_at) == (
        "Ada prefers tea",
        ["tea"],
        None,
    )
    assert _versions(pk)[-1] == (
        4,
        "restore_version",
        f"user:{curator.username}",
        "Ada prefers tea",
    )
    event = AuditEvent.objects.get(action="memory_restore_version")
    assert (
        event.before["content"] == "Ada prefers coffee"
        and event.after["content"] == "Ada prefers tea"
    )
    assert MemoryVersion.objects.get(memory_id=pk, version=4).audit_event_id == event.pk
    # Recall finds the restored text.
    found = api.post("/api/v1/memories/retrieve", {"context_id": context.pk, "keywords": ["tea"]})
    assert [m["id"] for m in found.json()["items"]] == [pk]
    # The current version, and a version that does not exist, are refused.
    assert dashboard.post(reverse("memory-restore", args=[pk]), {"version": 4}).status_code == 400
    assert dashboard.post(reverse("memory-restore", args=[pk]), {"version": 9}).status_code == 404
    assert dashboard.post(reverse("memory-restore", args=[pk]), {"version": "x"}).status_code == 400
    assert len(_versions(pk)) == 4


def test_a_restore_onto_another_memorys_content_is_refused_and_changes_nothing(setup):
    api, context, _, dashboard = setup
    pk = _record(api, context.pk, content="Ada prefers tea")
    api.patch(f"/api/v1/memories/{pk}", {"content": "Ada prefers coffee"})
    _record(api, context.pk, content="Ada prefers tea")
    response = dashboard.post(reverse("memory-restore", args=[pk]), {"version": 1})
    assert response.status_code == 400
    assert MemoryRecord.objects.get(pk=pk).content == "Ada prefers coffee"
    assert len(_versions(pk)) == 2


def test_undo_reverses_the_last_edit_or_archive_in_one_click(setup):
    api, context, _, dashboard = setup
    pk = _record(api, context.pk)
    undo = reverse("memory-undo", args=[pk])
    # Nothing to undo yet: the memory was only recorded.
    assert dashboard.post(undo).status_code == 400
    api.patch(f"/api/v1/memories/{pk}", {"content": "Ada prefers coffee"})
    response = dashboard.post(undo, HTTP_HX_REQUEST="true", HTTP_HX_TARGET=f"mem-{pk}")
    assert response.status_code == 200
    assert MemoryRecord.objects.get(pk=pk).content == "Ada prefers tea"
    assert "Ada prefers tea" in response.content.decode()
    dashboard.post(reverse("memory-archive", args=[pk]), {"archived": "1"})
    assert MemoryRecord.objects.get(pk=pk).archived_at is not None
    assert dashboard.post(undo).status_code == 302
    assert MemoryRecord.objects.get(pk=pk).archived_at is None
    assert [v[1] for v in _versions(pk)] == ["record", "edit", "undo", "archive", "undo"]
    assert AuditEvent.objects.filter(action="memory_undo").count() == 2


def test_the_review_inbox_merge_admin_and_purge_paths_keep_versions(setup, django_user_model):
    api, context, curator, dashboard = setup
    ApiKey.objects.filter(pk=api.key.pk).update(memory_review="proposed")
    api.key.refresh_from_db()
    proposal = _record(api, context.pk, content="Ada likes jazz")
    other = _record(api, context.pk, content="Ada lives in Paris")
    scope = Scope(context=context)
    [live] = memories_record(
        scope=scope,
        items=[{"content": "Ada lives in Paris, France"}],
        actor=Actor.for_user(curator),
    )
    # The inbox's approve and merge, through the dashboard.
    decide = dashboard.post(
        reverse("memory-inbox-decide"), {"ids": [proposal], "action": "approve"}
    )
    assert decide.status_code in (200, 302), decide.content
    assert [v[1] for v in _versions(proposal)] == ["record", "approve"]
    proposal_merge(proposal_id=other, into_id=live.record.pk, actor=Actor.for_user(curator))
    assert [v[1] for v in _versions(other)] == ["record", "merged"]
    assert MemoryVersion.objects.get(memory_id=other, version=2).status == "merged"
    assert [v[1] for v in _versions(live.record.pk)] == ["record", "merge"]
    # A reviewed key cannot restore what the review made live.
    with pytest.raises(Forbidden):
        memory_restore_version(
            record=MemoryRecord.objects.get(pk=proposal), version=1, actor=Actor.for_key(api.key)
        )
    # A merge from the memories page: the kept memory and the archived one.
    api_plain = make_key(name="plain")
    [a] = memories_record(
        scope=scope, items=[{"content": "Ada swims"}], actor=Actor.for_user(curator)
    )
    [b] = memories_record(
        scope=scope, items=[{"content": "Ada swims daily"}], actor=Actor.for_user(curator)
    )
    memories_merge(keep_id=a.record.pk, ids=[b.record.pk], actor=Actor.for_key(api_plain.key))
    assert [v[1] for v in _versions(b.record.pk)] == ["record", "merged"]

    # The admin's edit goes through the write path: a version.
    admin = django_user_model.objects.create_superuser(username="root", password="pw-root-123")
    dashboard.force_login(admin)
    url = reverse("admin:memory_app_memoryrecord_change", args=[a.record.pk])
    data = _change_form_data(dashboard, url)
    data["content"] = "Ada swims in the sea"
    response = dashboard.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert _versions(a.record.pk)[-1] == (3, "edit", "user:root", "Ada swims in the sea")
    # A purge takes the versions (and their content) with the memory.
    memory_purge(record=MemoryRecord.objects.get(pk=a.record.pk), actor=Actor.for_user(admin))
    assert not MemoryVersion.objects.filter(memory_id=a.record.pk).exists()
