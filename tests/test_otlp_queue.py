"""OTLP exports are acknowledged once queued and mapped by the worker in bulk
(memory_app/services/span_queue.py): the same runs as mapping in the request, duplicate
deliveries kept once, the backlog in /healthz and on the run's page, and the worker mapping with
no embedding provider configured."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
import time
import zlib

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import Client
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from memory_app import backlog
from memory_app.models import Context, Run, SpanQueue, Step, ToolCall, TraceSpan
from memory_app.services import span_queue
from tests.api_helpers import make_key
from tests.builders import make_user
from tests.otel_agents import protobuf_body, traced_run
from tests.otlp_queue import map_queued

PROTO = "application/x-protobuf"
KEYS = {"agentmemory.context.user": "ada", "service.name": "weather-bot"}


def export(client, spans) -> dict:
    """POST the spans as an exporter does; the export's answer, not mapped yet."""
    response = client.client.generic(
        "POST", "/v1/traces", protobuf_body(spans), content_type=PROTO, **client._headers()
    )
    assert response.status_code == 200, response.content
    return response


@pytest.fixture(scope="module")
def tool_run():
    return traced_run("tool_calling", resource=KEYS)


@pytest.fixture(scope="module")
def code_run():
    return traced_run("code", resource=KEYS)


@pytest.fixture
def writer():
    return make_key(scopes=("read", "write"))


def snapshot() -> list[dict]:
    """Every run with its steps and tool calls, without ids and server times."""
    dropped = {"id", "context_id", "run_id", "step_id", "created_at", "updated_at"}

    def plain(row: dict) -> dict:
        return {k: v for k, v in row.items() if k not in dropped}

    out = []
    for run in Run.objects.order_by("client_id").values():
        steps = []
        for step in Step.objects.filter(run_id=run["id"]).order_by("position").values():
            calls = ToolCall.objects.filter(step_id=step["id"]).order_by("position").values()
            steps.append({**plain(step), "tool_calls": [plain(c) for c in calls]})
        out.append({**plain(run), "steps": steps})
    return out


def mapped_as(way: str, writer, batches: list[list]) -> list[dict]:
    """The runs the batches make when mapped `way`, rolled back afterwards."""
    with transaction.atomic():
        for batch in batches:
            if way == "inline":
                from django.conf import settings

                settings.AGENTMEMORY_OTLP_MAP_INLINE = True
                try:
                    export(writer, batch)
                finally:
                    settings.AGENTMEMORY_OTLP_MAP_INLINE = False
            else:
                export(writer, batch)
                if way == "queued, mapped after each export":
                    map_queued()
        map_queued()
        assert not SpanQueue.objects.exists()
        runs = snapshot()
        transaction.set_rollback(True)
    return runs


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["tool_run", "code_run"])
def test_queued_exports_map_into_the_runs_mapping_in_the_request_makes(writer, kind, request):
    _, spans = request.getfixturevalue(kind)
    by_end = sorted(spans, key=lambda s: s.end_time)
    half = len(by_end) // 2
    # Children before parents, in two exports, as a batch processor sends a run.
    batches = [by_end[:half], by_end[half:]]
    inline = mapped_as("inline", writer, batches)
    assert len(inline) == 1 and inline[0]["status"] == "success" and inline[0]["steps"]
    # Both exports mapped in one batch (every span new: written in bulk), and mapped one
    # export at a time (the second brings the trace of a run already written up to date).
    assert mapped_as("queued, mapped together", writer, batches) == inline
    assert mapped_as("queued, mapped after each export", writer, batches) == inline


@pytest.mark.django_db
def test_an_export_is_answered_before_its_spans_are_mapped_and_healthz_shows_the_backlog(
    writer, tool_run, client
):
    _, spans = tool_run
    assert client.get("/healthz").json()["spans_queued"] == 0
    assert client.get("/healthz").json()["spans_queued_oldest_seconds"] is None
    export(writer, spans)
    assert not Run.objects.exists() and not TraceSpan.objects.exists()
    health = client.get("/healthz").json()
    assert health["spans_queued"] == len(spans)
    assert 0 <= health["spans_queued_oldest_seconds"] < 60
    assert map_queued() == len(spans)
    health = client.get("/healthz").json()
    assert (health["spans_queued"], health["spans_queued_oldest_seconds"]) == (0, None)
    assert Run.objects.get().status == "success"


