"""A purge is total: the purged text is gone from every table (trace spans, vectors, full-text
rows, audit payloads), a later span of the same trace does not bring a purged step back, memories
can be purged (service, REST, dashboard, admin), spans go with their run and expire after their
retention."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from memory_app import backlog
from memory_app.audit import Actor, audit_record
from memory_app.memories import Scope
from memory_app.models import (
    AuditEvent,
    Context,
    Embedding,
    MemoryEmbedding,
    MemoryRecord,
    Message,
    MessageSearch,
    Run,
    Score,
    Step,
    TraceSpan,
)
from memory_app.services import curation
from memory_app.services.curation import PURGE_CONFIRMATION
from memory_app.services.memories import (
    memories_merge,
    memories_record,
    memory_edit,
    memory_purge,
)
from memory_app.services.messages import message_edit, messages_append
from memory_app.services.scores import Target, comment_add, label_add, score_set
from tests.api_helpers import make_key
from tests.builders import (
    make_context,
    make_run,
    make_user,
    register_models,
    without_their_context,
)
from tests.otlp_queue import map_queued

pytestmark = pytest.mark.django_db

# One word the English full-text parser keeps as it is, so a tsvector holding it is found too.
SECRET = "zqxjplugh"
ACTOR = Actor.system("purge-test")


def tables_holding(text: str) -> list[str]:
    """Every table of the database with a row whose text form contains `text` (all columns:
    JSON, arrays and tsvectors included)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
        )
        names = sorted(r[0] for r in cursor.fetchall())
        found = []
        for name in names:
            table = connection.ops.quote_name(name)
            cursor.execute(
                f"SELECT EXISTS (SELECT 1 FROM {table} t WHERE t::text ILIKE %s)",  # noqa: S608
                [f"%{text}%"],
            )
            if cursor.fetchone()[0]:
                found.append(name)
    return found


# --- OTLP/JSON spans, written out by hand -------------------------------------------------------

TRACE = "0af7651916cd43dd8448eb211c80319c"
ROOT, STEP1, LLM1, TOOL1, STEP2 = (f"{i:016x}" for i in range(1, 6))
T0 = 1_760_000_000_000_000_000
MS = 1_000_000  # span times below are milliseconds after T0
RESOURCE = {"agentmemory.context.user": "ada", "service.name": "purge-bot"}


def _attrs(values: dict) -> list[dict]:
    out = []
    for key, value in values.items():
        kind = "intValue" if isinstance(value, int) else "stringValue"
        out.append({"key": key, "value": {kind: str(value) if kind == "intValue" else value}})
    return out


def span(span_id, parent, name, kind, start, end, **attributes) -> dict:
    return {
        "traceId": TRACE,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(T0 + start * MS),
        "endTimeUnixNano": str(T0 + end * MS),
        "attributes": _attrs({"openinference.span.kind": kind, **attributes}),
        "status": {"code": 1},
    }


def otlp(*spans: dict) -> bytes:
    return json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": _attrs(RESOURCE)},
                    "scopeSpans": [
                        {
                            "scope": {"name": "openinference.instrumentation.smolagents"},
                            "spans": list(spans),
                        }
                    ],
                }
            ]
        }
    ).encode()


# Step 1 ends before Step 2 and the root, so an exporter sends it in an earlier request.
FIRST = otlp(
    span(
        LLM1,
        STEP1,
        "LiteLLMModel.generate",
        "LLM",
        20,
        30,
        **{
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.content": f"I will look up {SECRET}",
            "llm.token_count.prompt": 10,
            "llm.token_count.completion": 5,
        },
    ),
    span(
        TOOL1,
        STEP1,
        "lookup",
        "TOOL",
        31,
        40,
        **{"tool.name": "lookup", "output.value": f"{SECRET} is a password"},
    ),
    span(STEP1, ROOT, "Step 1", "CHAIN", 10, 50, **{"output.value": f"found {SECRET}"}),
)
SECOND = otlp(
    span(STEP2, ROOT, "Step 2", "CHAIN", 60, 70, **{"output.value": "nothing to see"}),
    span(
        ROOT,
        "",
        "CodeAgent.run",
        "AGENT",
        0,
        100,
        **{"smolagents.task": "find the word", "output.value": "done"},
    ),
)


