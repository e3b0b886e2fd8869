"""Memory expiry (TTL, `expires_at`, pinned, legal hold) and retention policies: expired memories
drop out of every retrieval at once and are removed by the command and the worker; a legal hold
blocks expiry and purge; policies remove what is too old per key subset in batches that finish,
with progress and an audited summary per pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from memory_app.audit import Actor
from memory_app.errors import Forbidden, LegalHold
from memory_app.memories import Scope
from memory_app.models import (
    AuditEvent,
    MemoryRecord,
    Message,
    RetentionPolicy,
    Run,
    SpanQueue,
    TraceSpan,
)
from memory_app.queries.memories import memories_listed, memories_retrieve, memories_search
from memory_app.services import retention
from memory_app.services.curation import PURGE_CONFIRMATION
from memory_app.services.memories import memories_record, memory_purge
from memory_app.services.memory_expiry import memory_set_legal_hold
from memory_app.services.store import item_put
from tests.api_helpers import make_key
from tests.builders import make_context, make_run, make_user

pytestmark = pytest.mark.django_db

ACTOR = Actor.system("retention-test")


def _record(content: str, **item) -> MemoryRecord:
    [recorded] = memories_record(
        scope=Scope(keys={"user": "ada"}), items=[{"content": content, **item}], actor=ACTOR
    )
    return recorded.record


def _expire(*records: MemoryRecord) -> None:
    """Time passes: their expiry date now lies in the past."""
    MemoryRecord.objects.filter(pk__in=[r.pk for r in records]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _admin(client):
    user = make_user(role="admin")
    client.force_login(user)
    return user


# --- expiry -------------------------------------------------------------------------------------


def test_an_expired_memory_drops_out_of_every_retrieval_at_once(settings):
    settings.AGENTMEMORY_MEMORY_NEAR_COPY_SIMILARITY = 0.5
    context = make_context(keys={"user": "ada", "chat": "1"})
    api = make_key(scopes=("read", "write"))
    made = api.post(
        "/api/v1/memories",
        {
            "scope_keys": {"user": "ada"},
            "items": [
                {"content": "Ada drinks green tea daily", "ttl_seconds": 3600},
                {"content": "Ada drinks coffee on tea days", "ttl_seconds": 60, "pinned": True},
                {"content": "Ada likes tea ceremonies"},
            ],
        },
    )
    assert made.status_code == 201, made.content
    tea, pinned, kept = (i["memory"] for i in made.json()["items"])
    assert tea["expires_at"] and not tea["pinned"] and kept["expires_at"] is None
    assert pinned["pinned"] is True
    # A TTL counts from now.
    at = MemoryRecord.objects.get(pk=tea["id"]).expires_at
    assert timedelta(seconds=3590) < at - timezone.now() <= timedelta(seconds=3600)

    def recalled() -> set[int]:
        body = {"context_id": context.pk, "keywords": ["tea"], "query": "tea", "limit": 10}
        answer = api.post("/api/v1/memories/retrieve", body)
        assert answer.status_code == 200, answer.content
        return {i["id"] for i in answer.json()["items"]}

    assert recalled() == {tea["id"], pinned["id"], kept["id"]}
    _expire(MemoryRecord.objects.get(pk=tea["id"]), MemoryRecord.objects.get(pk=pinned["id"]))
    # Not yet removed, already gone from recall, lists, reads by id and the dashboard's search;
    # the pinned one never expires.
    assert MemoryRecord.objects.filter(pk=tea["id"]).exists()
    assert recalled() == {pinned["id"], kept["id"]}
    # (MCP's list_memories reads this list.)
    for where in ({"context": context}, {}):
        listed = memories_listed(key=api.key, **where).items
        assert {r.pk for r in listed} == {pinned["id"], kept["id"]}
    assert api.get(f"/api/v1/memories/{tea['id']}").status_code == 404
    assert tea["id"] not in {r.pk for r in memories_search(query="tea")}
    assert tea["id"] not in {
        r.record.pk for r in memories_retrieve(context=context, query="green tea daily")
    }
    # Nor does it answer for a near-copy of itself.
    near = api.post(
        "/api/v1/memories",
        {"scope_keys": {"user": "ada"}, "content": "Ada drinks green tea daily!"},
    ).json()["items"][0]
    assert near["created"] is True and near["memory"]["id"] != tea["id"]
    # The same content recorded again renews the expired record.
    again = api.post(
        "/api/v1/memories", {"scope_keys": {"user": "ada"}, "content": "Ada drinks green tea daily"}
    ).json()["items"][0]
    assert again["memory"]["id"] == tea["id"] and again["memory"]["expires_at"] is None
    assert tea["id"] in recalled()


def test_expiry_is_set_changed_and_cleared_through_the_api_and_audited():
    api = make_key(scopes=("read", "write"))
    record = _record("Ada is in Rome this week")
    url = f"/api/v1/memories/{record.pk}"
    answer = api.patch(url, {"ttl_seconds": 120, "note": "trip"})
    assert answer.status_code == 200, answer.content
    assert answer.json()["expires_at"] is not None
    when = "2031-05-01T12:00:00+02:00"
    instant = datetime(2031, 5, 1, 10, tzinfo=UTC)
    assert _at(api.patch(url, {"expires_at": when}).json()["expires_at"]) == instant
    # Left alone when not named; cleared by an explicit null.
    assert _at(api.patch(url, {"keywords": ["rome"]}).json()["expires_at"]) == instant
    assert api.patch(url, {"expires_at": None}).json()["expires_at"] is None
    bad = api.patch(url, {"expires_at": when, "ttl_seconds": 5, "content": "changed"})
    assert bad.status_code == 422
    # Nothing half-written: the edit that came with the refused expiry did not happen.
    assert MemoryRecord.objects.get(pk=record.pk).content == "Ada is in Rome this week"
    assert api.patch(url, {"ttl_seconds": 0}).status_code == 422
    assert api.patch(url, {"expires_at": "2031-05-01T12:00:00"}).status_code == 422
    events = AuditEvent.objects.filter(action="memory_expiry", target_ids=[record.pk])
    assert events.count() == 3
    assert events.order_by("id").first().note == "trip"


def test_expired_memories_are_removed_by_the_command_and_the_worker_pinned_and_held_stay():
    gone = [_record(f"Ada had plan {i} for Tuesday") for i in range(3)]
    pinned = _record("Ada's plan for Wednesday", pinned=True)
    held = _record("Ada's plan for Thursday")
    fresh = _record("Ada's plan for Friday", ttl_seconds=3600)
    memory_set_legal_hold(record=held, actor=Actor.for_user(make_user(role="admin")), reason="x")
    _expire(*gone, pinned, held)
    assert retention.expired_count() == 3
    # The worker's turn takes one batch.
    assert retention.retention_batch(batch_size=2) == 2
    out = StringIO()
    call_command("apply_retention", batch_size=2, stdout=out)
    assert "memories: 1 expired memories removed" in out.getvalue()
    left = set(MemoryRecord.objects.values_list("pk", flat=True))
    assert left == {pinned.pk, held.pk, fresh.pk}
    purges = AuditEvent.objects.filter(action="purge", target_type="memoryrecord")
    assert sorted(e.target_ids[0] for e in purges) == sorted(r.pk for r in gone)
    assert {e.actor for e in purges} == {"system:expiry"} and {e.note for e in purges} == {
        "expired"
    }
    # Their content is gone from the audit trail too.
    assert not AuditEvent.objects.filter(after__icontains="plan 0").exists()


def test_the_embed_worker_applies_expiry_and_policies_turn_by_turn(settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    gone = _record("Ada had a plan for Monday")
    _expire(gone)
    ctx = make_context(keys={"tenant": "acme"}, messages=3)
    _age(Message, "created_at", 40, context=ctx, seq__lte=2)
    policy = retention.policy_save(
        actor=ACTOR,
        fields={
            "name": "m",
            "scope_keys": {"tenant": "acme"},
            "kind": "messages",
            "max_age_days": 30,
        },
    )
    call_command("embed_worker", "--once", "--idle-sleep", "0", stdout=StringIO())
    assert not MemoryRecord.objects.filter(pk=gone.pk).exists()
    assert list(Message.objects.filter(context=ctx).values_list("seq", flat=True)) == [3]
    summary = AuditEvent.objects.get(action="retention_applied", target_ids=[policy.pk])
    assert summary.after["removed"] == 2


def test_what_expiry_and_a_policy_remove_leaves_no_admin_log_line_naming_it():
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    gone = _record("Ada had a plan for Sunday")
    kept = _record("Ada has a plan for Saturday")
    _expire(gone)
    ctx = make_context(keys={"tenant": "acme"}, messages=2)
    _age(Message, "created_at", 40, context=ctx, seq=1)
    old, new = Message.objects.filter(context=ctx).order_by("seq")
    admin = make_user(role="admin")
    # The Django admin's log names a row by its text.
    for row in (gone, kept, old, new):
        LogEntry.objects.create(
            user=admin, content_type=ContentType.objects.get_for_model(row),
            object_id=str(row.pk), object_repr=str(row), action_flag=CHANGE,
        )  # fmt: skip
    retention.policy_save(
        actor=ACTOR,
        fields={"name": "m", "scope_keys": {}, "kind": "messages", "max_age_days": 30},
    )
    call_command("apply_retention", stdout=StringIO())
    assert sorted(LogEntry.objects.values_list("object_repr", flat=True)) == sorted(
        [str(kept), str(new)]
    )


def test_store_items_past_their_time_to_live_are_swept_after_expired_memories():
    scope = Scope(keys={"user": "ada"})
    put = lambda key, ttl=None: item_put(  # noqa: E731
        scope=scope, namespace=["cache"], key=key, value={"k": key}, actor=ACTOR, ttl=ttl
    )[0]
    old, older, pinned = put("old", 5), put("older", 5), put("pinned", 5)
    put("fresh", 60), put("forever")
    MemoryRecord.objects.filter(pk=pinned.pk).update(pinned=True)
    now = timezone.now()
    for record, ago in ((old, 1), (older, 90), (pinned, 90)):
        MemoryRecord.objects.filter(pk=record.pk).update(
            item_expires_at=now - timedelta(seconds=ago)
        )
    memory = _record("Ada's plan for Monday")
    _expire(memory)
    assert retention.expired_count() == 3
    # A batch takes memories past their date first, then items soonest expired first.
    assert retention.memories_expire_batch(batch_size=2) == 2
    assert not MemoryRecord.objects.filter(pk__in=[memory.pk, older.pk]).exists()
    assert retention.memories_expire_batch(batch_size=2) == 1
    assert retention.memories_expire_batch(batch_size=2) == 0
    left = set(MemoryRecord.objects.values_list("item_key", flat=True))
    assert left == {"fresh", "forever", "pinned"}
    purges = AuditEvent.objects.filter(action="purge", target_type="memoryrecord")
    assert sorted(e.target_ids[0] for e in purges) == sorted([memory.pk, older.pk, old.pk])
    # A swept item's value is nowhere now (its versions, its audit payloads); a kept one's is.
    from tests.test_erasure import columns_holding

    assert columns_holding('"k": "older"') == []
    assert "memory_app_memoryrecord.content" in columns_holding('"k": "fresh"')
    # Put again under the swept key: a new item.
    again = put("old")
    assert again.pk != old.pk and again.content == '{"k": "old"}'


def test_a_legal_hold_is_set_by_dashboard_admins_only_and_blocks_purge(client):
    record = _record("Ada signed the contract")
    curator = make_user(role="curator")
    client.force_login(curator)
    url = f"/memories/{record.pk}/legal-hold/"
    assert client.post(url, {"reason": "case 12"}).status_code == 403
    with pytest.raises(Forbidden):
        memory_set_legal_hold(
            record=record, actor=Actor.for_key(make_key(scopes=("admin",)).key), reason="x"
        )
    admin = _admin(client)
    response = client.post(url, {"reason": "case 12"})
    assert response.status_code in (200, 302), response.content
    record.refresh_from_db()
    assert record.legal_hold == "case 12"
    event = AuditEvent.objects.get(action="legal_hold", target_ids=[record.pk])
    assert event.actor == f"user:{admin.username}" and event.after == {"legal_hold": "case 12"}

    # A purge is refused, by the service, the API and the dashboard, naming the hold.
    with pytest.raises(LegalHold, match="case 12"):
        memory_purge(record=record, actor=ACTOR)
    api = make_key(scopes=("read", "write", "admin"))
    refused = api.send("DELETE", f"/api/v1/memories/{record.pk}")
    assert refused.status_code == 409
    assert "legal hold" in refused.json()["detail"] and "case 12" in refused.json()["detail"]
    assert refused.json()["differences"] == {"legal_hold": {str(record.pk): "case 12"}}
    assert api.get(f"/api/v1/memories/{record.pk}").json()["legal_hold"] == "case 12"
    # An API key may not lift it: its edit fields do not reach the hold.
    api.patch(f"/api/v1/memories/{record.pk}", {"metadata": {"legal_hold": ""}})
    assert MemoryRecord.objects.get(pk=record.pk).legal_hold == "case 12"

    # Nor does the Django admin delete it, one or selected, nor its context.
    admin.is_staff = admin.is_superuser = True
    admin.save()
    delete = reverse("admin:memory_app_memoryrecord_delete", args=[record.pk])
    answer = client.post(delete, {"post": "yes", "confirmation": PURGE_CONFIRMATION}, follow=True)
    assert "Under legal hold: memory" in answer.content.decode()
    changelist = reverse("admin:memory_app_memoryrecord_changelist")
    client.post(
        changelist,
        {"action": "delete_selected", "_selected_action": [record.pk], "post": "yes",
         "confirmation": PURGE_CONFIRMATION},
    )  # fmt: skip
    assert MemoryRecord.objects.filter(pk=record.pk).exists()

    client.post(url, {"reason": ""})
    assert MemoryRecord.objects.get(pk=record.pk).legal_hold == ""
    assert AuditEvent.objects.filter(action="legal_hold_lift", target_ids=[record.pk]).exists()
    assert api.send("DELETE", f"/api/v1/memories/{record.pk}").status_code == 200


def test_the_dashboard_sets_an_expiry_and_pins(client):
    record = _record("Ada is on leave")
    _admin(client)
    url = f"/memories/{record.pk}/expiry/"
    response = client.post(url, {"expires_at": "2031-01-02T03:04", "pinned": ""})
    assert response.status_code in (200, 302), response.content
    record.refresh_from_db()
    assert record.expires_at is not None and not record.pinned
    client.post(url, {"expires_at": "", "pinned": "1"})
    record.refresh_from_db()
    assert record.expires_at is None and record.pinned
    assert client.post(url, {"expires_at": "soon"}).status_code == 400


# --- retention policies -------------------------------------------------------------------------


def _age(model, field: str, days: int, **where) -> None:
    model.objects.filter(**where).update(**{field: timezone.now() - timedelta(days=days)})


def test_a_message_policy_removes_old_messages_of_its_subset_in_batches_with_a_summary():
    acme = [make_context(keys={"tenant": "acme", "user": u}, messages=4) for u in ("ada", "bo")]
    other = make_context(keys={"tenant": "other"}, messages=4)
    for ctx in (*acme, other):
        # Three old messages each, one recent.
        _age(Message, "created_at", 100, context=ctx, seq__lte=3)
    policy = retention.policy_save(
        actor=ACTOR,
        fields={
            "name": "acme chats",
            "scope_keys": {"tenant": "acme"},
            "kind": "messages",
            "max_age_days": 90,
        },
    )
    out = StringIO()
    call_command("apply_retention", batch_size=2, stdout=out)
    text = out.getvalue()
    # One context a batch, at most two rows: 2 + 1 for each acme context, progress printed.
    assert text.count("messages removed (") == 4, text
    assert f"policy {policy.pk} (acme chats): done, 6 messages" in text
    for ctx in acme:
        ctx.refresh_from_db()
        assert list(ctx.messages.values_list("seq", flat=True)) == [4]
        assert ctx.message_count == 1
    assert Message.objects.filter(context=other).count() == 4
    summary = AuditEvent.objects.get(action="retention_applied", target_ids=[policy.pk])
    assert summary.after["removed"] == 6 and summary.after["batches"] == 4
    assert summary.actor == "system:retention"
    policy.refresh_from_db()
    assert policy.progress == {} and policy.last_summary["removed"] == 6
    # Nothing more to do: the next pass removes nothing and says so.
    call_command("apply_retention", policy=policy.pk, stdout=StringIO())
    assert AuditEvent.objects.filter(action="retention_applied").count() == 2


def test_a_pass_that_stops_goes_on_where_it_was():
    ctx = make_context(keys={"tenant": "acme"}, messages=5)
    _age(Message, "created_at", 40, context=ctx)
    policy = retention.policy_save(
        actor=ACTOR,
        fields={"name": "m", "scope_keys": {}, "kind": "messages", "max_age_days": 30},
    )
    first = retention.policy_apply_batch(policy=policy, batch_size=2)
    assert (first.removed, first.total) == (2, 2)
    policy.refresh_from_db()
    assert policy.progress["removed"] == 2
    # The worker, idle for this policy, does not write a summary per turn.
    done = retention.policy_apply(policy=policy, batch_size=2)
    assert done.total == 5 and done.summary_event_id
    assert AuditEvent.objects.get(pk=done.summary_event_id).after["removed"] == 5
    assert retention.retention_batch(batch_size=2) == 0
    assert AuditEvent.objects.filter(action="retention_applied").count() == 1


def test_run_and_span_policies_and_the_worker():
    ctx = make_context(keys={"tenant": "acme", "user": "ada"})
    old_run, new_run = make_run(context=ctx, steps=2), make_run(context=ctx, steps=2)
    _age(Run, "created_at", 20, pk=old_run.pk)
    for n, run in enumerate((old_run, new_run)):
        TraceSpan.objects.create(
            context=ctx, run=run, trace_id="a" * 32, span_id=f"{n:016x}", role="step",
            start_ns=0, end_ns=1, data={"name": f"span {n}"},
        )  # fmt: skip
    TraceSpan.objects.create(
        context=ctx, trace_id="b" * 32, span_id="f" * 16, role="other", start_ns=0, end_ns=1,
        data={"name": "loose"},
    )  # fmt: skip
    _age(TraceSpan, "received_at", 40, span_id="f" * 16)
    # OTLP exports the mapping set aside (never mapped), one old and one recent, and one
    # waiting to be mapped.
    for trace, error in (("c", "KeyError"), ("d", "KeyError"), ("e", "")):
        SpanQueue.objects.create(
            context=ctx, trace_ids=[trace * 32], span_count=1, body=b"raw", error=error
        )
    _age(SpanQueue, "received_at", 40, trace_ids__contains=["c" * 32])
    _age(SpanQueue, "received_at", 40, trace_ids__contains=["e" * 32])
    runs = retention.policy_save(
        actor=ACTOR,
        fields={"name": "r", "scope_keys": {"user": "ada"}, "kind": "runs", "max_age_days": 10},
    )
    spans = retention.policy_save(
        actor=ACTOR,
        fields={"name": "s", "scope_keys": {"tenant": "acme"}, "kind": "spans", "max_age_days": 30},
    )
    # The worker's turns: the old run (with its spans), then the old loose span and the old
    # export set aside; the export still queued is the mapping's.
    assert retention.retention_batch() == 1
    assert retention.retention_batch() == 2
    assert retention.retention_batch() == 0
    assert sorted(q.trace_ids[0][0] for q in SpanQueue.objects.all()) == ["d", "e"]
    assert list(Run.objects.filter(context=ctx).values_list("pk", flat=True)) == [new_run.pk]
    ctx.refresh_from_db()
    assert ctx.run_count == 1
    assert list(TraceSpan.objects.values_list("span_id", flat=True)) == [f"{1:016x}"]
    # Each pass that removed something ends with its summary, once.
    summaries = AuditEvent.objects.filter(action="retention_applied")
    assert sorted((e.target_ids[0], e.after["removed"]) for e in summaries) == [
        (runs.pk, 1),
        (spans.pk, 2),
    ]


def test_policies_are_checked_and_audited():
    with pytest.raises(Exception, match="kind"):
        retention.policy_save(
            actor=ACTOR, fields={"name": "x", "kind": "everything", "max_age_days": 3}
        )
    with pytest.raises(Exception, match="max_age_days"):
        retention.policy_save(actor=ACTOR, fields={"name": "x", "kind": "runs", "max_age_days": 0})
    policy = retention.policy_save(
        actor=ACTOR, fields={"name": "x", "kind": "runs", "max_age_days": 3}
    )
    retention.policy_save(
        actor=ACTOR, policy=policy, fields={"name": "y", "kind": "runs", "max_age_days": 4}
    )
    retention.policy_delete(actor=ACTOR, policy=policy)
    actions = list(
        AuditEvent.objects.filter(target_type="retentionpolicy")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["retention_policy", "retention_policy", "retention_policy_delete"]
    assert not RetentionPolicy.objects.exists()


def test_admins_manage_policies_in_the_dashboard(client):
    client.force_login(make_user(role="curator"))
    assert client.get("/retention/").status_code == 403
    _admin(client)
    assert client.get("/retention/").status_code == 200
    form = {"name": "acme <b>chats</b>", "scope_keys": "tenant=acme", "kind": "messages"}
    assert client.post("/retention/", {**form, "max_age_days": "0"}).status_code == 400
    assert not RetentionPolicy.objects.exists()
    response = client.post("/retention/", {**form, "max_age_days": "90", "enabled": "1"})
    assert response.status_code == 302
    policy = RetentionPolicy.objects.get()
    assert (policy.scope_keys, policy.max_age_days, policy.enabled) == (
        {"tenant": "acme"},
        90,
        True,
    )
    page = client.get("/retention/").content.decode()
    # What an operator typed is escaped like the rest.
    assert "acme &lt;b&gt;chats&lt;/b&gt;" in page and "<b>chats</b>" not in page
    client.post("/retention/", {**form, "policy": policy.pk, "max_age_days": "30"})
    policy.refresh_from_db()
    assert (policy.max_age_days, policy.enabled) == (30, False)
    client.post("/retention/", {"policy": policy.pk, "delete": "1"})
    assert not RetentionPolicy.objects.exists()
    assert AuditEvent.objects.filter(target_type="retentionpolicy").count() == 3


@pytest.mark.django_db(transaction=True)
def test_mcp_records_with_a_ttl_and_corrects_the_expiry(asgi_live_server):
    from tests.test_mcp import Session, _secret

    context = make_context(keys={"user": "ada"})
    mcp = Session(asgi_live_server, _secret())
    made = mcp.ok("record_memory", content="Ada is at the dentist", context_id=context.pk,
                  ttl_seconds=600)["items"][0]["memory"]  # fmt: skip
    at = MemoryRecord.objects.get(pk=made["id"]).expires_at
    assert timedelta(seconds=590) < at - timezone.now() <= timedelta(seconds=600)
    fixed = mcp.ok("correct_memory", memory_id=made["id"], pinned=True)["memory"]
    assert fixed["pinned"] is True
    _expire(MemoryRecord.objects.get(pk=made["id"]))
    # Pinned, it is still recalled past its date; unpinned, it is gone at once.
    query = {"context_id": context.pk, "query": "dentist"}
    assert [m["id"] for m in mcp.ok("retrieve_memories", **query)["items"]] == [made["id"]]
    MemoryRecord.objects.filter(pk=made["id"]).update(pinned=False)
    assert mcp.ok("retrieve_memories", **query)["items"] == []
    assert "not found" in mcp.error("correct_memory", memory_id=made["id"], pinned=True)