@pytest.mark.django_db
def test_duplicate_deliveries_queued_side_by_side_make_one_run(writer, tool_run):
    """An exporter retries an export whose answer it did not get: both copies are queued before
    the worker maps either; every span, step and tool call is kept once."""
    _, spans = tool_run
    by_end = sorted(spans, key=lambda s: s.end_time)
    export(writer, by_end[:4])
    export(writer, by_end)
    export(writer, by_end[:4])
    assert SpanQueue.objects.count() == 3
    map_queued()
    once = snapshot()
    assert TraceSpan.objects.count() == len(spans)
    # Sent again once mapped: answered from what is kept, nothing queued, nothing new.
    export(writer, by_end)
    assert not SpanQueue.objects.exists()
    assert snapshot() == once and len(once) == 1


@pytest.mark.django_db
def test_the_run_page_marks_a_run_whose_spans_are_still_being_mapped(writer, tool_run):
    _, spans = tool_run
    by_end = sorted(spans, key=lambda s: s.end_time)
    export(writer, by_end[:-1])
    map_queued()
    run = Run.objects.get()
    export(writer, by_end[-1:])  # the root: the run's outcome, still queued
    web = Client()
    web.force_login(make_user(role="viewer"))
    page = web.get(f"/runs/{run.pk}/", follow=True)
    assert "spans still being mapped" in page.content.decode()
    live = web.get(f"/runs/{run.pk}/live/?after=0&position=1&tail=1")
    assert "spans still being mapped" in live.content.decode()
    map_queued()
    page = web.get(f"/runs/{run.pk}/", follow=True)
    assert "spans still being mapped" not in page.content.decode()
    assert Run.objects.get().status == "success"