def send(client, body: bytes):
    response = client.client.generic(
        "POST", "/v1/traces", body, content_type="application/json", **client._headers()
    )
    assert response.status_code == 200, response.content
    map_queued()
    return response


@pytest.fixture
def writer():
    return make_key(scopes=("read", "write"))


def traced_run(writer) -> Run:
    send(writer, FIRST)
    return Run.objects.get(client_id=f"otel:{TRACE}")


def test_a_purged_step_stays_purged_when_its_trace_sends_more_spans(writer):
    run = traced_run(writer)
    step = Step.objects.get(run=run, client_id=STEP1)
    assert step.observations == f"found {SECRET}"
    # An edit made in the Django admin keeps the step's text in its audit event.
    audit_record(
        actor=ACTOR,
        action="edit",
        target_type="step",
        target_ids=[step.pk],
        context_id=run.context_id,
        before={"observations": f"found {SECRET}"},
        after={"observations": "found it"},
    )
    curation.steps_set_pruned(run=run, ids=[step.pk], pruned=True, actor=ACTOR)
    curation.pruned_purge(
        older_than=timezone.now() + timedelta(seconds=1),
        confirmation=PURGE_CONFIRMATION,
        actor=ACTOR,
    )
    assert tables_holding(SECRET) == []

    send(writer, SECOND)
    run.refresh_from_db()
    assert run.status == "success" and run.final_answer == "done"
    assert [(s.kind, s.client_id) for s in run.steps.order_by("position")] == [
        ("task", f"{ROOT}:task"),
        ("action", STEP2),
    ]
    assert run.step_count == 2
    # A retried batch of the purged spans neither writes the step again nor its text.
    assert send(writer, FIRST).json().get("partialSuccess", {}).get("rejectedSpans") == "3"
    assert not Step.objects.filter(run=run, client_id=STEP1).exists()
    assert tables_holding(SECRET) == []
    # The purged spans keep their place in the trace, nothing the agent wrote.
    kept = {s.span_id: s.data for s in TraceSpan.objects.filter(run=run)}
    assert kept[STEP1] == kept[LLM1] == kept[TOOL1] == {"purged": True}
    assert kept[STEP2]["attributes"]["output.value"] == "nothing to see"


def test_a_purged_task_step_takes_the_runs_task_and_does_not_come_back(writer):
    send(writer, FIRST)
    send(writer, SECOND)
    run = Run.objects.get(client_id=f"otel:{TRACE}")
    task = Step.objects.get(run=run, kind="task")
    curation.selected_purge(step_ids=[task.pk], confirmation=PURGE_CONFIRMATION, actor=ACTOR)
    root = TraceSpan.objects.get(run=run, span_id=ROOT)
    assert root.data["purged_task"] is True
    assert "smolagents.task" not in root.data["attributes"]
    assert root.data["attributes"]["output.value"] == "done"
    # A late span of the trace maps the kept spans again: the task step stays purged.
    late = otlp(span("00000000000000aa", ROOT, "Step 3", "CHAIN", 80, 90))
    send(writer, late)
    run.refresh_from_db()
    assert not Step.objects.filter(run=run, kind="task").exists()
    # The run's task was a copy of the step's text and went with it; its outcome stays.
    assert run.final_answer == "done" and run.task == ""
    assert tables_holding("find the word") == []


def test_spans_are_deleted_with_their_run_and_do_not_bring_it_back(writer, client):
    run = traced_run(writer)
    context = run.context
    assert context.run_count == 1
    admin = make_user(role=None, username="root")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    url = reverse("admin:memory_app_run_delete", args=[run.pk])
    client.post(url, {"post": "yes", "confirmation": "no"})
    assert Run.objects.filter(pk=run.pk).exists()
    client.post(url, {"post": "yes", "confirmation": PURGE_CONFIRMATION})
    assert not Run.objects.filter(pk=run.pk).exists()
    assert not TraceSpan.objects.filter(trace_id=TRACE).exists()
    context.refresh_from_db()
    assert context.run_count == 0
    assert AuditEvent.objects.filter(action="purge", target_type="run", target_ids=[run.pk])
    assert tables_holding(SECRET) == []
    # The trace's next spans start afresh: the purged run's steps are not made again.
    send(writer, SECOND)
    [again] = Run.objects.filter(client_id=f"otel:{TRACE}")
    assert again.pk != run.pk
    assert sorted(again.steps.values_list("client_id", flat=True)) == sorted(
        [f"{ROOT}:task", STEP2]
    )
    assert tables_holding(SECRET) == []


