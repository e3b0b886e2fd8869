"""Long-term memory: scopes, de-duplication, AgentScope-style retrieval, curation with audit."""

import pytest

from memory_app import memories
from memory_app.audit import Actor
from memory_app.errors import Conflict, Invalid, NotFound
from memory_app.memories import Scope
from memory_app.models import AuditEvent, Context, MemoryRecord
from memory_app.queries.memories import memories_retrieve
from memory_app.services.contexts import context_get_or_create
from memory_app.services.memories import (
    memories_merge,
    memories_record,
    memory_edit,
    memory_promote,
    memory_set_archived,
)
from memory_app.services.messages import messages_append
from tests.builders import BACKUP_HEADER, backup_file


@pytest.fixture
def ada_chat(db):
    return context_get_or_create(keys={"user": "ada", "chat": "7"})[0]


@pytest.fixture
def bob(db):
    return context_get_or_create(keys={"user": "bob"})[0]


def record(scope, actor, *contents, **extra):
    return memories_record(
        scope=scope, items=[dict({"content": c}, **extra) for c in contents], actor=actor
    )


def test_key_subset_scope_is_inherited_by_contexts_containing_it(ada_chat, bob, system_actor):
    [r] = record(
        Scope(keys={"user": "ada"}), system_actor, "Ada prefers tea over coffee", kind="preference"
    )
    got = memories_retrieve(context=ada_chat, keywords=["tea"])
    assert [x.record.pk for x in got] == [r.record.pk]
    assert memories_retrieve(context=bob, keywords=["tea"]) == []


def test_context_scope_is_seen_only_by_that_context(ada_chat, system_actor):
    other_chat = context_get_or_create(keys={"user": "ada", "chat": "8"})[0]
    record(Scope(context=ada_chat), system_actor, "Chat 7 is about the Lisbon trip")
    assert len(memories_retrieve(context=ada_chat, keywords=["Lisbon"])) == 1
    assert memories_retrieve(context=other_chat, keywords=["Lisbon"]) == []


def test_same_content_in_same_scope_returns_the_existing_record(ada_chat, system_actor):
    scope = Scope(keys={"user": "ada"})
    [first] = record(scope, system_actor, "Ada lives in Paris")
    again = memories_record(
        scope=scope,
        items=[{"content": "  Ada lives   in Paris "}, {"content": "Ada lives in Paris"}],
        actor=system_actor,
    )
    assert first.created and [a.created for a in again] == [False, False]
    assert {a.record.pk for a in again} == {first.record.pk}
    assert MemoryRecord.objects.filter(content__icontains="Paris").count() == 1
    # Another scope is another memory.
    [other] = record(Scope(context=ada_chat), system_actor, "Ada lives in Paris")
    assert other.created and other.record.pk != first.record.pk


def test_keyword_retrieval_ranks_tagged_then_by_text_rank_with_limit_per_keyword(
    ada_chat, system_actor
):
    scope = Scope(keys={"user": "ada"})
    record(scope, system_actor, "She once mentioned coffee in passing")
    record(scope, system_actor, "Coffee: espresso, coffee beans from Brazil, coffee every morning")
    tagged = record(scope, system_actor, "Drinks two cups before noon", keywords=["coffee"])[
        0
    ].record
    record(scope, system_actor, "Dog named Rex", keywords=["pets"])
    got = memories_retrieve(context=ada_chat, keywords=["coffee"], limit=5)
    assert [g.record.content for g in got] == [
        tagged.content,
        "Coffee: espresso, coffee beans from Brazil, coffee every morning",
        "She once mentioned coffee in passing",
    ]
    assert [g.score for g in got] == sorted((g.score for g in got), reverse=True)
    # limit is per keyword (AgentScope's retrieve_from_memory)
    two = memories_retrieve(context=ada_chat, keywords=["coffee", "pets"], limit=1)
    assert [g.record.content for g in two] == [tagged.content, "Dog named Rex"]


def test_query_retrieval_matches_any_word(ada_chat, system_actor):
    record(
        Scope(keys={"user": "ada"}), system_actor, "Ada is allergic to peanuts", "Ada likes jazz"
    )
    got = memories_retrieve(context=ada_chat, query="what is she allergic to?")
    assert [g.record.content for g in got] == ["Ada is allergic to peanuts"]