@pytest.mark.django_db
def test_the_embed_worker_maps_the_queue_with_no_embedding_provider(writer, tool_run, settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    _, spans = tool_run
    export(writer, spans)
    out = io.StringIO()
    call_command("embed_worker", "--once", "--idle-sleep", "0", stdout=out)
    assert "no embedding provider configured" in out.getvalue()
    assert not SpanQueue.objects.exists()
    assert Run.objects.get().status == "success"


@pytest.mark.django_db
def test_an_export_the_mapping_refuses_is_set_aside_and_the_rest_still_maps(
    writer, tool_run, client, caplog
):
    _, spans = tool_run
    broken = Context.objects.create(keys={"broken": "1"}, keys_digest="broken-1")
    SpanQueue.objects.create(
        context=broken, trace_ids=["ab" * 16], span_count=1, payload=json.dumps([{"x": 1}])
    )
    export(writer, spans)
    map_queued()
    assert Run.objects.get().status == "success"
    kept = SpanQueue.objects.get()
    assert kept.context_id == broken.pk and "KeyError" in kept.error
    health = client.get("/healthz").json()
    assert (health["spans_queued"], health["spans_set_aside"]) == (0, 1)
    assert "span mapping failed" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_the_indexer_thread_maps_an_export_once_it_commits(settings, tool_run):
    settings.AGENTMEMORY_INDEXER_THREAD = True
    writer = make_key(scopes=("write",))
    _, spans = tool_run
    export(writer, spans)
    assert backlog.indexer.wait_idle(120)
    assert not SpanQueue.objects.exists()
    assert Run.objects.get().status == "success"
    assert span_queue.spans_map_batch() is None


@pytest.mark.django_db(transaction=True)
def test_with_the_mapping_thread_off_the_embed_worker_alone_maps(settings, tool_run):
    """AGENTMEMORY_OTLP_MAP_THREAD off: the web processes' indexer threads leave the queue to
    a mapper process of its own (`embed_worker`)."""
    settings.AGENTMEMORY_INDEXER_THREAD = True
    settings.AGENTMEMORY_OTLP_MAP_THREAD = False
    writer = make_key(scopes=("write",))
    _, spans = tool_run
    export(writer, spans)
    backlog.indexer.wake()  # as any other write wakes it
    assert backlog.indexer.wait_idle(120)
    assert SpanQueue.objects.get().span_count == len(spans)
    assert span_queue.spans_map_drain() is None
    call_command("embed_worker", "--once", "--idle-sleep", "0", stdout=io.StringIO())
    assert not SpanQueue.objects.exists()
    assert Run.objects.get().status == "success"


@pytest.mark.django_db
def test_an_embed_worker_turn_maps_batch_after_batch_while_spans_are_queued(
    writer, tool_run, code_run
):
    """A mapper process chasing a stream of exports maps every queued context in one turn,
    not one context's batch a turn with the turn's other work between them."""
    for keys, (_, spans) in (
        (KEYS, tool_run),
        ({**KEYS, "agentmemory.context.user": "grace"}, code_run),
    ):
        request = _request(spans)
        for kv in request.resource_spans[0].resource.attributes:
            if kv.key in keys:
                kv.value.string_value = keys[kv.key]
        assert _post_raw(writer, request).status_code == 200
    assert SpanQueue.objects.values("context_id").distinct().count() == 2
    assert span_queue.spans_map_chore() == len(tool_run[1]) + len(code_run[1])
    assert not SpanQueue.objects.exists()
    assert Run.objects.filter(status="success").count() == 2


@pytest.mark.django_db(transaction=True)
def test_an_export_is_acknowledged_while_its_context_is_being_mapped(tool_run, code_run):
    """The mapper's lock on a context keeps out its writers, not the receiver: an export into
    a context whose batch is being mapped is queued at once, not after the batch commits."""
    import threading

    from django.db import connection, connections

    writer = make_key(scopes=("write",))
    export(writer, tool_run[1])
    map_queued()
    context_id = Run.objects.get().context_id
    locked, release = threading.Event(), threading.Event()

    def mapping() -> None:
        try:
            with transaction.atomic():
                assert span_queue.lock_context(context_id, wait=True) is not None
                locked.set()
                release.wait(60)
        finally:
            connections.close_all()

    mapper = threading.Thread(target=mapping)
    mapper.start()
    try:
        assert locked.wait(60)
        with connection.cursor() as cursor:
            # Waiting for the mapper would fail the export (a 503) instead of hanging the test.
            cursor.execute("SET lock_timeout = '5s'")
        try:
            export(writer, code_run[1])
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        assert SpanQueue.objects.get().context_id == context_id
    finally:
        release.set()
        mapper.join(60)
    assert map_queued() == len(code_run[1])


def _bench_export(stamp: str, traces: int) -> bytes:
    """The benchmark's export of `traces` smolagents-shaped runs over its eight sessions, in
    the contexts of one fixed name whatever the stamp (the stamp makes the trace ids)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from memory_app.bench.otlp import _exports

    (body,) = _exports(stamp, traces)
    request = ExportTraceServiceRequest.FromString(body)
    for resource_spans in request.resource_spans:
        for kv in resource_spans.resource.attributes:
            if kv.key == "agentmemory.context.bench":
                kv.value.string_value = "statements"
    return request.SerializeToString()


@pytest.mark.django_db
def test_acknowledging_and_mapping_cost_the_same_statements_whatever_the_spans(writer):
    """Nothing is read or written span by span: an export of 512 spans is acknowledged, and a
    context's batch mapped, in the statements one of 128 spans takes (the contexts exist)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def post(body: bytes):
        response = writer.client.generic(
            "POST", "/v1/traces", body, content_type=PROTO, **writer._headers()
        )
        assert response.status_code == 200, response.content

    post(_bench_export("warm", 8))  # makes the eight contexts
    map_queued()
    counts = []
    for stamp, traces in (("small", 8), ("large", 32)):
        with CaptureQueriesContext(connection) as acknowledged:
            post(_bench_export(stamp, traces))
        with CaptureQueriesContext(connection) as mapping:
            assert map_queued() == traces * 16
        counts.append((len(acknowledged), len(mapping)))
    assert counts[0] == counts[1], counts
    assert Run.objects.filter(status="success").count() == 8 + 8 + 32


def _request(spans) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(protobuf_body(spans))


def _post_raw(client, request: ExportTraceServiceRequest):
    return client.client.generic(
        "POST", "/v1/traces", request.SerializeToString(), content_type=PROTO, **client._headers()
    )


def _nul_in(where: str, request: ExportTraceServiceRequest) -> None:
    """Put a NUL character in one text the mapping keeps; the span also holds numbers whose
    encoding has 0 bytes (0, 1.0), as most spans with token counts do."""
    rs = request.resource_spans[0]
    span = rs.scope_spans[0].spans[2]
    span.attributes.add(key="retries", value=AnyValue(int_value=0))
    span.attributes.add(key="temperature", value=AnyValue(double_value=1.0))
    if where == "span name":
        span.name = "bad\x00name"
    elif where == "attribute value":
        span.attributes.add(key="note", value=AnyValue(string_value="a\x00b"))
    elif where == "attribute key":
        span.attributes.add(key="no\x00te", value=AnyValue(string_value="ab"))
    elif where == "nested value":
        nested = AnyValue()
        nested.kvlist_value.values.add(key="inner", value=AnyValue(string_value="x\x00"))
        span.attributes.add(key="nested", value=nested)
    elif where == "array value":
        array = AnyValue()
        array.array_value.values.add(string_value="\x00")
        span.attributes.add(key="list", value=array)
    elif where == "event":
        span.events.add(name="exception", time_unix_nano=span.start_time_unix_nano).attributes.add(
            key="exception.message", value=AnyValue(string_value="boom\x00")
        )
    elif where == "status message":
        span.status.message = "failed\x00"
    elif where == "resource":
        rs.resource.attributes.add(key="host.name", value=AnyValue(string_value="h\x00"))
    elif where == "scope name":
        rs.scope_spans[0].scope.name = "scope\x00"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "where",
    [
        "span name",
        "attribute value",
        "attribute key",
        "nested value",
        "array value",
        "event",
        "status message",
        "resource",
        "scope name",
    ],
)
def test_a_nul_anywhere_the_mapping_keeps_refuses_the_export_with_nothing_queued(
    writer, tool_run, where
):
    _, spans = tool_run
    request = _request(spans)
    _nul_in(where, request)
    response = _post_raw(writer, request)
    assert response.status_code == 400, response.content
    assert "NUL" in Status.FromString(response.content).message
    assert not SpanQueue.objects.exists() and not Context.objects.exists()