# --- span retention ------------------------------------------------------------------------------


def test_spans_past_their_retention_expire_in_batches_and_the_steps_stay(writer, settings):
    run = traced_run(writer)
    task_purged = otlp(span(ROOT, "", "CodeAgent.run", "AGENT", 0, 100, **{"input.value": "t"}))
    send(writer, task_purged)
    curation.selected_purge(
        step_ids=list(Step.objects.filter(run=run, kind="task").values_list("pk", flat=True)),
        confirmation=PURGE_CONFIRMATION,
        actor=ACTOR,
    )
    old = timezone.now() - timedelta(days=10)
    TraceSpan.objects.filter(run=run).exclude(span_id=TOOL1).update(received_at=old)
    call_command("expire_spans")  # retention off: nothing happens
    assert TraceSpan.objects.filter(run=run).count() == 4
    settings.AGENTMEMORY_SPAN_RETENTION_DAYS = 7
    assert backlog.expire_spans_batch(batch_size=1) == 1
    call_command("expire_spans", batch_size=1)
    left = {s.span_id: s.data for s in TraceSpan.objects.filter(run=run)}
    # The recent span stays; the purged task's marker stays without the rest of the root.
    assert set(left) == {TOOL1, ROOT}
    assert left[ROOT] == {"purged": True, "purged_task": True}
    assert Step.objects.filter(run=run, client_id=STEP1).exists()
    settings.AGENTMEMORY_SPAN_RETENTION_DAYS = 0
    assert backlog.expire_spans_batch() is None


def test_the_embed_worker_applies_the_span_retention(writer, settings):
    from memory_app.embeddings import providers

    class NothingToEmbed(providers.EmbeddingProvider):
        kind, model = "test", "nothing-pending"

    run = traced_run(writer)
    TraceSpan.objects.filter(run=run).update(received_at=timezone.now() - timedelta(days=3))
    settings.AGENTMEMORY_SPAN_RETENTION_DAYS = 2
    backlog.run_worker(provider=NothingToEmbed(), once=True)
    assert not TraceSpan.objects.filter(run=run).exists()
    assert Step.objects.filter(run=run, client_id=STEP1).exists()


# --- messages -----------------------------------------------------------------------------------


def test_a_purged_message_leaves_no_vector_full_text_row_or_audit_text():
    register_models(**{"inline-3": 3})
    context = make_context()
    [message, kept] = messages_append(
        context=context,
        items=[
            {"role": "user", "text": f"the word is {SECRET}"},
            {"role": "user", "text": "keep me", "vector": [1, 0, 0], "vector_model": "inline-3"},
        ],
    ).messages
    message_edit(message=message, actor=ACTOR, text=f"the word is still {SECRET}")
    from memory_app.embeddings.client_vectors import vector_put

    vector_put(message=message, model="inline-3", vector=[0, 1, 0])
    assert MessageSearch.objects.filter(context_id=context.pk, seq=message.seq).exists()
    assert set(tables_holding(SECRET)) >= {
        "memory_app_message",
        "memory_app_messagesearch",
        "memory_app_auditevent",
    }
    curation.selected_purge(message_ids=[message.pk], confirmation=PURGE_CONFIRMATION, actor=ACTOR)
    assert tables_holding(SECRET) == []
    assert not Embedding.objects.filter(message_id=message.pk).exists()
    assert Embedding.objects.filter(message_id=kept.pk).exists()


# --- memories -----------------------------------------------------------------------------------


def _memory(context: Context, content: str, **extra) -> MemoryRecord:
    [recorded] = memories_record(
        scope=Scope(context=context), items=[{"content": content, **extra}], actor=ACTOR
    )
    return recorded.record


