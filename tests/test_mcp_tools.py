"""The MCP tools that find contexts, look after long-term memories and page a long run within a
token budget, over the live ASGI site: confined to the key's tenant, audited, nothing created or
erased that the call did not ask for."""

from __future__ import annotations

import pytest

from memory_app import audit, auth, memories
from memory_app.models import AuditEvent, Context, MemoryRecord
from memory_app.services.memories import memories_record
from memory_app.tokens import count_tokens
from tests.builders import make_context, make_run
from tests.test_mcp import Session, _secret

pytestmark = pytest.mark.django_db(transaction=True)


def _remember(content, **scope):
    [recorded] = memories_record(
        scope=memories.Scope(**scope), items=[{"content": content}], actor=audit.Actor.system("t")
    )
    return recorded.record


# --- finding contexts ---------------------------------------------------------------------------


def test_a_read_only_key_finds_contexts_by_exact_keys_and_by_subset(asgi_live_server):
    first = make_context(keys={"user": "ada", "chat": "1"})
    second = make_context(keys={"user": "ada", "chat": "2"})
    make_context(keys={"user": "bob", "chat": "1"})
    reader = Session(asgi_live_server, _secret(scopes=("read",)))

    exact = reader.ok("find_contexts", keys={"chat": "2", "user": "ada"}, exact=True)
    assert [c["id"] for c in exact["items"]] == [second.pk] and exact["has_more"] is False
    # Keys that only contain an existing context's keys name no context; nothing is created.
    assert reader.ok("find_contexts", keys={"user": "ada"}, exact=True)["items"] == []
    assert Context.objects.count() == 3

    page = reader.ok("find_contexts", keys={"user": "ada"}, limit=1)
    assert [c["id"] for c in page["items"]] == [first.pk] and page["has_more"] is True
    rest = reader.ok("find_contexts", keys={"user": "ada"}, after=page["next_cursor"])
    assert [c["id"] for c in rest["items"]] == [second.pk] and rest["has_more"] is False
    assert len(reader.ok("find_contexts")["items"]) == 3
    assert "exact needs keys" in reader.error("find_contexts", exact=True)


def test_find_contexts_lists_only_the_keys_tenant(asgi_live_server):
    mine = make_context(keys={"tenant": "acme", "user": "ada"})
    theirs = make_context(keys={"tenant": "globex", "user": "ada"})
    acme = Session(asgi_live_server, _secret(scopes=("read",), context_keys={"tenant": "acme"}))
    assert [c["id"] for c in acme.ok("find_contexts", keys={"user": "ada"})["items"]] == [mine.pk]
    assert [c["id"] for c in acme.ok("find_contexts")["items"]] == [mine.pk]
    assert acme.ok("find_contexts", keys=theirs.keys, exact=True)["items"] == []


# --- long-term memories: list, correct, delete --------------------------------------------------


def test_memories_listed_by_context_by_key_subset_and_all(asgi_live_server):
    ada = make_context(keys={"user": "ada", "chat": "1"})
    bob = make_context(keys={"user": "bob", "chat": "1"})
    own = _remember("Ada's chat 1 is about trains", context=ada)
    shared = _remember("Ada likes tea", keys={"user": "ada"})
    other = _remember("Bob likes coffee", context=bob)
    mcp = Session(asgi_live_server, _secret())

    def ids(**arguments):
        return [m["id"] for m in mcp.ok("list_memories", **arguments)["items"]]

    assert ids(context_id=ada.pk) == [own.pk, shared.pk]
    assert ids(scope_keys={"user": "ada"}) == [own.pk, shared.pk]
    assert ids() == [own.pk, shared.pk, other.pk]
    first = mcp.ok("list_memories", limit=2)
    assert first["has_more"] is True
    assert ids(after=first["next_cursor"]) == [other.pk]
    assert "not both" in mcp.error("list_memories", context_id=ada.pk, scope_keys={"user": "ada"})


def test_a_memory_is_corrected_and_its_previous_version_kept(asgi_live_server):
    context = make_context(keys={"user": "ada"})
    record = _remember("Ada lives in Lyon", context=context)
    _remember("Ada lives in Paris", keys={"user": "ada"})
    mcp = Session(asgi_live_server, _secret())

    fixed = mcp.ok(
        "correct_memory", memory_id=record.pk, content="Ada lives in Nice", note="moved"
    )["memory"]
    assert (fixed["content"], fixed["kind"]) == ("Ada lives in Nice", "fact")
    event = AuditEvent.objects.filter(action="edit", target_ids__contains=[record.pk]).get()
    assert event.before["content"] == "Ada lives in Lyon" and event.note == "moved"
    assert event.actor.startswith("key:")

    second = _remember("Ada has a cat", context=context)
    text = mcp.error("correct_memory", memory_id=second.pk, content="Ada lives in Nice")
    assert "already has this content" in text
    assert MemoryRecord.objects.get(pk=second.pk).content == "Ada has a cat"
    assert "kind" in mcp.error("correct_memory", memory_id=record.pk, kind="gossip")


