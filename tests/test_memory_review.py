"""Memories agents propose and operators review: a reviewed key's records are proposals no
retrieval returns until approved; approve, edit then approve, merge, reject (audited, by the
`approve` permission only); the inbox's look-alikes; near-copies answered by the live record."""

from __future__ import annotations

import math
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from memory_app.audit import Actor
from memory_app.errors import Forbidden
from memory_app.memories import Scope
from memory_app.models import ApiKey, AuditEvent, Context, MemoryRecord
from memory_app.queries.memory_review import memories_inbox
from memory_app.services.memories import memories_record
from memory_app.services.memory_review import proposal_merge, proposals_approve, proposals_reject
from tests.api_helpers import make_key, new_context
from tests.builders import make_user, register_models

pytestmark = pytest.mark.django_db


@pytest.fixture
def reviewed():
    """A key whose memories are proposed, its context, and a curator."""
    api = make_key(context_keys=None)
    ApiKey.objects.filter(pk=api.key.pk).update(memory_review="proposed")
    api.key.refresh_from_db()
    cid = new_context(api, {"user": "ada", "chat": "1"})
    return api, cid, make_user(role="curator")


def _record(api, cid, content, **extra):
    response = api.post("/api/v1/memories", {"context_id": cid, "content": content, **extra})
    assert response.status_code in (200, 201), response.content
    return response.json()["items"][0]


def _recalled(api, cid, query) -> list[str]:
    response = api.post("/api/v1/memories/retrieve", {"context_id": cid, "query": query})
    assert response.status_code == 200, response.content
    return [m["content"] for m in response.json()["items"]]


def test_a_proposal_is_never_recalled_until_approved(reviewed):
    api, cid, curator = reviewed
    item = _record(api, cid, "Ada prefers green tea", keywords=["tea"])
    assert item["created"] is True and item["memory"]["status"] == "proposed"
    pk = item["memory"]["id"]
    assert _recalled(api, cid, "green tea") == []
    keyword = api.post("/api/v1/memories/retrieve", {"context_id": cid, "keywords": ["tea"]})
    assert keyword.json()["items"] == []
    # The agent reads its proposal's status.
    assert api.get(f"/api/v1/memories/{pk}").json()["status"] == "proposed"
    status = api.get("/api/v1/memories/status", {"ids": [pk, 999_999]}).json()
    assert [m["status"] for m in status["items"]] == ["proposed"] and status["missing"] == [999_999]

    proposals_approve([pk], actor=Actor.for_user(curator))
    assert _recalled(api, cid, "green tea") == ["Ada prefers green tea"]
    assert api.get("/api/v1/memories/status", {"ids": [pk]}).json()["items"][0]["status"] == "live"
    event = AuditEvent.objects.get(action="memory_approve")
    assert event.target_ids == [pk] and event.actor == f"user:{curator.username}"
    assert event.before == [{"id": pk, "status": "proposed"}]
    assert event.after == [{"id": pk, "status": "live"}]


def test_a_rejected_proposal_stays_out_and_answers_its_repeat(reviewed):
    api, cid, curator = reviewed
    pk = _record(api, cid, "Ada hates tea")["memory"]["id"]
    [rejected] = proposals_reject([pk], actor=Actor.for_user(curator), note="wrong")
    assert rejected.status == "rejected"
    again = _record(api, cid, "Ada hates tea")
    assert again["created"] is False and again["memory"]["status"] == "rejected"
    assert _recalled(api, cid, "tea") == []
    assert AuditEvent.objects.get(action="memory_reject").note == "wrong"


def test_only_an_operator_with_approve_decides(reviewed):
    api, cid, _ = reviewed
    pk = _record(api, cid, "Ada plays chess")["memory"]["id"]
    viewer = make_user(role="viewer")
    with pytest.raises(Forbidden):
        proposals_approve([pk], actor=Actor.for_user(viewer))
    admin_key = make_key(scopes=["read", "write", "admin"])
    with pytest.raises(Forbidden):
        proposals_approve([pk], actor=Actor.for_key(admin_key.key))
    # No API call changes a status: an edit's unknown field is ignored, the record stays proposed.
    api.patch(f"/api/v1/memories/{pk}", {"status": "live", "keywords": ["chess"]})
    assert MemoryRecord.objects.get(pk=pk).status == "proposed"
    assert Client().get(reverse("memory-inbox")).status_code == 302  # to the login page
    client = Client()
    client.force_login(viewer)
    assert client.get(reverse("memory-inbox")).status_code == 403
    post = client.post(reverse("memory-inbox-decide"), {"ids": [pk], "action": "approve"})
    assert post.status_code == 403
    assert MemoryRecord.objects.get(pk=pk).status == "proposed"