def test_a_purged_memory_leaves_no_vector_and_no_content_in_the_audit():
    register_models(**{"inline-3": 3})
    context = make_context()
    record = _memory(
        context, f"the password is {SECRET}", vector=[1, 0, 0], vector_model="inline-3"
    )
    other = _memory(context, "ada likes tea", keywords=["tea"])
    record = memory_edit(record=record, actor=ACTOR, content=f"the password was {SECRET}")
    memories_merge(keep_id=other.pk, ids=[record.pk, other.pk], actor=ACTOR)
    assert MemoryEmbedding.objects.filter(memory_record_id=record.pk).exists()
    assert "memory_app_auditevent" in tables_holding(SECRET)

    event = memory_purge(record=record, actor=ACTOR)

    assert tables_holding(SECRET) == []
    assert not MemoryRecord.objects.filter(pk=record.pk).exists()
    assert not MemoryEmbedding.objects.filter(memory_record_id=record.pk).exists()
    assert (event.action, event.target_type, event.target_ids) == (
        "purge",
        "memoryrecord",
        [record.pk],
    )
    assert SECRET not in json.dumps([event.before, event.after, event.note])
    # The other record of the merge keeps its versions in the trail.
    merge = AuditEvent.objects.get(action="memory_merge")
    assert merge.before[str(record.pk)] == {"purged": True}
    assert merge.before[str(other.pk)]["content"] == "ada likes tea"
    assert merge.after["kept"] == other.pk and merge.after["content"] == "ada likes tea"


def test_the_rest_purge_of_a_memory_needs_the_admin_scope_and_stays_in_the_tenant():
    context = make_context(keys={"tenant": "acme", "user": "ada"})
    record = _memory(context, f"acme's {SECRET}")
    writer = make_key(scopes=("read", "write"))
    assert writer.send("DELETE", f"/api/v1/memories/{record.pk}").status_code == 403
    other_tenant = make_key(scopes=("read", "write", "admin"), context_keys={"tenant": "zen"})
    assert other_tenant.send("DELETE", f"/api/v1/memories/{record.pk}").status_code == 404
    admin = make_key(scopes=("read", "write", "admin"), context_keys={"tenant": "acme"})
    response = admin.send("DELETE", f"/api/v1/memories/{record.pk}", {"note": "asked by ada"})
    assert response.status_code == 200, response.content
    event = AuditEvent.objects.get(pk=response.json()["audit_event_id"])
    assert response.json()["id"] == record.pk
    assert (event.action, event.note, event.actor) == ("purge", "asked by ada", admin.key.actor)
    assert admin.get(f"/api/v1/memories/{record.pk}").status_code == 404
    assert admin.send("DELETE", f"/api/v1/memories/{record.pk}").status_code == 404
    assert tables_holding(SECRET) == []


def test_the_dashboard_purges_a_memory_after_the_typed_phrase_for_admins_only(client):
    context = make_context()
    record = _memory(context, f"dashboard {SECRET}")
    url = reverse("memory-purge", args=[record.pk])
    client.force_login(make_user(role="curator"))
    assert client.post(url, {"confirmation": PURGE_CONFIRMATION}).status_code == 403
    admin = make_user(role="admin")
    client.force_login(admin)
    listing = client.get(reverse("memories") + f"?id={record.pk}").content.decode()
    assert f'action="{url}"' in listing and PURGE_CONFIRMATION in listing
    refused = client.post(url, {"confirmation": "purge"}, headers={"HX-Request": "true"})
    assert refused.status_code == 400 and "nothing was deleted" in refused.content.decode()
    assert MemoryRecord.objects.filter(pk=record.pk).exists()
    done = client.post(url, {"confirmation": PURGE_CONFIRMATION}, headers={"HX-Request": "true"})
    assert done.status_code == 200 and f"Memory {record.pk} purged" in done.content.decode()
    assert not MemoryRecord.objects.filter(pk=record.pk).exists()
    event = AuditEvent.objects.get(action="purge", target_type="memoryrecord")
    assert event.actor == f"user:{admin.username}"
    assert tables_holding(SECRET) == []