def test_edits_are_audited_with_before_and_after(ada_chat, system_actor):
    r = record(Scope(keys={"user": "ada"}), system_actor, "Ada likes tea")[0].record
    memory_edit(record=r, actor=system_actor, content="Ada likes green tea", keywords=["tea"])
    event = AuditEvent.objects.filter(
        action="edit", target_type="memoryrecord", target_ids__contains=[r.pk]
    ).get()
    assert (
        event.before["content"] == "Ada likes tea"
        and event.after["content"] == "Ada likes green tea"
    )
    assert event.after["keywords"] == ["tea"] and event.actor == system_actor.label
    r.refresh_from_db()
    assert r.content_hash == memories.content_hash("Ada likes green tea")


def test_archive_hides_and_restore_brings_back_with_audit(ada_chat, system_actor):
    r = record(Scope(keys={"user": "ada"}), system_actor, "Ada plays chess")[0].record
    memory_set_archived(record=r, archived=True, actor=system_actor)
    assert memories_retrieve(context=ada_chat, keywords=["chess"]) == []
    assert len(memories_retrieve(context=ada_chat, keywords=["chess"], include_archived=True)) == 1
    memory_set_archived(record=r, archived=False, actor=system_actor)
    assert len(memories_retrieve(context=ada_chat, keywords=["chess"])) == 1
    actions = list(
        AuditEvent.objects.filter(
            target_type="memoryrecord", target_ids__contains=[r.pk]
        ).values_list("action", flat=True)
    )
    assert sorted(actions) == ["archive", "record", "restore"]


def test_editing_into_existing_content_of_the_scope_conflicts(ada_chat, system_actor):
    scope = Scope(keys={"user": "ada"})
    a, b = (x.record for x in record(scope, system_actor, "fact one", "fact two"))
    with pytest.raises(Conflict):
        memory_edit(record=b, actor=system_actor, content="fact one")


def test_provenance_must_come_from_the_scope(ada_chat, bob, system_actor):
    [mine] = messages_append(
        context=ada_chat, items=[{"role": "user", "text": "I love tea"}]
    ).messages
    [theirs] = messages_append(context=bob, items=[{"role": "user", "text": "secret"}]).messages
    [r] = record(
        Scope(keys={"user": "ada"}), system_actor, "Ada loves tea", source_message_id=mine.pk
    )
    assert r.record.source_message_id == mine.pk
    with pytest.raises(NotFound):
        record(Scope(keys={"user": "ada"}), system_actor, "stolen", source_message_id=theirs.pk)


@pytest.mark.parametrize(
    "items",
    [
        [],
        [{"content": ""}],
        [{"content": "x", "kind": "opinion"}],
        [{"content": "x", "keywords": "tea"}],
    ],
)
def test_bad_records_are_invalid(ada_chat, system_actor, items):
    with pytest.raises(Invalid):
        memories_record(scope=Scope(context=ada_chat), items=items, actor=system_actor)


def test_retrieve_needs_keywords_or_query(ada_chat):
    with pytest.raises(Invalid):
        memories_retrieve(context=ada_chat)


# --- over HTTP ---------------------------------------------------------------------------------


def test_memories_api_record_retrieve_edit_archive_restore(db):
    from tests.api_helpers import make_key, new_context

    api = make_key(scopes=["read", "write"], context_keys={"user": "ada"})
    chat = new_context(api, {"user": "ada", "chat": "7"})
    recorded = api.post(
        "/api/v1/memories",
        {
            "context_id": chat,
            "scope_keys": {"user": "ada"},
            "thinking": "keep",
            "contents": ["Ada prefers tea", "Ada lives in Paris"],
            "keywords": ["ada"],
        },
    )
    assert recorded.status_code == 201, recorded.content
    first = recorded.json()["items"][0]["memory"]
    assert (
        first["scope_keys"] == {"user": "ada"}
        and first["thinking"] == "keep"
        and first["context_id"] is None
    )
    again = api.post(
        "/api/v1/memories", {"scope_keys": {"user": "ada"}, "content": "Ada prefers tea"}
    )
    assert again.status_code == 200 and again.json()["items"][0] == {
        "memory": first,
        "created": False,
        "near_copy": None,
    }

    other_chat = new_context(api, {"user": "ada", "chat": "8"})
    got = api.post("/api/v1/memories/retrieve", {"context_id": other_chat, "keywords": ["tea"]})
    assert got.status_code == 200 and [i["content"] for i in got.json()["items"]] == [
        "Ada prefers tea"
    ]

    edited = api.patch(f"/api/v1/memories/{first['id']}", {"content": "Ada prefers green tea"})
    assert edited.status_code == 200 and edited.json()["content"] == "Ada prefers green tea"
    assert api.post(f"/api/v1/memories/{first['id']}/archive").json()["archived_at"]
    assert (
        api.post("/api/v1/memories/retrieve", {"context_id": chat, "keywords": ["tea"]}).json()[
            "items"
        ]
        == []
    )
    assert api.post(f"/api/v1/memories/{first['id']}/restore").json()["archived_at"] is None
    assert api.get(f"/api/v1/memories/{first['id']}").json()["content"] == "Ada prefers green tea"
    assert (
        AuditEvent.objects.filter(
            target_type="memoryrecord", target_ids__contains=[first["id"]]
        ).count()
        == 4
    )


