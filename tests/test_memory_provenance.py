"""Memory provenance: what produced a memory (message, step, run of one context) as the agent
names it, checked against what its key may see; who recorded it (API key, dashboard user,
import) as the server saw the request; the dashboard shows it in place and a step lists the
memories it produced; the migration's backfill from the audit trail."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from memory_app.audit import Actor
from memory_app.backup.export import export_lines
from memory_app.backup.restore import import_lines
from memory_app.errors import NotFound
from memory_app.memories import Scope
from memory_app.models import Context, MemoryRecord, MemoryVersion, Message, Step
from memory_app.services.memories import memories_record
from memory_app.services.messages import messages_append
from tests.api_helpers import append, make_key, new_context
from tests.builders import make_context, make_run, make_user, without_their_context
from tests.test_mcp import Session, _secret

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent():
    """A key confined to tenant acme, its context with a run, and another tenant's run."""
    api = make_key(context_keys={"tenant": "acme"}, name="scribe")
    cid = new_context(api, {"tenant": "acme", "user": "ada"})
    context = Context.objects.get(pk=cid)
    run = make_run(context=context, steps=3)
    other = make_run(context=make_context(keys={"tenant": "globex", "user": "bob"}), steps=2)
    return api, context, run, other


def _step(run, position: int) -> Step:
    return Step.objects.get(run=run, position=position)


def _record(api, **body):
    return api.post("/api/v1/memories", {"content": "Ada prefers tea", **body})


def test_an_agent_names_the_step_it_derived_a_memory_from_and_the_server_names_the_key(agent):
    api, context, run, _ = agent
    step = _step(run, 2)
    response = _record(api, context_id=context.pk, source_step_id=step.pk, origin="user")
    assert response.status_code == 201, response.content
    memory = response.json()["items"][0]["memory"]
    # The step's run is the source run; the key is the server's, whatever the body says.
    assert memory["source_step_id"] == step.pk and memory["source_run_id"] == run.pk
    assert memory["origin"] == "api_key"
    record = MemoryRecord.objects.get(pk=memory["id"])
    assert record.source_api_key_id == api.key.pk and record.source_user_id is None
    assert api.get(f"/api/v1/memories/{record.pk}").json()["source_run_id"] == run.pk


def test_a_message_and_its_run_and_a_run_alone_are_sources(agent):
    api, context, run, _ = agent
    message = append(api, context.pk, text="I like tea", run_id=run.pk)
    with_message = _record(api, context_id=context.pk, source_message_id=message["id"]).json()
    assert with_message["items"][0]["memory"]["source_run_id"] == run.pk
    run_only = _record(api, context_id=context.pk, content="Ada reads", source_run_id=run.pk)
    assert run_only.status_code == 201
    assert run_only.json()["items"][0]["memory"]["source_run_id"] == run.pk


@pytest.mark.parametrize(
    "source, status, words",
    [
        ({"source_step_id": "other"}, 404, "step"),
        ({"source_run_id": "other"}, 404, "run"),
        ({"source_run_id": 987_654}, 404, "run"),
        ({"source_step_id": 987_654}, 404, "step"),
        ({"source_message_id": 987_654}, 404, "message"),
        ({"source_step_id": "mine", "source_run_id": "second"}, 422, "not a step of run"),
        ({"source_message_id": "elsewhere", "source_run_id": "mine"}, 422, "one context"),
    ],
)
def test_sources_must_exist_be_visible_and_be_of_one_context(agent, source, status, words):
    api, context, run, other = agent
    second = make_run(context=context, steps=2, task="second")
    elsewhere_cid = new_context(api, {"tenant": "acme", "user": "eve"})
    elsewhere = append(api, elsewhere_cid, text="hello")
    values = {
        "other": {"source_step_id": _step(other, 2).pk, "source_run_id": other.pk},
        "mine": {"source_step_id": _step(run, 2).pk, "source_run_id": run.pk},
        "second": {"source_run_id": second.pk},
        "elsewhere": {"source_message_id": elsewhere["id"]},
    }
    body = {k: (values[v][k] if isinstance(v, str) else v) for k, v in source.items()}
    # A key-subset scope covers both of the tenant's contexts: only "one context" refuses.
    scope = {"scope_keys": {"tenant": "acme"}} if "elsewhere" in source.values() else {}
    before = MemoryRecord.objects.count()
    response = _record(api, **({"context_id": context.pk} | scope | body))
    assert response.status_code == status, response.content
    assert words in response.json()["detail"]
    assert MemoryRecord.objects.count() == before