@pytest.mark.django_db
def test_zero_bytes_outside_text_are_accepted_and_mapped_as_sent(writer, tool_run):
    """Numbers, empty texts, ids and times hold 0 bytes on the wire: the export is read text by
    text, accepted, and the values come back as sent."""
    _, spans = tool_run
    request = _request(spans)
    span = request.resource_spans[0].scope_spans[0].spans[2]
    span.attributes.add(key="retries", value=AnyValue(int_value=0))
    span.attributes.add(key="temperature", value=AnyValue(double_value=1.0))
    span.attributes.add(key="empty", value=AnyValue(string_value=""))
    span.attributes.add(key="blob", value=AnyValue(bytes_value=b"\x00\x01"))
    assert _post_raw(writer, request).status_code == 200
    map_queued()
    kept = TraceSpan.objects.get(span_id=span.span_id.hex()).data["attributes"]
    assert (kept["retries"], kept["temperature"], kept["empty"]) == (0, 1.0, "")
    assert kept["blob"] == "AAE="


@pytest.mark.django_db
def test_each_context_queues_its_own_spans_and_only_those_not_kept(writer, tool_run, code_run):
    """An export holding two contexts' traces is queued as two rows, each the protobuf of its
    context's spans (zlib-compressed); sent again with one span more, only that span is
    queued."""
    _, tools = tool_run
    _, code = code_run
    request = _request(tools)
    other = _request(code).resource_spans[0]
    for kv in other.resource.attributes:
        if kv.key == "agentmemory.context.user":
            kv.value.string_value = "grace"
    request.resource_spans.append(other)
    by_end = sorted(tools, key=lambda s: s.end_time)
    assert _post_raw(writer, request).status_code == 200
    rows = {row.context.keys["user"]: row for row in SpanQueue.objects.select_related("context")}
    assert set(rows) == {"ada", "grace"}
    for user, spans in (("ada", tools), ("grace", code)):
        queued = ExportTraceServiceRequest.FromString(zlib.decompress(rows[user].body))
        ids = {s.span_id for r in queued.resource_spans for ss in r.scope_spans for s in ss.spans}
        assert ids == {s.context.span_id.to_bytes(8, "big") for s in spans}
        assert rows[user].span_count == len(spans)
    map_queued()
    SpanQueue.objects.all().delete()
    TraceSpan.objects.filter(span_id=f"{by_end[0].context.span_id:016x}").delete()
    assert _post_raw(writer, request).status_code == 200
    (row,) = SpanQueue.objects.all()
    queued = ExportTraceServiceRequest.FromString(zlib.decompress(row.body))
    (span,) = [s for r in queued.resource_spans for ss in r.scope_spans for s in ss.spans]
    assert span.span_id == by_end[0].context.span_id.to_bytes(8, "big")
    assert row.span_count == 1