def test_memories_api_confines_keys_to_their_tenant(db):
    from tests.api_helpers import make_key, new_context

    ada = make_key(scopes=["read", "write"], context_keys={"user": "ada"})
    bob = make_key(scopes=["read", "write"], context_keys={"user": "bob"})
    new_context(ada, {"user": "ada", "chat": "1"})
    memory = ada.post(
        "/api/v1/memories", {"scope_keys": {"user": "ada"}, "content": "private"}
    ).json()["items"][0]["memory"]
    assert bob.get(f"/api/v1/memories/{memory['id']}").status_code == 404
    assert (
        bob.post("/api/v1/memories", {"scope_keys": {"user": "ada"}, "content": "x"}).status_code
        == 403
    )
    assert bob.post("/api/v1/memories", {"content": "no scope"}).status_code == 422


def test_an_empty_key_subset_is_refused_and_never_reaches_a_confined_tenant(db, system_actor):
    """scope_keys={} is contained in every context's keys: recording it is refused (422, nothing
    written), and a record already stored that way is seen by no context."""
    from tests.api_helpers import make_key, new_context

    admin = make_key(scopes=["read", "write", "admin"])
    acme = make_key(scopes=["read", "write"], context_keys={"tenant": "acme"})
    acme_ctx = new_context(acme, {"tenant": "acme", "user": "ada"})
    before = MemoryRecord.objects.count()
    response = admin.post("/api/v1/memories", {"scope_keys": {}, "content": "global instruction"})
    assert response.status_code == 422, response.content
    assert "scope_keys" in response.json()["detail"]
    with pytest.raises(Invalid):
        record(Scope(keys={}), system_actor, "global instruction")
    assert MemoryRecord.objects.count() == before
    # A record stored with {} before this fix (or by a backup) stays invisible everywhere.
    MemoryRecord.objects.create(
        scope_keys={},
        scope_digest="legacy-empty",
        content="global instruction",
        content_hash=memories.content_hash("global instruction"),
    )
    for client in (acme, admin):
        found = client.post(
            "/api/v1/memories/retrieve",
            {"context_id": acme_ctx, "keywords": ["instruction"], "query": "global instruction"},
        )
        assert found.status_code == 200, found.content
        assert found.json()["items"] == []


def test_a_confined_key_recalls_only_records_inside_its_confinement(db):
    """The operator's record for {"user": "ada"} matches acme's ada context, but acme's key cannot
    read it (GET answers 404), so retrieval through that key leaves it out too."""
    from tests.api_helpers import make_key, new_context

    admin = make_key(scopes=["read", "write", "admin"])
    acme = make_key(scopes=["read", "write"], context_keys={"tenant": "acme"})
    ctx = new_context(acme, {"tenant": "acme", "user": "ada"})
    outside = admin.post(
        "/api/v1/memories", {"scope_keys": {"user": "ada"}, "content": "Ada's tea order"}
    ).json()["items"][0]["memory"]
    inside = acme.post(
        "/api/v1/memories",
        {"scope_keys": {"tenant": "acme", "user": "ada"}, "content": "Ada's tea budget"},
    ).json()["items"][0]["memory"]
    assert acme.get(f"/api/v1/memories/{outside['id']}").status_code == 404

    def recalled(client):
        body = {"context_id": ctx, "keywords": ["tea"]}
        return {i["id"] for i in client.post("/api/v1/memories/retrieve", body).json()["items"]}

    assert recalled(acme) == {inside["id"]}
    assert recalled(admin) == {inside["id"], outside["id"]}