def test_a_context_scopes_sources_are_read_in_that_context(agent):
    """A memory of one context names its message, step and run: each is read in that context
    (on Citus, its shard alone), where they went by id alone; one of another context is not
    found there."""
    _api, context, run, other = agent
    step = _step(run, 2)
    [message] = messages_append(
        context=context, items=[{"role": "user", "text": "tea", "run_id": run.pk}]
    ).messages
    sources = {"source_message_id": message.pk, "source_step_id": step.pk, "source_run_id": run.pk}
    with CaptureQueriesContext(connection) as queries:
        [recorded] = memories_record(
            scope=Scope(context=context),
            items=[{"content": "Ada drinks tea", **sources}],
            actor=Actor.system("test"),
        )
    statements = [q["sql"] for q in queries.captured_queries]
    assert all(any(f'"memory_app_{t}"' in s for s in statements) for t in ("message", "step"))
    assert without_their_context(statements) == []
    assert (recorded.record.source_step_id, recorded.record.source_run_id) == (step.pk, run.pk)
    with pytest.raises(NotFound, match=f"step {_step(other, 2).pk} not found"):
        memories_record(
            scope=Scope(context=context),
            items=[{"content": "Ada naps", "source_step_id": _step(other, 2).pk}],
            actor=Actor.system("test"),
        )


@pytest.mark.django_db(transaction=True)
def test_mcp_record_memory_takes_a_step_and_run(asgi_live_server):
    context = make_context(keys={"tenant": "acme", "user": "ada"})
    run = make_run(context=context, steps=2)
    other = make_run(context=make_context(keys={"tenant": "globex"}), steps=2)
    mcp = Session(asgi_live_server, _secret(context_keys={"tenant": "acme"}))
    step = _step(run, 2)
    [item] = mcp.ok(
        "record_memory",
        context_id=context.pk,
        content="Ada sails",
        source_step_id=step.pk,
        source_run_id=run.pk,
    )["items"]
    memory = item["memory"]
    assert (memory["source_step_id"], memory["source_run_id"], memory["origin"]) == (
        step.pk,
        run.pk,
        "api_key",
    )
    refused = mcp.error(
        "record_memory", context_id=context.pk, content="Ada naps", source_run_id=other.pk
    )
    assert f"run {other.pk} not found" in refused
    assert not MemoryRecord.objects.filter(content="Ada naps").exists()


def test_the_dashboard_and_an_import_record_their_own_provenance(agent, tmp_path):
    api, context, run, _ = agent
    curator = make_user(role="curator")
    browser = Client()
    browser.force_login(curator)
    step = _step(run, 2)
    response = browser.post(reverse("memory-promote-step", args=[step.pk]), {"kind": "fact"})
    assert response.status_code == 302
    promoted = MemoryRecord.objects.get(source_step=step)
    assert (promoted.origin, promoted.source_user_id, promoted.source_run_id) == (
        "user",
        curator.pk,
        run.pk,
    )
    assert promoted.source_api_key_id is None

    # An import's memories are the import's, whatever the file says of them.
    lines = list(export_lines(contexts=Context.objects.filter(pk=context.pk), memory_versions=True))
    MemoryRecord.objects.all().delete()
    result = import_lines(iter(lines), actor=Actor.for_user(curator))
    assert result.created["memories"] == 1
    imported = MemoryRecord.objects.get()
    assert imported.origin == "import" and imported.source_user_id == curator.pk
    assert imported.source_step_id == step.pk and imported.source_run_id == run.pk
    # Its history comes along (the promotion), then the import's own version; both say the
    # importer made them, as the file's word for who did is not taken.
    versions = MemoryVersion.objects.filter(memory=imported).order_by("version")
    assert list(versions.values_list("version", "action", "actor", "user")) == [
        (1, "promote", f"user:{curator.get_username()}", curator.pk),
        (2, "import", f"user:{curator.get_username()}", curator.pk),
    ]