@pytest.mark.django_db
def test_an_export_queued_uncompressed_before_an_upgrade_still_maps(writer, tool_run):
    """A row a receiver of the version before queued (the protobuf as it came, not compressed)
    maps into the run a compressed one makes."""
    export(writer, tool_run[1])
    row = SpanQueue.objects.get()
    row.body = zlib.decompress(row.body)
    row.save(update_fields=["body"])
    assert map_queued() == len(tool_run[1])
    (run,) = Run.objects.all()
    assert (run.status, run.steps.count()) == ("success", Step.objects.count())
    assert run.steps.count() > 1


def test_a_system_prompt_is_found_however_its_role_is_written():
    """The mapping skips model calls whose span cannot name a system message without building
    their messages; a role written with a JSON escape is still read."""
    from memory_app.interop.otlp_steps import system_prompt

    def llm(start: int, attributes: dict) -> dict:
        return {"start_ns": start, "attributes": attributes, "events": [], "logs": []}

    user = llm(1, {"llm.input_messages.0.message.role": "user"})
    plain = {"llm.input_messages.0.message.role": "system"}
    plain["llm.input_messages.0.message.content"] = "Be brief."
    text = '[{"role": "\\u0073ystem", "parts": [{"type": "text", "content": "Be brief."}]}]'
    escaped = {"gen_ai.input.messages": text}
    assert system_prompt([user, llm(2, plain)]) == "Be brief."
    assert system_prompt([user, llm(2, escaped)]) == "Be brief."
    assert system_prompt([user]) == ""