def test_deleting_a_context_in_the_admin_purges_everything_it_held(writer, client):
    run = traced_run(writer)
    context = run.context
    record = _memory(context, f"remember {SECRET}")
    memory_edit(record=record, actor=ACTOR, content=f"remember {SECRET} well")
    messages_append(context=context, items=[{"role": "user", "text": f"said {SECRET}"}])
    superuser = make_user(role=None, username="root")
    superuser.is_staff = superuser.is_superuser = True
    superuser.save()
    client.force_login(superuser)
    url = reverse("admin:memory_app_context_delete", args=[context.pk])
    client.post(url, {"post": "yes", "confirmation": PURGE_CONFIRMATION})
    assert not Context.objects.filter(pk=context.pk).exists()
    assert tables_holding(SECRET) == []
    assert AuditEvent.objects.filter(action="purge", target_type="memoryrecord").exists()


def test_a_span_of_a_purged_step_arriving_late_is_erased_on_arrival(writer):
    first = json.loads(FIRST)
    spans = first["resourceSpans"][0]["scopeSpans"][0]["spans"]
    tool = next(s for s in spans if s["spanId"] == TOOL1)
    spans.remove(tool)
    send(writer, json.dumps(first).encode())
    run = Run.objects.get(client_id=f"otel:{TRACE}")
    step = Step.objects.get(run=run, client_id=STEP1)
    curation.selected_purge(step_ids=[step.pk], confirmation=PURGE_CONFIRMATION, actor=ACTOR)
    assert tables_holding(SECRET) == []
    send(writer, otlp(tool))
    assert TraceSpan.objects.get(run=run, span_id=TOOL1).data == {"purged": True}
    assert not Step.objects.filter(run=run, client_id=STEP1).exists()
    assert tables_holding(SECRET) == []


# --- every statement on a context's rows names its context ------------------------------------

# The plain read by which a purge finds the contexts of the rows it was given (by their ids or
# by when they were pruned): the one statement on their rows that cannot name a context.
WHICH_CONTEXTS = re.compile(
    r'^SELECT (?:DISTINCT )?"(memory_app_\w+)"\."context_id" AS "context_id" FROM "\1" WHERE'
)


def _annotated_contexts(writer) -> list[tuple[Context, Run]]:
    """Two contexts, each with a run whose second step has a tool call, a message of that step
    with a vector, a score, a label and a comment on that message, step and run, and a memory
    made from them: the traced run's context (its steps made from spans) and a plain one."""
    register_models(**{"inline-3": 3})
    traced = traced_run(writer)
    send(writer, SECOND)
    plain = make_run(context=make_context(), steps=3)
    out = []
    for run in (traced, plain):
        step = Step.objects.get(context_id=run.context_id, run=run, position=2)
        assert step.tool_calls.exists()
        [message] = messages_append(
            context=run.context,
            items=[
                {
                    "role": "assistant",
                    "text": f"the word is {SECRET}",
                    "run_id": run.pk,
                    "step_id": step.pk,
                    "vector": [1, 0, 0],
                    "vector_model": "inline-3",
                }
            ],
        ).messages
        for row in (message, step, run):
            target = Target.of(row)
            score_set(actor=ACTOR, target=target, name="good", kind="numeric", value=1)
            label_add(actor=ACTOR, target=target, name="seen")
            comment_add(actor=ACTOR, target=target, text="noted")
        _memory(run.context, f"made from {run.pk}", source_message_id=message.pk)
        _memory(run.context, f"made from step {run.pk}", source_step_id=step.pk)
        out.append((run.context, run))
    return out


def _statements(queries) -> list[str]:
    return [q["sql"] for q in queries.captured_queries]


def _deleted_from(statements: list[str]) -> set[str]:
    """The tables (`memory_app_` left off) these statements delete from."""
    return {t for s in statements for t in re.findall(r'DELETE FROM "memory_app_(\w+)"', s)}


def _without_context(statements: list[str]) -> list[str]:
    """What `without_their_context` finds, the reads of which contexts aside."""
    return without_their_context([s for s in statements if not WHICH_CONTEXTS.match(s)])


def _prune_second_steps_and_messages(contexts) -> None:
    for context, run in contexts:
        step = Step.objects.get(context_id=context.pk, run=run, position=2)
        curation.steps_set_pruned(run=run, ids=[step.pk], pruned=True, actor=ACTOR)
        ids = list(Message.objects.filter(context=context).values_list("pk", flat=True))
        curation.messages_set_pruned(context=context, ids=ids, pruned=True, actor=ACTOR)