def test_deleting_archives_and_purging_needs_admin(asgi_live_server):
    context = make_context(keys={"user": "ada"})
    record = _remember("Ada is 30", context=context)
    writer = Session(asgi_live_server, _secret())

    archived = writer.ok("delete_memory", memory_id=record.pk, note="outdated")
    assert archived["deleted"] == "archived" and archived["memory"]["archived_at"]
    assert writer.ok("list_memories", context_id=context.pk)["items"] == []
    listed = writer.ok("list_memories", context_id=context.pk, include_archived=True)
    assert [m["id"] for m in listed["items"]] == [record.pk]
    assert writer.ok("retrieve_memories", context_id=context.pk, query="Ada")["items"] == []

    assert "'admin' scope" in writer.error("delete_memory", memory_id=record.pk, purge=True)
    assert MemoryRecord.objects.filter(pk=record.pk).exists()

    admin = Session(asgi_live_server, _secret(scopes=("admin",)))
    purged = admin.ok("delete_memory", memory_id=record.pk, purge=True)
    assert purged["deleted"] == "purged" and purged["audit_event_id"]
    assert not MemoryRecord.objects.filter(pk=record.pk).exists()
    assert f"memory {record.pk} not found" in admin.error("delete_memory", memory_id=record.pk)


def test_another_tenants_memories_look_unknown(asgi_live_server):
    mine = make_context(keys={"tenant": "acme", "user": "ada"})
    theirs = make_context(keys={"tenant": "globex", "user": "ada"})
    my_record = _remember("acme fact", context=mine)
    their_record = _remember("globex fact", context=theirs)
    their_shared = _remember("globex shared", keys={"tenant": "globex"})
    loose = _remember("every ada", keys={"user": "ada"})
    acme = Session(
        asgi_live_server,
        _secret(scopes=("read", "write", "admin"), context_keys={"tenant": "acme"}),
    )

    assert [m["id"] for m in acme.ok("list_memories")["items"]] == [my_record.pk]
    assert [m["id"] for m in acme.ok("list_memories", context_id=mine.pk)["items"]] == [
        my_record.pk
    ]
    assert acme.ok("list_memories", scope_keys={"tenant": "globex"})["items"] == []
    assert f"context {theirs.pk} not found" in acme.error("list_memories", context_id=theirs.pk)
    for record in (their_record, their_shared, loose):
        for tool, arguments in [
            ("correct_memory", {"content": "sneaky"}),
            ("delete_memory", {}),
            ("delete_memory", {"purge": True}),
        ]:
            text = acme.error(tool, memory_id=record.pk, **arguments)
            assert f"memory {record.pk} not found" in text
    for record in (their_record, their_shared, loose):
        kept = MemoryRecord.objects.get(pk=record.pk)
        assert kept.archived_at is None and "sneaky" not in kept.content


# --- a long run, a page within the budget at a time ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("max_tokens", [None, 3000])
def test_a_long_run_is_read_in_pages_within_the_token_budget(asgi_live_server, max_tokens):
    run = make_run(context=make_context(), steps=300)
    mcp = Session(asgi_live_server, _secret())
    budget = max_tokens or 8000
    budgeted = {} if max_tokens is None else {"max_tokens": max_tokens}

    positions, after, pages = [], None, 0
    while True:
        result = mcp.call("read_run", run_id=run.pk, steps_after=after, **budgeted)
        assert not result.isError, result.content[0].text
        text = result.content[0].text
        assert "\n" not in text and '": ' not in text  # compact JSON
        assert count_tokens([text])[0] <= budget
        steps = result.structuredContent["steps"]
        positions += [s["position"] for s in steps["items"]]
        pages += 1
        if not steps["has_more"]:
            break
        after = steps["next_cursor"]
        assert after == positions[-1]
    assert positions == list(range(1, 301))  # every step, once, in order
    assert pages > 1
    run_steps = {s.position: s for s in run.steps.all()}
    assert set(run_steps) == set(positions)


def test_a_step_larger_than_the_budget_comes_alone(asgi_live_server):
    run = make_run(context=make_context(), steps=3, observations="word " * 3000)
    mcp = Session(asgi_live_server, _secret())
    first = mcp.ok("read_run", run_id=run.pk, max_tokens=1000)
    assert [s["position"] for s in first["steps"]["items"]] == [1]
    second = mcp.ok("read_run", run_id=run.pk, max_tokens=1000, steps_after=1)
    assert [s["position"] for s in second["steps"]["items"]] == [2]
    assert second["steps"]["has_more"] is True and second["steps"]["next_cursor"] == 2
    assert "max_tokens" in mcp.error("read_run", run_id=run.pk, max_tokens=10)


def test_auth_key_scopes_hold_for_the_new_tools(asgi_live_server):
    context = make_context()
    record = _remember("x", context=context)
    reader = Session(asgi_live_server, auth.apikey_create(name="r", scopes=["read"]).secret)
    assert "'write' scope" in reader.error("correct_memory", memory_id=record.pk, content="y")
    assert "'write' scope" in reader.error("delete_memory", memory_id=record.pk)
    assert MemoryRecord.objects.get(pk=record.pk).content == "x"
    writer = Session(asgi_live_server, auth.apikey_create(name="w", scopes=["write"]).secret)
    assert "'read' scope" in writer.error("list_memories")
    assert "'read' scope" in writer.error("find_contexts")