def _nice(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own nice value is Linux's")
@pytest.mark.django_db(transaction=True)
def test_the_mapping_thread_and_its_server_process_yield_to_the_requests(settings):
    """The indexer thread maps at the background priority, and so does the PostgreSQL process
    serving it; the process's other threads (the requests) keep theirs."""
    from django.db import connection

    settings.AGENTMEMORY_OTLP_MAP_NICE = 5
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    seen = {}

    def drain():
        try:
            connection.ensure_connection()
            server = connection.connection.info.backend_pid
            seen["local"] = os.path.exists(f"/proc/{server}/comm")
            if not seen["local"]:
                return
            before = (os.getpriority(os.PRIO_PROCESS, 0), _nice(server))
            span_queue.spans_map_drain()
            after = (os.getpriority(os.PRIO_PROCESS, 0), _nice(server))
            seen["raised"] = (after[0] - before[0], after[1] - before[1])
            seen["room"] = (19 - before[0], 19 - before[1])
        finally:
            connection.close()

    thread = threading.Thread(target=drain)
    thread.start()
    thread.join(30)
    if not seen["local"]:
        pytest.skip("the database server runs on another machine")
    assert seen["raised"] == (min(5, seen["room"][0]), min(5, seen["room"][1]))
    assert seen["raised"][0] > 0 and seen["raised"][1] > 0
    assert os.getpriority(os.PRIO_PROCESS, 0) == ours


@pytest.mark.slow
def test_serve_maps_the_exports_in_its_own_process_and_not_in_the_web_workers(tmp_path, tool_run):
    import httpx
    import psutil

    from tests.test_faults import Serve, _secret, _wait

    server = Serve(tmp_path / "data")
    try:
        gunicorn = [
            p
            for p in psutil.Process(server.proc.pid).children(recursive=True)
            if "gunicorn" in " ".join(p.cmdline())
        ]
        assert gunicorn, server.output
        # The web workers leave the queue alone: serve's own process maps it.
        assert {p.environ().get("AGENTMEMORY_OTLP_MAP_THREAD") for p in gunicorn} == {"false"}
        headers = {"Authorization": f"Bearer {_secret(server)}", "Content-Type": PROTO}
        answer = httpx.post(
            f"{server.url}/v1/traces", content=protobuf_body(tool_run[1]), headers=headers
        )
        assert answer.status_code == 200, answer.text

        def mapped() -> bool:
            health = httpx.get(f"{server.url}/healthz").json()
            runs = server.command(
                "shell", "-c", "from memory_app.models import Run; print(Run.objects.count())"
            )
            return health["spans_queued"] == 0 and runs.split()[-1] == "1"

        _wait(mapped, 60, "the export mapped by serve's process")
    finally:
        server.stop()
    assert "OTLP mapping failed" not in server.output


def _waits_told(monkeypatch) -> threading.Event:
    """Set each time an idle mapper starts waiting (after its look at the queue)."""
    waiting = threading.Event()
    wait = span_queue.ExportWait.__call__

    def told(self, seconds):
        waiting.set()
        return wait(self, seconds)

    monkeypatch.setattr(span_queue.ExportWait, "__call__", told)
    return waiting


@pytest.mark.django_db(transaction=True)
def test_serve_s_idle_mapper_starts_when_an_export_commits(settings, monkeypatch, tool_run):
    """serve's mapper waits on a listening connection of its own: an export a web worker
    queues is mapped once it commits, not when the mapper next looks at the queue (an hour on
    here), and the mapper stops promptly while it waits."""
    import psycopg
    from django.db import connection

    from memory_app.management.commands.serve import SpanMapper
    from tests.test_faults import _wait

    settings.AGENTMEMORY_OTLP_MAP_THREAD = False  # as serve's web workers run
    monkeypatch.setattr(SpanMapper, "RESCAN_SECONDS", 3600.0)
    waiting = _waits_told(monkeypatch)
    writer = make_key(scopes=("read", "write"))
    mapper = SpanMapper()
    try:
        for expected in (1, 2):
            spans = (tool_run if expected == 1 else traced_run("code", resource=KEYS))[1]
            # Sent once the mapper waits (its look done), so only being told maps it.
            assert waiting.wait(30), "the mapper never waited"
            waiting.clear()
            export(writer, spans)
            _wait(
                lambda n=expected: Run.objects.count() == n and not SpanQueue.objects.exists(),
                30,
                f"export {expected} mapped by the idle mapper",
            )
        # An export of a context a writer holds: told, the mapper finds it held and looks again
        # soon (no export tells of the writer's end), not an hour on.
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params) as holder:
            holder.execute(
                "SELECT 1 FROM memory_app_context WHERE id = %s FOR NO KEY UPDATE",
                [Context.objects.get().pk],
            )
            assert waiting.wait(30), "the mapper never waited"
            waiting.clear()
            export(writer, traced_run("tool_calling", resource=KEYS)[1])
            assert waiting.wait(30), "the mapper never looked at the held context's export"
            assert SpanQueue.objects.exists()
            holder.rollback()
        _wait(
            lambda: Run.objects.count() == 3 and not SpanQueue.objects.exists(),
            30,
            "the held context's export mapped once its writer was done",
        )
    finally:
        started = time.monotonic()
        mapper.stop()
        stopped_in = time.monotonic() - started
    assert not mapper._thread.is_alive()
    assert stopped_in < 5, stopped_in


