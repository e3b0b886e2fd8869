"""Erasure by key subset: every row and derived copy of the subset's contexts and memories goes
(messages, full-text rows, runs, steps, tool calls, trace spans, OTLP exports still queued,
memories, vectors, retries, audit payloads, admin log lines, keys confined inside it), a walk
over every text, JSON and byte column of every table (compressed bytes read decompressed) then
finds none of it, and another subset's data stays whole. A legal hold refuses
the erasure; only admins erase, with a typed confirmation; the receipt counts each kind."""

from __future__ import annotations

import hashlib
import json
import zlib
from io import StringIO

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from memory_app.audit import Actor
from memory_app.memories import Scope
from memory_app.models import (
    AuditEvent,
    Context,
    ContextKey,
    Embedding,
    EmbeddingModel,
    EmbeddingRetry,
    Label,
    MemoryRecord,
    Message,
    MessageSearch,
    Run,
    SpanQueue,
    Step,
    ToolCall,
    TraceSpan,
)
from memory_app.services.apikeys import apikey_issue
from memory_app.services.checkpoints import checkpoint_put
from memory_app.services.erasure import ERASE_CONFIRMATION, erase
from memory_app.services.memories import memories_record, memory_edit
from memory_app.services.memory_expiry import memory_set_legal_hold
from memory_app.services.messages import message_edit, messages_append
from memory_app.services.scores import Target, comment_add, label_add, score_add
from memory_app.services.store import item_put
from tests.api_helpers import make_key
from tests.builders import (
    make_context,
    make_run,
    make_user,
    register_models,
    without_their_context,
)

pytestmark = pytest.mark.django_db

# Words the English parser keeps whole, so a tsvector holding them is found as well.
ADA, BOB = "zqadaplugh", "zqbobplugh"
USER_JSON = json.dumps({"user": ADA})
ACTOR = Actor.system("erasure-test")
TEXT_TYPES = ("text", "character varying", "character", "json", "jsonb", "tsvector", "ARRAY")


