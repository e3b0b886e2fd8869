"""OTLP ingest (measured after ingest: it writes): how fast an export is acknowledged, and how
many spans a second become runs and steps, against mapping in the request
(AGENTMEMORY_OTLP_MAP_INLINE, what the receiver did before it queued).

In this process (Django's test client, the mapper called directly): the acknowledgement and one
mapper draining the queue. As deployed: the site served as `manage.py serve` serves it
(gunicorn, its default three uvicorn workers), the exports sent over HTTP one after another as
an exporter sends them, timed from the first export to the last span mapped, the mapping done
either by the web workers' indexer threads or by one or two mapper processes (`manage.py
embed_worker` with AGENTMEMORY_OTLP_MAP_THREAD off in the web workers). `serve`'s default is
the one mapper process's shape: it maps in a thread of its own process, beside gunicorn's.

The traces are smolagents-shaped (OpenInference): an agent span, steps each holding a model call
and a tool call, sent as a BatchSpanProcessor sends them: up to 512 spans an export, children
before parents, the spans of many agents running at once interleaved, several sessions (contexts)
of one service.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from urllib.parse import quote

from django.conf import settings
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from memory_app.bench.harness import Bench, BenchError
from memory_app.bench.http_path import _Http, _served, stop_processes
from memory_app.bench.measure import Amount, Latency, Rate, Row, Target
from memory_app.models import Run, SpanQueue, Step
from memory_app.services.span_queue import spans_map_pending

EXPORT_SPANS = 512  # the OpenTelemetry SDK's BatchSpanProcessor default
STEPS = 5  # per run: 1 + 3 * STEPS spans a trace
SESSIONS = 8  # contexts the traces spread over
CONCURRENT = 40  # agents whose spans interleave in the exports
PROTOBUF = "application/x-protobuf"
WEB_WORKERS = 3  # `manage.py serve`'s default (AGENTMEMORY_WORKERS)
# Who maps the queue in the served rows: the environment of the web workers, and how many
# mapper processes run beside them.
_OFF = {"AGENTMEMORY_OTLP_MAP_THREAD": "0"}
SHAPES = (
    ("the web workers' indexer threads (AGENTMEMORY_OTLP_MAP_THREAD=1)", {}, 0),
    ("a mapper process (serve's default shape; embed_worker, MAP_THREAD=0)", _OFF, 1),
    ("two mapper processes (embed_worker ×2, AGENTMEMORY_OTLP_MAP_THREAD=0)", _OFF, 2),
)


def otlp(b: Bench) -> None:
    # 48,000 spans in 94 exports: a row's p95 is its 6th slowest export (of 32 exports, the 3rd,
    # which moves by tens of milliseconds from run to run).
    traces = 40 if b.quick else 3000
    stamp = str(int(time.time()))
    threaded, settings.AGENTMEMORY_INDEXER_THREAD = settings.AGENTMEMORY_INDEXER_THREAD, False
    try:
        # The baseline maps each export in its request, slowly: a hundred traces tell its rate.
        inline = _inline(b, _exports(f"{stamp}-inline", max(traces // 30, 8)))
        queued, map_rate = _queued_then_mapped(b, _exports(f"{stamp}-queued", traces))
    finally:
        settings.AGENTMEMORY_INDEXER_THREAD = threaded
    spans = traces * (1 + 3 * STEPS)
    b.report.add(
        Row(
            "ingest (OTLP)",
            f"export acknowledged ({EXPORT_SPANS} spans), p95",
            Amount(queued.p95, "ms"),
            Amount(inline[0].p95, "ms"),
            Target("<=", 50, "p95 ≤ 50 ms"),
            note=f"queued; p50 {queued.p50:.1f} ms; baseline: mapped in the request",
        ),
        b.log,
    )
    b.report.add(
        Row(
            "ingest (OTLP)",
            f"spans mapped into runs and steps ({spans:,} spans, {traces:,} runs)",
            map_rate,
            inline[1],
            Target(">=", 2000, "≥ 2,000 spans/s"),
            note="one mapper draining the queue (spans_map_pending); baseline: mapped in the "
            "request, export by export",
        ),
        b.log,
    )
    # Quick: the first shape alone, on one worker (a smoke test of the rows, which start a
    # server each).
    workers = 1 if b.quick else WEB_WORKERS
    for number, shape in enumerate(SHAPES[:1] if b.quick else SHAPES):
        served = f"{stamp}-served{number}"
        warm = _exports(served, EXPORT_SPANS * workers // (1 + 3 * STEPS), seed="warm")
        _served_sustained(b, _exports(served, traces), warm, spans, shape, workers)


def _post(b: Bench, body: bytes) -> float:
    t = time.perf_counter()
    response = b.api.generic("POST", "/v1/traces", body, content_type=PROTOBUF)
    elapsed = (time.perf_counter() - t) * 1000
    if response.status_code != 200:
        raise BenchError(f"POST /v1/traces answered {response.status_code}")
    return elapsed


def _latency(samples: list[float]) -> Latency:
    ordered = sorted(samples)
    at = lambda q: ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]  # noqa: E731
    return Latency(p50=at(0.5), p95=at(0.95), n=len(samples))


def _inline(b: Bench, exports: list[bytes]) -> tuple[Latency, Rate]:
    """The same exports mapped in their requests."""
    settings.AGENTMEMORY_OTLP_MAP_INLINE = True
    try:
        t = time.perf_counter()
        acks = [_post(b, body) for body in exports]
        elapsed = time.perf_counter() - t
    finally:
        settings.AGENTMEMORY_OTLP_MAP_INLINE = False
    return _latency(acks), Rate(_span_count(exports) / elapsed, "spans/s")


def _span_count(exports: list[bytes]) -> int:
    return sum(
        len(ss.spans)
        for body in exports
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans
        for ss in rs.scope_spans
    )


def _queued_then_mapped(b: Bench, exports: list[bytes]) -> tuple[Latency, Rate]:
    acks = [_post(b, body) for body in exports]
    waiting = _queued_spans()
    t = time.perf_counter()
    mapped = spans_map_pending()
    elapsed = time.perf_counter() - t
    if mapped != waiting or SpanQueue.objects.exists():
        raise BenchError(f"{mapped:,} spans mapped of {waiting:,} queued")
    _check_runs(exports)
    return _latency(acks), Rate(mapped / elapsed, "spans/s")


def _served_sustained(
    b: Bench, exports: list[bytes], warm: list[bytes], spans: int, shape, workers: int
) -> None:
    """The exports sent over HTTP to the served site, one after another on one connection,
    while the queue is mapped as `shape` says; timed from the first export until no span is
    left queued. The `warm` exports go first, each on a connection of its own at once (one
    to each worker, as likely as not), and are mapped before the clock starts: a worker's
    first request and first mapping pay for what the process loads once."""
    who, web_env, mappers = shape
    env = _served_env()
    site = ["agentmemory_site.asgi:application"]
    headers = {"Authorization": f"Bearer {b.api_secret}", "Content-Type": PROTOBUF}
    with (
        _served(site, {**env, **web_env}, workers=workers, preload=True) as ((port, _),),
        _mappers(env, mappers),
    ):
        _warm_up(port, headers, warm)
        client = _Http(port, headers)
        acks = []
        t = time.perf_counter()
        for body in exports:
            sent = time.perf_counter()
            client.post("/v1/traces", body)
            acks.append((time.perf_counter() - sent) * 1000)
        _wait_mapped()
        elapsed = time.perf_counter() - t
        client.conn.close()
    _check_runs(exports)
    ack = _latency(acks)
    plural = "s" if workers > 1 else ""
    served = f"served over HTTP ({workers} uvicorn worker{plural}), mapped by {who}"
    b.report.add(
        Row(
            "ingest (OTLP)",
            f"exports until every span is mapped ({spans:,} spans), {served}",
            Rate(spans / elapsed, "spans/s"),
            None,
            Target(">=", 2000, "≥ 2,000 spans/s"),
            note=f"from the first export sent to the last span mapped; ack p50 {ack.p50:.1f} ms",
        ),
        b.log,
    )
    b.report.add(
        Row(
            "ingest (OTLP)",
            f"export acknowledged ({EXPORT_SPANS} spans), p95, {served}",
            Amount(ack.p95, "ms"),
            None,
            Target("<=", 50, "p95 ≤ 50 ms"),
            note=f"timed by the client, the mapping running meanwhile; p50 {ack.p50:.1f} ms",
        ),
        b.log,
    )


def _served_env() -> dict[str, str]:
    """The environment of a served process: this run's database, no embedding provider,
    warnings logged and worse."""
    from memory_app.bench.database import conninfo

    info = conninfo()
    url = f"postgresql://{quote(info.get('user', ''))}:@/{info['dbname']}?host={info['host']}"
    return {
        **os.environ,
        "DATABASE_URL": url,
        "AGENTMEMORY_EMBEDDING_PROVIDER": "none",
        # The mappers log every batch at INFO: not in the benchmark's output.
        "AGENTMEMORY_LOG_LEVEL": "WARNING",
    }


@contextmanager
def _mappers(env: dict[str, str], count: int):
    """`count` processes of `manage.py embed_worker` running beside the served site, idle as
    deployed (their default sleep, an export's commit telling them to start); stopped by their
    own process ids on the way out."""
    command = [sys.executable, "manage.py", "embed_worker"]
    procs = []
    try:
        for _ in range(count):
            procs.append(
                subprocess.Popen(command, env=env, cwd=settings.BASE_DIR, stdout=subprocess.DEVNULL)
            )
        yield
    finally:
        stop_processes(procs)


def _warm_up(port: int, headers: dict[str, str], exports: list[bytes]) -> None:
    def send(body: bytes) -> None:
        client = _Http(port, headers)
        client.post("/v1/traces", body)
        client.conn.close()

    with ThreadPoolExecutor(len(exports)) as pool:
        list(pool.map(send, exports))
    _wait_mapped()


def _wait_mapped(timeout: float = 600) -> None:
    """Until no export is left queued (the mapping runs in other processes: looked at every
    10 ms)."""
    deadline = time.monotonic() + timeout
    while SpanQueue.objects.filter(error="").exists():
        if time.monotonic() > deadline:
            raise BenchError("the served site did not map the queued exports")
        time.sleep(0.01)
    if SpanQueue.objects.exists():
        raise BenchError("the mapping set queued exports aside")


def _queued_spans() -> int:
    return sum(SpanQueue.objects.values_list("span_count", flat=True))


def _check_runs(exports: list[bytes]) -> None:
    trace_ids = {
        span.trace_id.hex()
        for body in exports
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    }
    client_ids = [f"otel:{t}" for t in trace_ids]
    runs = Run.objects.filter(client_id__in=client_ids, status="success").count()
    steps = Step.objects.filter(run__client_id__in=client_ids).count()
    # Each run: its task step and one action step per STEP span.
    if runs != len(trace_ids) or steps != len(trace_ids) * (1 + STEPS):
        raise BenchError(
            f"{runs} finished runs and {steps} steps for {len(trace_ids)} traces of {STEPS} steps"
        )


def _attrs(values: dict) -> list[KeyValue]:
    out = []
    for key, value in values.items():
        any_value = AnyValue(int_value=value) if isinstance(value, int) else AnyValue()
        if isinstance(value, str):
            any_value.string_value = value
        out.append(KeyValue(key=key, value=any_value))
    return out


# Why long: one run's spans written out as the smolagents instrumentation shapes them, attribute by
# attribute, read top to bottom like the trace they make.
def _trace(rng: random.Random, number: int, start_ns: int) -> list[tuple[Span, int, str]]:
    """One run's spans with its session, in the order they end."""
    trace_id = rng.randbytes(16)

    def span(name: str, parent: bytes, begin: int, end: int, attrs: dict) -> Span:
        return Span(
            trace_id=trace_id,
            span_id=rng.randbytes(8),
            parent_span_id=parent,
            name=name,
            kind=Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=begin,
            end_time_unix_nano=end,
            attributes=_attrs(attrs),
        )

    task = f"What is the weather in city {number}? Answer in one sentence."
    second = 1_000_000_000
    root = span(
        "ToolCallingAgent.run",
        b"",
        start_ns,
        start_ns + (STEPS + 1) * second,
        {
            "openinference.span.kind": "AGENT",
            "smolagents.task": task,
            "input.value": json.dumps({"task": task, "stream": False}),
            "output.value": f"Sunny in city {number}.",
            "llm.token_count.prompt": 200 * STEPS,
            "llm.token_count.completion": 20 * STEPS,
        },
    )
    out: list[Span] = []
    history = [f"New task:\n{task}"]
    for k in range(1, STEPS + 1):
        begin = start_ns + k * second
        step = span(
            f"Step {k}",
            root.span_id,
            begin,
            begin + second - 1000,
            {"openinference.span.kind": "CHAIN"},
        )
        call_id = f"call_{number}_{k}"
        llm = {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o-mini",
            "llm.token_count.prompt": 200,
            "llm.token_count.completion": 20,
            "llm.token_count.total": 220,
            "output.value": json.dumps(
                {
                    "role": "assistant",
                    "content": f"I will look up step {k}.",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "lookup", "arguments": {"city": number}},
                        }
                    ],
                }
            ),
        }
        for i, text in enumerate(history):
            llm[f"llm.input_messages.{i}.message.role"] = "user" if i % 2 == 0 else "assistant"
            llm[f"llm.input_messages.{i}.message.content"] = text
        model = span("Model.generate", step.span_id, begin + 1000, begin + second // 2, llm)
        tool = span(
            "lookup",
            step.span_id,
            begin + second // 2 + 1000,
            begin + second - 2000,
            {
                "openinference.span.kind": "TOOL",
                "tool.name": "lookup",
                "input.value": json.dumps({"args": [], "kwargs": {"city": number}}),
                "output.value": f"Observation {k} for city {number}: sunny, 22C",
            },
        )
        history.append(f"Observation {k}: sunny")
        out += [model, tool, step]
    out.append(root)
    session = f"s{number % SESSIONS}"
    return [(s, s.end_time_unix_nano, session) for s in out]


def _exports(stamp: str, traces: int, *, seed: str = "") -> list[bytes]:
    """The traces' spans as an exporter sends them: CONCURRENT agents at a time, spans in the
    order they end, EXPORT_SPANS an export, one resource per session; the sessions named by
    `stamp`, the trace ids drawn from it and `seed`."""
    rng = random.Random(f"otlp-{stamp}{seed}")  # noqa: S311 - test data
    spans = []
    for number in range(traces):
        spans += _trace(rng, number, 1_700_000_000 * 10**9 + (number // CONCURRENT) * 10**11)
    spans.sort(key=lambda s: s[1])
    exports = []
    for i in range(0, len(spans), EXPORT_SPANS):
        by_session: dict[str, list[Span]] = {}
        for span, _, session in spans[i : i + EXPORT_SPANS]:
            by_session.setdefault(session, []).append(span)
        request = ExportTraceServiceRequest()
        for session, session_spans in by_session.items():
            resource = ResourceSpans()
            resource.resource.attributes.extend(
                _attrs(
                    {
                        "service.name": "bench-agent",
                        "agentmemory.context.bench": f"otlp-{stamp}",
                        "agentmemory.context.session": session,
                    }
                )
            )
            scope = ScopeSpans(spans=session_spans)
            scope.scope.name = "openinference.instrumentation.smolagents"
            resource.scope_spans.append(scope)
            request.resource_spans.append(resource)
        exports.append(request.SerializeToString())
    return exports