def test_a_reviewed_key_changes_its_proposals_only(reviewed):
    api, cid, curator = reviewed
    live = MemoryRecord.objects.create(
        context_id=cid, scope_digest="x", content="Ada lives in Paris", content_hash="h"
    )
    for call in (
        lambda: api.patch(f"/api/v1/memories/{live.pk}", {"content": "Ada lives in Rome"}),
        lambda: api.post(f"/api/v1/memories/{live.pk}/archive"),
    ):
        response = call()
        assert response.status_code == 403, response.content
    assert MemoryRecord.objects.get(pk=live.pk).content == "Ada lives in Paris"
    pk = _record(api, cid, "Ada lives in Lyon")["memory"]["id"]
    edited = api.patch(f"/api/v1/memories/{pk}", {"content": "Ada lives in Lyon, France"})
    assert edited.status_code == 200 and edited.json()["status"] == "proposed"


def test_a_reviewed_keys_import_proposes_and_holds_nothing(db, settings):
    """A backup a key imports cannot make its memories live past its review, nor put them
    under legal hold (a dashboard admin's act): they land as the key's own records would."""
    settings.AGENTMEMORY_MEMORY_REVIEW_SCOPES = [{"tenant": "acme"}]
    source = make_key(scopes=["read", "write", "admin"])
    cid = new_context(source, {"tenant": "acme", "user": "ada"})
    live = _live(cid, "Ada lives in Paris")
    MemoryRecord.objects.filter(pk=live.pk).update(legal_hold="case 7")
    body = b"".join(source.get("/api/v1/export").streaming_content)
    MemoryRecord.objects.all().delete()
    Context.objects.all().delete()

    importer = make_key(scopes=["read", "write", "admin"])
    response = importer.client.generic(
        "POST", "/api/v1/import", body, content_type="application/x-ndjson", **importer._headers()
    )
    assert response.status_code == 200, response.content
    imported = MemoryRecord.objects.get(content="Ada lives in Paris")
    assert (imported.status, imported.legal_hold) == ("proposed", "")
    assert _recalled(importer, imported.context_id, "Paris") == []
    # An operator's import restores the file as it was.
    MemoryRecord.objects.all().delete()
    Context.objects.all().delete()
    from memory_app.backup.restore import import_lines

    import_lines(
        iter(body.splitlines(keepends=True)), actor=Actor.for_user(make_user(role="admin"))
    )
    restored = MemoryRecord.objects.get(content="Ada lives in Paris")
    assert (restored.status, restored.legal_hold) == ("live", "case 7")


def test_a_review_scope_proposes_whatever_the_key(db, settings):
    settings.AGENTMEMORY_MEMORY_REVIEW_SCOPES = [{"tenant": "acme"}]
    api = make_key()
    acme = new_context(api, {"tenant": "acme", "user": "ada"})
    other = new_context(api, {"tenant": "zeta", "user": "ada"})
    assert _record(api, acme, "Acme ships on Fridays")["memory"]["status"] == "proposed"
    assert _record(api, other, "Zeta ships on Mondays")["memory"]["status"] == "live"
    # An operator's record is live.
    [recorded] = memories_record(
        scope=Scope(keys={"tenant": "acme"}),
        items=[{"content": "Acme is a customer"}],
        actor=Actor.for_user(make_user(role="curator")),
    )
    assert recorded.record.status == "live"


def _live(cid: int, content: str, **fields) -> MemoryRecord:
    [recorded] = memories_record(
        scope=Scope(context=Context.objects.get(pk=cid)),
        items=[{"content": content, **fields}],
        actor=Actor.system("test"),
    )
    return recorded.record