@pytest.mark.django_db(transaction=True)
def test_an_idle_embed_worker_maps_an_export_as_it_commits(settings, monkeypatch, tool_run):
    """A mapper process (`embed_worker`) idle for its whole sleep (an hour here) starts when
    an export is queued, and stops promptly while it waits."""
    from django.db import connection

    from tests.test_faults import _wait

    settings.AGENTMEMORY_OTLP_MAP_THREAD = False
    writer = make_key(scopes=("read", "write"))
    waiting = _waits_told(monkeypatch)
    stop = threading.Event()
    idle = span_queue.ExportWait(stop)
    idle.listen()  # as embed_worker does, before its first look at the queue

    def work():
        try:
            backlog.run_worker(
                provider=None,
                idle_sleep=3600,
                stop=stop,
                chores=[span_queue.spans_map_chore],
                idle=idle,
            )
        finally:
            connection.close()

    worker = threading.Thread(target=work, daemon=True)  # a failure here must not hang the run
    worker.start()
    try:
        assert waiting.wait(30), "the worker never waited"
        export(writer, tool_run[1])
        _wait(
            lambda: Run.objects.count() == 1 and not SpanQueue.objects.exists(),
            30,
            "the export mapped by the idle worker",
        )
    finally:
        stop.set()
        worker.join(10)
        idle.close()
    assert not worker.is_alive()


@pytest.mark.django_db
def test_the_exports_listener_notices_a_dead_peer_by_keepalives():
    """An idle listener sends nothing: TCP keepalives are what notice a server gone without a
    word. Asked for on its connection (a Unix socket ignores them)."""
    listener = span_queue.exports_listener()
    try:
        asked = listener.info.get_parameters()
    finally:
        listener.close()
    assert asked["keepalives"] == "1"
    # A dead peer noticed within two minutes.
    idle, every, count = (int(asked[f"keepalives_{n}"]) for n in ("idle", "interval", "count"))
    assert idle + count * every <= 120


def test_a_listener_that_cannot_connect_warns_once_an_outage(monkeypatch):
    """While the database cannot be reached, every idle wait tries to listen again; the first
    failure is logged, the others are not, until listening works again."""
    import psycopg

    failing = [True]
    opened = []

    class Listening:
        def notifies(self, timeout, stop_after):
            return iter(())

        def close(self):
            pass

    def connect():
        if failing[0]:
            raise psycopg.OperationalError("connection refused")
        opened.append(Listening())
        return opened[-1]

    monkeypatch.setattr(span_queue, "exports_listener", connect)
    wait = span_queue.ExportWait(threading.Event())
    # A handler on the logger itself, the logger enabled: a logging configuration applied
    # after the module was imported (as some tests of the suite apply one) disables it, and may
    # keep its records from the root.
    said = []
    heard = logging.Handler(logging.INFO)
    heard.emit = lambda record: said.append(record.getMessage())
    level = span_queue.log.level
    monkeypatch.setattr(span_queue.log, "disabled", False)
    span_queue.log.addHandler(heard)
    span_queue.log.setLevel(logging.INFO)
    try:
        for _ in range(3):
            wait.listen()
        failing[0] = False
        wait.listen()
        wait.close()
        failing[0] = True
        wait.listen()
    finally:
        span_queue.log.removeHandler(heard)
        span_queue.log.setLevel(level)
    assert said == [
        "not listening for exports (connection refused)",
        "listening for exports again",
        "not listening for exports (connection refused)",
    ]
    assert len(opened) == 1