def test_the_memory_page_shows_the_source_one_click_from_the_step_and_the_step_lists_it(agent):
    api, context, run, _ = agent
    step = _step(run, 2)
    memory = _record(api, context_id=context.pk, source_step_id=step.pk).json()["items"][0]
    viewer = Client()
    viewer.force_login(make_user(role="curator"))
    page = viewer.get(reverse("memories") + f"?id={memory['memory']['id']}").content.decode()
    step_url = reverse("run-step", args=[run.pk, step.position])
    assert f'href="{step_url}"' in page
    assert "API key <a" in page and "scribe" in page
    logbook = viewer.get(step_url).content.decode()
    assert "Memories from this step" in logbook
    assert f"?id={memory['memory']['id']}" in logbook and "Ada prefers tea" in logbook
    # Another step produced nothing.
    assert (
        "Memories from this step"
        not in viewer.get(reverse("run-step", args=[run.pk, 3])).content.decode()
    )


def test_the_memory_page_links_a_message_source_and_a_run_source_and_names_each_origin(
    agent, tmp_path
):
    api, context, run, _ = agent
    message = append(api, context.pk, text="I like tea")
    from_message = _record(api, context_id=context.pk, source_message_id=message["id"])
    from_run = _record(api, context_id=context.pk, content="Ada reads", source_run_id=run.pk)
    curator = make_user(role="curator", username="cura")
    [by_user] = memories_record(
        scope=Scope(context=context),
        items=[{"content": "Ada sails"}],
        actor=Actor.for_user(curator),
    )
    viewer = Client()
    viewer.force_login(curator)

    def source_of(pk: int) -> str:
        page = viewer.get(reverse("memories") + f"?id={pk}").content.decode()
        start = page.index(f'data-memory-source="{pk}"')
        return page[start : page.index("</p>", start)]

    seq = Message.objects.get(pk=message["id"]).seq
    shown = source_of(from_message.json()["items"][0]["memory"]["id"])
    assert f'href="{reverse("context", args=[context.pk])}?pruned=1&seq={seq}#m-{seq}"' in shown
    assert "API key" in shown and "scribe" in shown
    shown = source_of(from_run.json()["items"][0]["memory"]["id"])
    assert f'href="{reverse("run", args=[run.pk])}"' in shown and "message #" not in shown
    shown = source_of(by_user.record.pk)
    assert "no recorded source" in shown and "cura in the dashboard" in shown
    lines = list(export_lines(contexts=Context.objects.filter(pk=context.pk)))
    MemoryRecord.objects.all().delete()
    import_lines(iter(lines), actor=Actor.for_user(curator))
    imported = MemoryRecord.objects.get(content="Ada sails")
    assert "an import by user:cura" in source_of(imported.pk)


def test_the_migration_backfills_provenance_from_the_audit_trail(agent):
    api, context, run, _ = agent
    step = _step(run, 2)
    by_key = _record(api, context_id=context.pk, source_step_id=step.pk).json()["items"][0]
    curator = make_user(role="curator")
    [by_user] = memories_record(
        scope=Scope(context=context),
        items=[{"content": "Ada sails"}],
        actor=Actor.for_user(curator),
    )
    message = Message.objects.get(pk=append(api, context.pk, text="x")["id"])
    orphan = MemoryRecord.objects.create(
        context=context,
        scope_keys=context.keys,
        scope_digest="d" * 64,
        content="written by hand",
        content_hash="h" * 64,
        source_message=message,
        recorded_by="someone",
    )
    # As before the migration: no provenance, no versions.
    MemoryRecord.objects.update(
        origin="unknown", source_api_key=None, source_user=None, source_run=None
    )
    MemoryVersion.objects.all().delete()
    migration = importlib.import_module("memory_app.migrations.0027_memory_provenance_history")
    with connection.cursor() as cursor:
        for sql in migration.BACKFILL:
            cursor.execute(sql)
    key_made = MemoryRecord.objects.get(pk=by_key["memory"]["id"])
    assert (key_made.origin, key_made.source_api_key_id, key_made.source_run_id) == (
        "api_key",
        api.key.pk,
        run.pk,
    )
    user_made = MemoryRecord.objects.get(pk=by_user.record.pk)
    assert (user_made.origin, user_made.source_user_id) == ("user", curator.pk)
    orphan.refresh_from_db()
    assert orphan.origin == "unknown" and orphan.source_run_id is None
    versions = MemoryVersion.objects.filter(memory_id=orphan.pk)
    assert [(v.version, v.action, v.content) for v in versions] == [
        (1, "migrated", "written by hand")
    ]