def test_dashboard_promote_and_api_record_of_the_same_content_in_one_scope_are_one_record(db):
    """The dashboard (promote a message) and an agent (POST /memories with context_id) share one
    scope digest and content hash: whichever comes first, the other finds the same record."""
    from django.test import Client
    from django.urls import reverse

    from tests.api_helpers import make_key, new_context
    from tests.builders import make_user

    api = make_key(scopes=["read", "write"], context_keys={"user": "ada"})
    chat = new_context(api, {"user": "ada", "chat": "7"})
    context = Context.objects.get(pk=chat)
    first, second = messages_append(
        context=context,
        items=[
            {"role": "user", "text": "I take my coffee black"},
            {"role": "user", "text": "I fly out of Lisbon"},
        ],
    ).messages
    curator = Client()
    curator.force_login(make_user(role="curator"))

    # Dashboard first, then the agent records the same text (with other whitespace).
    curator.post(reverse("memory-promote-message", args=[first.pk]))
    promoted = MemoryRecord.objects.get(source_message=first)
    again = api.post(
        "/api/v1/memories", {"context_id": chat, "content": " I take my  coffee black"}
    )
    assert again.status_code == 200, again.content
    assert again.json()["items"][0]["created"] is False
    assert again.json()["items"][0]["memory"]["id"] == promoted.pk

    # The agent first, then the dashboard promotes a message with that text.
    recorded = api.post("/api/v1/memories", {"context_id": chat, "content": "I fly out of Lisbon"})
    assert recorded.status_code == 201, recorded.content
    result = memory_promote(actor=Actor.system("t"), message=second)
    assert (
        result.created is False and result.record.pk == recorded.json()["items"][0]["memory"]["id"]
    )
    assert MemoryRecord.objects.filter(context=context).count() == 2


def test_promote_and_merge_keep_provenance_and_an_audit(ada_chat, system_actor):
    [message] = messages_append(
        context=ada_chat, items=[{"role": "user", "text": "Ada likes tea"}]
    ).messages
    promoted = memory_promote(actor=system_actor, message=message, kind="preference")
    assert promoted.created and promoted.record.source_message_id == message.pk
    assert promoted.record.kind == "preference" and promoted.record.scope_keys == ada_chat.keys
    [other] = record(Scope(context=ada_chat), system_actor, "Ada drinks tea", keywords=["tea"])
    kept = memories_merge(keep_id=promoted.record.pk, ids=[other.record.pk], actor=system_actor)
    other.record.refresh_from_db()
    assert kept.keywords == ["tea"] and other.record.archived_at is not None
    assert other.record.metadata["merged_into"] == kept.pk
    event = AuditEvent.objects.get(action="memory_merge")
    assert set(event.target_ids) == {kept.pk, other.record.pk}
    assert event.before[str(other.record.pk)]["content"] == "Ada drinks tea"
    with pytest.raises(Invalid):
        memory_promote(actor=system_actor, message=message, step=None, kind="opinion")


def test_a_confined_key_exports_only_the_memories_it_may_recall(db):
    """GET /export answers a confined read key's contexts: their memory records must be the ones
    that key recalls, not every key subset the context's keys contain (an empty legacy subset and
    the operator's record for {"user": "ada"} stayed in the backup)."""
    import json

    from tests.api_helpers import make_key, new_context

    admin = make_key(scopes=["read", "write", "admin"])
    acme = make_key(scopes=["read", "write"], context_keys={"tenant": "acme"})
    ctx = new_context(acme, {"tenant": "acme", "user": "ada"})
    admin.post("/api/v1/memories", {"scope_keys": {"user": "ada"}, "content": "Ada's tea order"})
    acme.post(
        "/api/v1/memories",
        {"scope_keys": {"tenant": "acme", "user": "ada"}, "content": "Ada's tea budget"},
    )
    acme.post("/api/v1/memories", {"context_id": ctx, "content": "This chat is about tea"})
    MemoryRecord.objects.create(
        scope_keys={},
        scope_digest="legacy-empty",
        content="global instruction",
        content_hash=memories.content_hash("global instruction"),
    )

    def exported(client):
        response = client.get("/api/v1/export", {"context_id": ctx})
        assert response.status_code == 200
        lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
        return {r["content"] for r in lines if r["type"] == "memory"}

    assert exported(acme) == {"Ada's tea budget", "This chat is about tea"}
    # An unconfined key's backup stays whole (the legacy record included, invisible as it is).
    assert exported(admin) == {
        "Ada's tea order",
        "Ada's tea budget",
        "This chat is about tea",
        "global instruction",
    }