def columns_holding(word: str) -> list[str]:
    """Every `table.column` of every table whose text or JSON (arrays and tsvectors too) holds
    `word`, found by walking information_schema."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c"
            " JOIN information_schema.tables t"
            " ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
            " WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'"
            " AND c.data_type = ANY(%s) ORDER BY 1, 2",
            [list(TEXT_TYPES)],
        )
        found = []
        for table, column in cursor.fetchall():
            cursor.execute(
                f"SELECT EXISTS (SELECT 1 FROM {connection.ops.quote_name(table)}"  # noqa: S608
                f" WHERE {connection.ops.quote_name(column)}::text ILIKE %s)",
                [f"%{word}%"],
            )
            if cursor.fetchone()[0]:
                found.append(f"{table}.{column}")
        # Bytes too (LangGraph's serialized checkpoints, the OTLP exports queued as protobuf),
        # searched as they are and, when they are a zlib or gzip stream, decompressed.
        cursor.execute(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c"
            " WHERE c.table_schema = current_schema() AND c.data_type = 'bytea' ORDER BY 1, 2"
        )
        for table, column in cursor.fetchall():
            quoted = connection.ops.quote_name(column)
            cursor.execute(
                f"SELECT {quoted} FROM {connection.ops.quote_name(table)}"  # noqa: S608
                f" WHERE {quoted} IS NOT NULL"
            )
            if any(word.encode() in _readable(bytes(raw)) for (raw,) in cursor.fetchall()):
                found.append(f"{table}.{column}")
    return found


def _readable(raw: bytes) -> bytes:
    """The bytes, followed by what they decompress to when they are a zlib or gzip stream."""
    try:
        return raw + zlib.decompress(raw, 32 + zlib.MAX_WBITS)
    except zlib.error:
        return raw


def _ids(word: str, n: int) -> tuple[bytes, bytes]:
    digest = hashlib.sha256(f"{word}{n}".encode()).digest()
    return digest[:16], digest[16:24]


def queue_otlp(api, word: str, n: int) -> None:
    """A trace export and a log export about the user `word`'s chat `n`, acknowledged and
    queued for mapping (the trace's protobuf compressed, the log records as JSON)."""
    trace_id, span_id = _ids(word, n)
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    for name, value in (("user", word), ("chat", str(n))):
        resource_spans.resource.attributes.add(
            key=f"agentmemory.context.{name}", value=AnyValue(string_value=value)
        )
    span = resource_spans.scope_spans.add().spans.add(
        trace_id=trace_id, span_id=span_id, name="agent run",
        start_time_unix_nano=1, end_time_unix_nano=2,
    )  # fmt: skip
    span.attributes.add(key="output.value", value=AnyValue(string_value=f"it was {word}"))
    traces = api.client.generic(
        "POST", "/v1/traces", request.SerializeToString(),
        content_type="application/x-protobuf", **api._headers(),
    )  # fmt: skip
    assert traces.status_code == 200, traces.content
    logs = {
        "resourceLogs": [
            {
                "resource": {
                    "attributes": [
                        {"key": "agentmemory.context.user", "value": {"stringValue": word}},
                        {"key": "agentmemory.context.chat", "value": {"stringValue": str(n)}},
                    ]
                },
                "scopeLogs": [
                    {
                        "logRecords": [
                            {
                                "timeUnixNano": "3",
                                "traceId": trace_id.hex(),
                                "spanId": span_id.hex(),
                                "body": {"stringValue": f"{word} said hello"},
                            }
                        ]
                    }
                ],
            }
        ]
    }
    sent = api.client.generic(
        "POST", "/v1/logs", json.dumps(logs), content_type="application/json", **api._headers()
    )
    assert sent.status_code == 200, sent.content


def populate(word: str) -> dict[str, int]:
    """Two contexts of the user `word` holding `word` everywhere a context's data can go."""
    user = word
    if not EmbeddingModel.objects.filter(name="inline-3").exists():
        register_models(**{"inline-3": 3})
    exporter = make_key(scopes=("write",))
    ids: dict[str, int] = {}
    for n in (1, 2):
        ctx = make_context(keys={"user": user, "chat": str(n)}, title=f"{word} chat {n}")
        ids[f"context{n}"] = ctx.pk
        message = messages_append(
            context=ctx,
            items=[
                {"role": "user", "text": f"my secret is {word}", "metadata": {"w": word}},
                {"role": "assistant", "text": f"noted {word}", "tags": [word]},
            ],
        ).messages[0]
        message_edit(message=message, actor=ACTOR, text=f"my secret was {word} really")
        run = make_run(context=ctx, steps=3, task=f"remember {word}", observations=f"saw {word}")
        TraceSpan.objects.create(
            context=ctx, run=run, trace_id="c" * 32, span_id=f"{n:016x}", role="step",
            start_ns=0, end_ns=1, data={"attributes": {"output.value": word}},
        )  # fmt: skip
        [mine] = memories_record(
            scope=Scope(context=ctx),
            items=[
                {
                    "content": f"{user} hides {word} in chat {n}",
                    "vector": [0.1, 0.2, 0.3],
                    "vector_model": "inline-3",
                }
            ],
            actor=ACTOR,
        )
        memory_edit(record=mine.record, actor=ACTOR, keywords=[word])
        # A reviewer's score, label and comment on the run (scores, labels, comments).
        target = Target.of(run)
        score_add(actor=ACTOR, target=target, name="correct", kind="categorical", value=word)
        label_add(actor=ACTOR, target=target, name=f"about-{word}")
        comment_add(actor=ACTOR, target=target, text=f"{word} asked for it")
        # A LangGraph thread's checkpoint, its channel bytes holding the text.
        checkpoint_put(
            context=ctx,
            checkpoint_ns="",
            checkpoint_id=f"1ef-{n}",
            parent_checkpoint_id=None,
            checkpoint=("json", json.dumps({"v": word}).encode()),
            channel_versions={"messages": "1"},
            metadata={"source": "input", "step": -1, "writes": {"w": word}},
            metadata_typed=("json", json.dumps({"w": word}).encode()),
            blobs=[("messages", "1", "json", json.dumps([word]).encode())],
        )
        # An exporter's spans and log records not mapped yet.
        queue_otlp(exporter, word, n)
    [shared] = memories_record(
        scope=Scope(keys={"user": user}),
        items=[{"content": f"{user} always says {word}", "vector": [0.3, 0.2, 0.1],
                "vector_model": "inline-3"}],
        actor=ACTOR,
    )  # fmt: skip
    ids["shared"] = shared.record.pk
    # A LangGraph store item of the user's key subset.
    item_put(
        scope=Scope(keys={"user": user}),
        namespace=["prefs", word],
        key=word,
        value={"likes": word},
        actor=ACTOR,
    )
    # A vector that failed, with the provider's error quoting the text.
    pending = Embedding.objects.create(message=message, context=ctx, model="inline-3", dimensions=3)
    EmbeddingRetry.objects.create(
        embedding=pending,
        context=ctx,
        attempts=2,
        next_attempt_at=timezone.now(),
        last_error=f"bad {word}",
    )
    # The Django admin's log of changes to some of them (its line names the row by its text).
    admin = make_user(role="admin")
    for row in (message, Label.objects.get(context=ctx)):
        LogEntry.objects.create(
            user=admin,
            content_type=ContentType.objects.get_for_model(row),
            object_id=str(row.pk),
            object_repr=str(row),
            action_flag=CHANGE,
        )
    # A key confined to this user alone, issued by an admin (its creation audited).
    apikey_issue(
        name=f"{word} key",
        scopes=["read"],
        context_keys={"user": user},
        actor=Actor.for_user(admin),
    )
    return ids


def test_erasing_a_user_leaves_nothing_of_them_in_any_table_and_others_whole():
    ada, bob = populate(ADA), populate(BOB)
    # The walk reaches every place the text went, derived copies and queued exports included.
    held = columns_holding(ADA)
    for column in (
        "memory_app_messagesearch.search_vector",
        "memory_app_runsearch.search_vector",
        "memory_app_tracespan.data",
        "memory_app_spanqueue.body",
        "memory_app_spanqueue.payload",
        "memory_app_memoryrecord.search_vector",
        "memory_app_checkpointblob.blob_data",
        "memory_app_auditevent.after",
        "django_admin_log.object_repr",
    ):
        assert column in held, (column, held)
    assert SpanQueue.objects.filter(context_id__in=[ada["context1"], ada["context2"]]).count() == 4
    assert ContextKey.objects.filter(target_id__in=[ada["context1"], ada["context2"]]).count() == 2
    bob_before = columns_holding(BOB)
    bob_counts = {
        model.__name__: model.objects.filter(
            context_id__in=[bob["context1"], bob["context2"]]
        ).count()
        for model in (Message, Run, Step, ToolCall, TraceSpan, SpanQueue, MemoryRecord, Embedding)
    }

    with CaptureQueriesContext(connection) as sent:
        done = erase(keys={"user": ADA}, confirmation=ERASE_CONFIRMATION, actor=ACTOR)
    # On Citus every statement on a context's rows goes to that context's shard alone.
    assert without_their_context([q["sql"] for q in sent.captured_queries]) == []

    assert columns_holding(ADA) == []
    receipt = done["receipt"]
    assert receipt["contexts"] == 2 and receipt["messages"] == 4
    assert receipt["full_text_rows"] == 4
    # Each chat's agent run, and the LangGraph invocation its checkpoint began.
    assert receipt["runs"] == 4 and receipt["steps"] == 6 and receipt["tool_calls"] == 4
    assert receipt["trace_spans"] == 2 and receipt["memories"] == 4  # the store item too
    assert receipt["queued_spans"] == 4  # a span and a log record in each chat
    # The output and the observations of each chat's three steps.
    assert receipt["run_full_text_rows"] == 2 * 4
    assert receipt["memory_versions"] >= 6  # each record's, and the edits'
    assert (receipt["scores"], receipt["labels"], receipt["comments"]) == (2, 2, 2)
    assert (receipt["checkpoints"], receipt["checkpoint_blobs"]) == (2, 2)
    assert receipt["vectors"] == 4 and receipt["embedding_retries"] == 1
    assert receipt["api_keys"] == 1 and receipt["admin_log_entries"] == 2
    assert receipt["audit_events_redacted"] >= 5
    assert not Context.objects.filter(pk__in=[ada["context1"], ada["context2"]]).exists()
    # Their keys' digests too (a digest of known keys would tell they were here).
    assert not ContextKey.objects.filter(target_id__in=[ada["context1"], ada["context2"]]).exists()
    assert not MemoryRecord.objects.filter(pk=ada["shared"]).exists()
    # The receipt is kept in the audit trail, the subset named by its digest only.
    event = AuditEvent.objects.get(pk=done["audit_event_id"])
    assert event.action == "erase" and event.after["receipt"] == receipt
    assert event.after["keys_digest"] == done["keys_digest"]

    # Bob's data is untouched, row for row.
    assert columns_holding(BOB) == bob_before
    for model in (Message, Run, Step, ToolCall, TraceSpan, SpanQueue, MemoryRecord, Embedding):
        count = model.objects.filter(context_id__in=[bob["context1"], bob["context2"]]).count()
        assert count == bob_counts[model.__name__], model
    assert MemoryRecord.objects.filter(pk=bob["shared"]).exists()
    assert MessageSearch.objects.filter(context_id=bob["context1"]).count() == 2
    # Erasing again finds nothing left.
    again = erase(keys={"user": ADA}, confirmation=ERASE_CONFIRMATION, actor=ACTOR)
    assert set(again["receipt"].values()) == {0}


def test_a_legal_hold_refuses_the_erasure_before_anything_goes():
    ada = populate(ADA)
    held = MemoryRecord.objects.get(pk=ada["shared"])
    admin = make_user(role="admin")
    memory_set_legal_hold(record=held, actor=Actor.for_user(admin), reason="case 7")
    before = columns_holding(ADA)
    api = make_key(scopes=("admin",))
    refused = api.post(
        "/api/v1/erasure", {"keys": {"user": ADA}, "confirmation": ERASE_CONFIRMATION}
    )
    assert refused.status_code == 409
    assert "legal hold" in refused.json()["detail"] and "case 7" in refused.json()["detail"]
    assert columns_holding(ADA) == before
    with pytest.raises(CommandError, match="case 7"):
        call_command("erase", keys=USER_JSON, yes=True, stdout=StringIO())
    assert Context.objects.filter(pk=ada["context1"]).exists()


def test_the_erasure_api_is_for_admins_inside_their_confinement_with_a_typed_confirmation():
    populate(ADA)
    body = {"keys": {"user": ADA}, "confirmation": ERASE_CONFIRMATION}
    assert make_key(scopes=("read", "write")).post("/api/v1/erasure", body).status_code == 403
    confined = make_key(scopes=("admin",), context_keys={"tenant": "acme"})
    assert confined.post("/api/v1/erasure", body).status_code == 403
    admin = make_key(scopes=("admin",))
    assert admin.post("/api/v1/erasure", {"keys": {}}).status_code == 422
    # Without a confirmation it only counts.
    preview = admin.post("/api/v1/erasure", {"keys": {"user": ADA}})
    assert preview.status_code == 200, preview.content
    assert preview.json()["erased"] is False and preview.json()["receipt"]["contexts"] == 2
    wrong = admin.post("/api/v1/erasure", {"keys": {"user": ADA}, "confirmation": "yes"})
    assert wrong.status_code == 422 and ERASE_CONFIRMATION in wrong.json()["detail"]
    assert Context.objects.filter(keys__contains={"user": ADA}).count() == 2
    done = admin.post("/api/v1/erasure", body)
    assert done.status_code == 200 and done.json()["erased"] is True
    # The count said what went (the audit's and the admin log's are known only as they go).
    counted = {k: v for k, v in preview.json()["receipt"].items() if v}
    assert counted == {
        k: v
        for k, v in done.json()["receipt"].items()
        if v and k not in ("audit_events_redacted", "admin_log_entries")
    }
    assert columns_holding(ADA) == []


def test_the_erase_command_counts_then_erases():
    populate(ADA)
    out = StringIO()
    call_command("erase", keys=USER_JSON, stdout=out)
    assert '"contexts": 2' in out.getvalue() and "nothing erased" in out.getvalue()
    assert Context.objects.filter(keys__contains={"user": ADA}).count() == 2
    out = StringIO()
    call_command("erase", keys=USER_JSON, yes=True, stdout=out)
    receipt = json.loads(out.getvalue())["receipt"]
    assert receipt["contexts"] == 2 and receipt["messages"] == 4
    assert columns_holding(ADA) == []
    with pytest.raises(CommandError, match="JSON"):
        call_command("erase", keys="{user}", stdout=StringIO())


def test_the_dashboard_erases_for_admins_with_a_typed_confirmation(client):
    populate(ADA)
    client.force_login(make_user(role="curator"))
    assert client.get("/erasure/").status_code == 403
    client.force_login(make_user(role="admin"))
    page = client.get("/erasure/", {"keys": USER_JSON})
    assert page.status_code == 200 and b"contexts" in page.content
    wrong = client.post("/erasure/", {"keys": USER_JSON, "confirmation": "erase"})
    assert wrong.status_code == 400
    assert Context.objects.filter(keys__contains={"user": ADA}).count() == 2
    done = client.post("/erasure/", {"keys": USER_JSON, "confirmation": ERASE_CONFIRMATION})
    assert done.status_code == 200, done.content
    assert b"receipt" in done.content.lower()
    assert columns_holding(ADA) == []