def test_the_inbox_shows_near_duplicates_and_conflicts_by_shared_words(reviewed):
    api, cid, curator = reviewed
    live = _live(cid, "Ada lives in Paris, France")
    dup = _record(api, cid, "Ada lives in Paris")["memory"]["id"]
    conflict = _record(api, cid, "Ada lives in Lyon")["memory"]["id"]
    unrelated = _record(api, cid, "The build needs Python 3.11")["memory"]["id"]
    by_id = {p.record.pk: p for p in memories_inbox()}
    assert [(s.record.pk, s.measure) for s in by_id[dup].duplicates] == [(live.pk, "words")]
    assert by_id[dup].duplicates[0].similarity == pytest.approx(3 / 4)
    assert [s.record.pk for s in by_id[conflict].conflicts] == [live.pk]
    assert by_id[conflict].duplicates == []
    assert by_id[unrelated].duplicates == [] and by_id[unrelated].conflicts == []


def test_the_inbox_shows_near_duplicates_and_conflicts_by_vector_similarity(reviewed, settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    register_models(**{"review-3": 3})
    api, cid, curator = reviewed

    def at(degrees: float) -> dict:
        radians = math.radians(degrees)
        return {"vector": [math.cos(radians), math.sin(radians), 0.0], "vector_model": "review-3"}

    # No two texts share a word: only their vectors relate them.
    same = _live(cid, "Ada drinks tea daily", **at(0))
    near = _live(cid, "Her favourite beverage: coffee", **at(50))
    _live(cid, "The build needs Python 3.11", **at(90))
    pk = _record(api, cid, "She loves green infusions", **at(20))["memory"]["id"]
    [proposal] = memories_inbox()
    assert proposal.record.pk == pk
    assert [(s.record.pk, s.measure) for s in proposal.duplicates] == [(same.pk, "semantic")]
    assert proposal.duplicates[0].similarity == pytest.approx(math.cos(math.radians(20)), abs=1e-4)
    assert [s.record.pk for s in proposal.conflicts] == [near.pk]
    # The thresholds are the operator's.
    settings.AGENTMEMORY_MEMORY_DUPLICATE_SIMILARITY = 0.99
    settings.AGENTMEMORY_MEMORY_CONFLICT_SIMILARITY = 0.9
    [proposal] = memories_inbox()
    assert proposal.duplicates == [] and [s.record.pk for s in proposal.conflicts] == [same.pk]


def test_merging_a_proposal_unites_keywords_and_marks_it_merged(reviewed):
    api, cid, curator = reviewed
    live = _live(cid, "Ada lives in Paris, France", keywords=["home"])
    pk = _record(api, cid, "Ada lives in Paris", keywords=["city"])["memory"]["id"]
    keep = proposal_merge(proposal_id=pk, into_id=live.pk, actor=Actor.for_user(curator))
    assert keep.keywords == ["home", "city"]
    merged = api.get("/api/v1/memories/status", {"ids": [pk]}).json()["items"][0]
    assert merged["status"] == "merged" and merged["metadata"]["merged_into"] == live.pk
    assert _recalled(api, cid, "Paris") == ["Ada lives in Paris, France"]
    event = AuditEvent.objects.get(action="memory_merge")
    assert set(event.target_ids) == {live.pk, pk}


def test_the_dashboard_inbox_flow_without_javascript(reviewed):
    api, cid, curator = reviewed
    live = _live(cid, "Ada lives in Paris, France")
    a = _record(api, cid, "<script>alert(1)</script> Ada likes jazz")["memory"]["id"]
    b = _record(api, cid, "Ada likes opera")["memory"]["id"]
    c = _record(api, cid, "Ada lives in Paris")["memory"]["id"]
    d = _record(api, cid, "Ada likes techno")["memory"]["id"]
    client = Client()
    client.force_login(curator)
    page = client.get(reverse("memory-inbox"))
    html = page.content.decode()
    assert page.status_code == 200
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html
    assert f"Merge into memory {live.pk}" in html and "key:" in html  # provenance
    bulk = client.post(reverse("memory-inbox-decide"), {"ids": [a, b], "action": "approve"})
    assert bulk.status_code == 302 and "done=approve&n=2" in bulk["Location"]
    merged = client.post(reverse("memory-inbox-merge"), {"proposal": c, "into": live.pk})
    assert merged.status_code == 302
    edited = client.post(
        reverse("memory-inbox-edit", args=[d]),
        {"content": "Ada likes techno and house", "keywords": "music", "kind": "preference"},
    )
    assert edited.status_code == 302
    statuses = dict(MemoryRecord.objects.filter(pk__in=[a, b, c, d]).values_list("pk", "status"))
    assert statuses == {a: "live", b: "live", c: "merged", d: "live"}
    assert MemoryRecord.objects.get(pk=d).content == "Ada likes techno and house"
    assert (
        client.get(reverse("memory-inbox") + "?done=approve&n=2")
        .content.decode()
        .count("Approved 2 memories.")
        == 1
    )
    # A decided proposal is not decided again.
    again = client.post(reverse("memory-inbox-decide"), {"ids": [a], "action": "reject"})
    assert again.status_code == 404
    assert MemoryRecord.objects.get(pk=a).status == "live"


def test_key_review_policy_is_set_by_admins_and_audited(db):
    admin = make_user(role="admin")
    api = make_key()
    client = Client()
    client.force_login(admin)
    response = client.post(reverse("key-review", args=[api.key.pk]), {"memory_review": "proposed"})
    assert response.status_code == 302
    api.key.refresh_from_db()
    assert api.key.memory_review == "proposed"
    event = AuditEvent.objects.get(action="key_review")
    assert event.after == {"prefix": api.key.prefix, "memory_review": "proposed"}
    bad = client.post(reverse("key-review", args=[api.key.pk]), {"memory_review": "maybe"})
    assert bad.status_code == 400
    curator = Client()
    curator.force_login(make_user(role="curator"))
    assert (
        curator.post(
            reverse("key-review", args=[api.key.pk]), {"memory_review": "live"}
        ).status_code
        == 403
    )
    out = StringIO()
    call_command("apikey", "review", api.key.prefix, "live", stdout=out)
    api.key.refresh_from_db()
    assert api.key.memory_review == "live" and "memory_review=live" in out.getvalue()
    call_command("apikey", "create", "bot", "--memory-review", "proposed", stdout=out)
    assert ApiKey.objects.get(name="bot").memory_review == "proposed"


def test_a_near_copy_answers_the_live_memory_by_words(db, settings):
    api = make_key()
    cid = new_context(api)
    first = _record(api, cid, "Ada prefers green tea in the morning")
    near = _record(api, cid, "ada prefers green tea in the morning!")
    assert near["created"] is False and near["near_copy"] == pytest.approx(1.0)
    assert near["memory"]["id"] == first["memory"]["id"]
    assert MemoryRecord.objects.count() == 1
    different = _record(api, cid, "Ada prefers black tea in the evening")
    assert different["created"] is True and different["near_copy"] is None
    negated = _record(api, cid, "Ada does not prefer green tea in the morning")
    assert negated["created"] is True
    settings.AGENTMEMORY_MEMORY_NEAR_COPY_SIMILARITY = 0
    off = _record(api, cid, "ada prefers green tea in the morning!")
    assert off["created"] is True and off["near_copy"] is None


def test_a_near_copy_answers_the_live_memory_by_vectors(db, settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    register_models(**{"near-3": 3})
    api = make_key()
    cid = new_context(api)

    def at(degrees: float) -> list[float]:
        return [math.cos(math.radians(degrees)), math.sin(math.radians(degrees)), 0.0]

    first = _record(api, cid, "Ada likes tea", vector=at(0), vector_model="near-3")
    near = _record(api, cid, "Ada enjoys tea", vector=at(5), vector_model="near-3")
    assert near["created"] is False and near["memory"]["id"] == first["memory"]["id"]
    assert near["near_copy"] == pytest.approx(math.cos(math.radians(5)), abs=1e-4)
    far = _record(api, cid, "Ada enjoys chess", vector=at(60), vector_model="near-3")
    assert far["created"] is True and far["near_copy"] is None