def test_a_confined_admin_key_cannot_import_memories_outside_its_confinement(db):
    """The import takes a memory record's scope as written: a confined key could place a record in
    another tenant's key subset (or the empty one) that POST /memories refuses it (403)."""

    from tests.api_helpers import make_key

    acme = make_key(scopes=["read", "write", "admin"], context_keys={"tenant": "acme"})
    header = {**BACKUP_HEADER, "embeddings": False}

    def memory(scope_keys, content):
        return {
            "type": "memory",
            "context": None,
            "scope_keys": scope_keys,
            "scope_digest": memories.keys_digest(scope_keys),
            "content": content,
            "content_hash": memories.content_hash(content),
            "kind": "fact",
            "created_at": "2026-11-20T10:00:00+00:00",
            "updated_at": "2026-11-20T10:00:00+00:00",
        }

    def imported(*records):
        return acme.post("/api/v1/import", raw=backup_file([header, *records]))

    for scope in ({"user": "ada"}, {}, {"tenant": "beta", "user": "ada"}):
        response = imported(memory({"tenant": "acme"}, "fine"), memory(scope, "planted"))
        assert response.status_code == 403, (scope, response.content)
        assert not MemoryRecord.objects.filter(content__in=["fine", "planted"]).exists()
    response = imported(memory({"tenant": "acme", "user": "ada"}, "Ada's tea budget"))
    assert response.status_code == 200, response.content
    assert MemoryRecord.objects.get(content="Ada's tea budget").scope_keys == {
        "tenant": "acme",
        "user": "ada",
    }


def test_a_confined_admin_key_cannot_import_into_another_tenants_context(db):
    """Backup lines name their context by digest: a line may refer to a context already stored
    instead of one defined in the file, and a context line's digest was taken as written. Either
    way a key confined to acme wrote into beta's context. Lines reach only the contexts the file
    defines, so beta's digest fails like an unknown one (422, not a 403 that would tell acme beta's
    context exists), and a disguised context line is refused; nothing is written."""

    from memory_app.models import keys_digest
    from tests.api_helpers import make_key, new_context

    admin = make_key(scopes=["read", "write", "admin"])
    beta_ctx = Context.objects.get(pk=new_context(admin, {"tenant": "beta", "user": "bo"}))
    acme = make_key(scopes=["read", "write", "admin"], context_keys={"tenant": "acme"})
    header = {**BACKUP_HEADER, "embeddings": False}
    stamp = {"created_at": "2026-11-20T10:00:00+00:00", "updated_at": "2026-11-20T10:00:00+00:00"}
    acme_keys = {"tenant": "acme", "user": "ann"}
    message = {
        "type": "message",
        "context": beta_ctx.keys_digest,
        "seq": 99,
        "role": "user",
        "text": "planted",
        "content": None,
        "tags": [],
        "metadata": {},
        **stamp,
    }
    memory = {
        "type": "memory",
        "context": beta_ctx.keys_digest,
        "scope_keys": beta_ctx.keys,
        "scope_digest": keys_digest({"__context__": beta_ctx.keys_digest}),
        "content": "planted",
        "content_hash": memories.content_hash("planted"),
        "kind": "fact",
        **stamp,
    }
    disguised = {  # acme's keys, beta's digest: looked up by digest, it is beta's context
        "type": "context",
        "digest": beta_ctx.keys_digest,
        "keys": acme_keys,
        "keys_digest": beta_ctx.keys_digest,
        "title": "",
        "metadata": {},
        **stamp,
    }

    def imported(*records):
        return acme.post("/api/v1/import", raw=backup_file([header, *records]))

    assert imported(message).status_code == 422
    assert imported(memory).status_code == 422
    assert imported(disguised, {**message, "seq": 98}).status_code == 422
    assert not beta_ctx.messages.exists()
    assert not MemoryRecord.objects.filter(content="planted").exists()
    assert not Context.objects.filter(keys=acme_keys).exists()
    assert not Context.objects.filter(keys_digest=keys_digest(acme_keys)).exists()
    # A backup of acme's own context still goes back in (as it is stored: all skipped).
    own = new_context(acme, acme_keys)
    acme.post(f"/api/v1/contexts/{own}/messages", {"role": "user", "text": "hello"})
    acme.post("/api/v1/memories", {"context_id": own, "content": "Ann likes maps"})
    backup_lines = b"".join(acme.get("/api/v1/export", {"context_id": own}).streaming_content)
    response = acme.post("/api/v1/import", raw=backup_lines.decode())
    assert response.status_code == 200, response.content
    assert response.json()["skipped"] == {
        "contexts": 1,
        "messages": 1,
        "memories": 1,
        "memory_versions": 1,
    }