def test_a_purge_deletes_each_contexts_rows_and_what_they_take_along_in_that_context(writer):
    """Every statement a purge sends on messages, runs, steps, tool calls, vectors, scores,
    labels and comments names their context: the deletes and what they take along (Django's
    cascade went by the parents' ids alone), the trace spans the steps came from, the tool
    calls' edits. A store-wide purge finds its contexts first; a purge of one context names it
    in every statement."""
    contexts = _annotated_contexts(writer)
    _prune_second_steps_and_messages(contexts)
    (first, _), (second, _) = contexts
    later = timezone.now() + timedelta(seconds=1)
    with CaptureQueriesContext(connection) as one:
        curation.pruned_purge(
            older_than=later, confirmation=PURGE_CONFIRMATION, actor=ACTOR, context=first
        )
    assert without_their_context(_statements(one)) == []
    assert not Message.objects.filter(context=first).exists()
    assert Message.objects.filter(context=second).exists()
    with CaptureQueriesContext(connection) as every:
        events = curation.pruned_purge(
            older_than=later, confirmation=PURGE_CONFIRMATION, actor=ACTOR
        )
    assert {(e.context_id, e.target_type) for e in events} == {
        (second.pk, "message"),
        (second.pk, "step"),
    }
    deleted = _deleted_from(_statements(one) + _statements(every))
    assert deleted >= {"message", "step", "toolcall", "embedding", "score", "label", "comment"}
    assert _without_context(_statements(every)) == []
    assert tables_holding(SECRET) == []
    assert not Score.objects.filter(step__isnull=False).exists()
    assert Score.objects.filter(run__isnull=False, message=None, step=None).count() == 2
    assert not MemoryRecord.objects.exclude(source_message=None, source_step=None).exists()


def test_a_selected_purge_reads_and_deletes_each_contexts_rows_in_that_context(writer):
    """The Django admin's purge names messages, steps and runs by their ids alone: their
    contexts are read first, then every statement names one; retention's names the context of
    what it purges, which every statement then names."""
    contexts = _annotated_contexts(writer)
    (first, first_run), (second, second_run) = contexts
    in_first = {
        "message_ids": list(Message.objects.filter(context=first).values_list("pk", flat=True)),
        "run_ids": [first_run.pk],
    }
    with CaptureQueriesContext(connection) as retention:
        curation.selected_purge(
            **in_first, confirmation=PURGE_CONFIRMATION, actor=ACTOR, context_id=first.pk
        )
    assert without_their_context(_statements(retention)) == []
    assert not Run.objects.filter(context=first).exists()
    step = Step.objects.get(context_id=second.pk, run=second_run, position=2)
    with CaptureQueriesContext(connection) as admin:
        curation.selected_purge(
            message_ids=list(Message.objects.filter(context=second).values_list("pk", flat=True)),
            step_ids=[step.pk],
            run_ids=[second_run.pk],
            confirmation=PURGE_CONFIRMATION,
            actor=ACTOR,
        )
    assert _without_context(_statements(admin)) == []
    deleted = _deleted_from(_statements(retention) + _statements(admin))
    assert deleted >= {"message", "run", "step", "toolcall", "tracespan", "embedding", "score"}
    assert not Run.objects.filter(context__in=[first, second]).exists()
    assert not Score.objects.exists() and tables_holding(SECRET) == []


@pytest.mark.parametrize(
    ("on_delete", "own_table"),
    [("PROTECT", False), ("RESTRICT", False), ("SET_DEFAULT", False), ("CASCADE", True)],
)
def test_a_context_delete_refuses_what_only_djangos_collector_follows(on_delete, own_table):
    """A relation the context's delete does not follow as Django would (a protection, a
    default, a cascade within one table, which may cycle) is refused before any statement."""
    from types import SimpleNamespace

    from django.db import models

    from memory_app.services import context_delete

    related = Message if own_table else MemoryRecord
    field = SimpleNamespace(
        name="x",
        attname="x_id",
        model=related,
        remote_field=SimpleNamespace(on_delete=getattr(models, on_delete)),
    )
    relation = SimpleNamespace(field=field, related_model=related, model=Message)
    with CaptureQueriesContext(connection) as sent, pytest.raises(TypeError):
        context_delete._take_along(relation, context_id=1, ids=[1])
    assert not sent.captured_queries
