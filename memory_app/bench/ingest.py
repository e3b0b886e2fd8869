"""Ingest (measured last: it writes): single appends, text batches, batches with their vectors
(in-process, through the API and over HTTP), the indexer's catch-up after them, and agent steps
with their tool calls, each against the naive baseline's one ORM INSERT per row."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np
from django.conf import settings

from memory_app import backlog
from memory_app.bench import baseline
from memory_app.bench.dataset import Generator
from memory_app.bench.harness import API, Bench, BenchError
from memory_app.bench.measure import Rate, Row, Target, time_calls
from memory_app.embeddings import indexer, queue
from memory_app.models import Context, Embedding, Run
from memory_app.search import fulltext
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append


def ingest(b: Bench) -> None:
    gen = b.gen(seed_offset=3)
    stamp = int(time.time())
    ctx = b.post(f"{API}/contexts", {"keys": {"bench": "ingest", "at": str(stamp)}}).json()
    cid = ctx["id"]
    naive_ctx = Context.objects.create(
        keys={"bench": "naive", "at": str(stamp)}, keys_digest=f"naive-{stamp}"
    )
    texts = gen.texts(np.array([i % 40 for i in range(4000)]))
    _single_appends(b, texts, cid=cid, naive_ctx=naive_ctx)
    batch = 100 if b.quick else 1000
    batches = 2 if b.quick else 10
    b.post(
        f"{API}/contexts/{cid}/messages/batch", {"messages": [{"role": "user", "text": "warm-up"}]}
    )
    bodies = _text_batch_bodies(texts, stamp, batch=batch, batches=batches)
    # The indexer thread would write the batches' full-text vectors (and later the deferred
    # HNSW insertions) while the next batches are measured: held back here, its work is
    # measured on its own (the "ingest (indexer)" rows).
    threaded, settings.AGENTMEMORY_INDEXER_THREAD = settings.AGENTMEMORY_INDEXER_THREAD, False
    try:
        _text_batches(b, bodies, texts, cid=cid, naive_ctx=naive_ctx, batch=batch, batches=batches)
        _ingest_vectors(b, gen, texts, stamp, batch=batch, batches=batches)
        _fulltext_catch_up(b)
    finally:
        settings.AGENTMEMORY_INDEXER_THREAD = threaded
    if threaded:
        _ingest_sustained(b, bodies, stamp, batch=batch, batches=batches)
    _ingest_steps(b, texts, cid=cid, naive_ctx=naive_ctx)


def _single_appends(b: Bench, texts: list[str], *, cid: int, naive_ctx: Context) -> None:
    """One message per request, as a chat appends its turns."""
    single_n = 20 if b.quick else 200
    it = iter(texts)
    ours = time_calls(
        lambda: b.post(f"{API}/contexts/{cid}/messages", {"role": "user", "text": next(it)}),
        n=single_n,
    )
    it2 = iter(texts)
    naive = time_calls(lambda: baseline.append_loop(naive_ctx.pk, [next(it2)]), n=single_n)
    b.report.add(
        Row("ingest (API)", "single append", ours, naive, Target("<=", 5, "p50 ≤ 5 ms")), b.log
    )


def _text_batch_bodies(texts: list[str], stamp: int, *, batch: int, batches: int) -> list[str]:
    """The text batches' request bodies, JSON encoded beforehand (the client's encoding is not
    server time)."""
    payloads = [
        {
            "messages": [
                {
                    "role": "user" if j % 2 else "assistant",
                    "text": texts[(i * batch + j) % len(texts)],
                    "client_id": f"b{stamp}-{i}-{j}",
                }
                for j in range(batch)
            ]
        }
        for i in range(batches)
    ]
    return [json.dumps(p) for p in payloads]


def _text_batches(
    b: Bench,
    bodies: list[str],
    texts: list[str],
    *,
    cid: int,
    naive_ctx: Context,
    batch: int,
    batches: int,
) -> None:
    t = time.perf_counter()
    for body in bodies:
        b.post_raw(f"{API}/contexts/{cid}/messages/batch", body)
    ours_rate = Rate(batch * batches / (time.perf_counter() - t))
    t = time.perf_counter()
    baseline.append_loop(naive_ctx.pk, texts[:batch])
    naive_rate = Rate(batch / (time.perf_counter() - t))
    b.report.add(
        Row(
            "ingest (API)",
            f"batch of {batch:,} messages ({batches} batches)",
            ours_rate,
            naive_rate,
            Target(">=", 10000, "≥ 10,000 msg/s"),
        ),
        b.log,
    )


def _fulltext_catch_up(b: Bench) -> None:
    """Every batch before left its messages' full-text vectors to the indexer."""
    waiting = fulltext.pending_count()
    _catch_up(
        b,
        f"full-text catch-up after the batches above: {waiting:,} messages waiting for their "
        "full-text vectors, until none",
        drain=fulltext.index_pending,
        left=fulltext.pending_count,
        waiting=waiting,
        unit="msg/s",
        note="one indexer (fulltext.index_pending, batches of "
        f"{settings.AGENTMEMORY_INDEXER_BATCH:,} seqs); keyword search parses waiting messages'"
        " text meanwhile",
    )


def _catch_up(b: Bench, label: str, *, drain, left, waiting: int, unit: str, note: str) -> None:
    """How long one indexer takes to bring a backlog of `waiting` items to none (`drain()`
    until `left()` is 0), as a rate: the work a large batch leaves for after its request."""
    t = time.perf_counter()
    drain()
    elapsed = time.perf_counter() - t
    if left():
        raise BenchError(f"the indexer left work waiting: {label}")
    b.report.add(
        Row(
            "ingest (indexer)", label, Rate(waiting / elapsed if elapsed else 0.0, unit), note=note
        ),
        b.log,
    )


def _ingest_sustained(b: Bench, bodies: list[str], stamp: int, *, batch: int, batches: int) -> None:
    """The same text batches with the indexer thread running beside them, timed until the last
    message has its full-text vector: the rate a steady stream of batches is stored and indexed
    at, the two sharing the machine."""
    context = b.post(
        f"{API}/contexts", {"keys": {"bench": "ingest-sustained", "at": str(stamp)}}
    ).json()
    t = time.perf_counter()
    for body in bodies:
        b.post_raw(f"{API}/contexts/{context['id']}/messages/batch", body)
    if not backlog.indexer.wait_idle(120) or fulltext.pending_count():
        raise BenchError("the indexer thread did not write the batches' full-text vectors")
    b.report.add(
        Row(
            "ingest (API)",
            f"batch of {batch:,} messages ({batches} batches), until every full-text vector "
            "is written",
            Rate(batch * batches / (time.perf_counter() - t)),
            None,
            note="the indexer thread running beside the batches",
        ),
        b.log,
    )


def _ingest_steps(b: Bench, texts: list[str], *, cid: int, naive_ctx: Context) -> None:
    run = b.post(
        f"{API}/contexts/{cid}/runs", {"task": "benchmark", "framework": "smolagents"}
    ).json()
    naive_run = Run.objects.create(context=naive_ctx, task="benchmark")
    step_batch = 20 if b.quick else 100
    step_batches = 2 if b.quick else 5

    def step(i: int) -> dict:
        text = texts[i % len(texts)]
        return {
            "kind": "action",
            "step_number": i,
            "model_output": text[:400],
            "observations": text[:300],
            "start_time": 1735725600.0 + i,
            "end_time": 1735725601.5 + i,
            "input_tokens": 900,
            "output_tokens": 80,
            "tool_calls": [
                {
                    "call_id": f"c{i}-1",
                    "name": "web_search",
                    "arguments": {"query": text[:40]},
                    "output": text[:200],
                },
                {
                    "call_id": f"c{i}-2",
                    "name": "visit_webpage",
                    "arguments": {"url": "https://example.org"},
                },
            ],
        }

    t = time.perf_counter()
    for k in range(step_batches):
        b.post(
            f"{API}/runs/{run['id']}/steps",
            {"steps": [step(k * step_batch + i) for i in range(step_batch)]},
        )
    ours_steps = Rate(step_batch * step_batches / (time.perf_counter() - t), "steps/s")
    naive_items = []
    for i in range(step_batch):
        s = step(i)
        calls = s.pop("tool_calls")
        naive_items.append({**s, "tool_calls": calls})
    t = time.perf_counter()
    baseline.steps_loop(naive_run.pk, naive_items)
    naive_steps = Rate(step_batch / (time.perf_counter() - t), "steps/s")
    b.report.add(
        Row(
            "ingest (API)",
            f"steps with 2 tool calls each, batches of {step_batch}",
            ours_steps,
            naive_steps,
        ),
        b.log,
    )
    # The baseline keeps no counters: its rows go, so a reused database stays consistent.
    naive_ctx.delete()


@dataclass
class VectorBatches:
    """Batches that carry their vectors, the same ones for each way in."""

    texts: list[str]
    vectors: np.ndarray
    model: str
    stamp: int
    batch: int
    batches: int

    @property
    def n(self) -> int:
        return self.batch * self.batches

    @property
    def label(self) -> str:
        return (
            f"batch of {self.batch:,} messages with {self.vectors.shape[1]}-d vectors "
            f"({self.batches} batches)"
        )

    def items(self, i: int, as_lists: bool) -> list[dict]:
        batch, texts, vectors = self.batch, self.texts, self.vectors
        return [
            {
                "role": "user" if j % 2 else "assistant",
                "text": texts[(i * batch + j) % len(texts)],
                "vector": vectors[i * batch + j].tolist() if as_lists else vectors[i * batch + j],
                "vector_model": self.model,
            }
            for j in range(batch)
        ]

    def new_context(self, kind: str) -> Context:
        context, _ = context_get_or_create(
            keys={"bench": f"ingest-vectors-{kind}", "at": str(self.stamp)}
        )
        return context


def _ingest_vectors(
    b: Bench, gen: Generator, texts: list[str], stamp: int, *, batch: int, batches: int
) -> None:
    """Batches that carry their vectors: through the write path in-process, through the API
    in-process (WSGI), and over HTTP with the product's client; against one ORM INSERT per
    message and per vector."""
    vectors = gen.vectors(np.array([i % 40 for i in range(batch * batches)]))
    vb = VectorBatches(texts, vectors, b.data.model, stamp, batch, batches)
    naive_ctx = vb.new_context("naive")
    naive_n = min(batch, 200)
    t = time.perf_counter()
    baseline.append_loop_with_vectors(
        naive_ctx.pk, texts[:naive_n], vb.model, [vectors[i].tolist() for i in range(naive_n)]
    )
    naive = Rate(naive_n / (time.perf_counter() - t))
    contexts = [
        _vectors_domain(b, vb, naive),
        _vectors_api(b, vb, naive),
        _vectors_http(b, vb, naive),
    ]
    _vectors_catch_up(b, vb, contexts)
    # The baseline keeps no counters: its rows go, so a reused database stays consistent.
    naive_ctx.delete()


def _vectors_domain(b: Bench, vb: VectorBatches, naive: Rate) -> int:
    """The write path in-process (messages_append), numpy vectors as they are."""
    context = vb.new_context("domain")
    payloads = [vb.items(i, as_lists=False) for i in range(vb.batches)]
    t = time.perf_counter()
    for p in payloads:
        messages_append(context=context, items=p)
    b.report.add(
        Row(
            "ingest (domain)",
            f"{vb.label}, messages_append",
            Rate(vb.n / (time.perf_counter() - t)),
            naive,
            Target(">=", 5000, "≥ 5,000 msg/s"),
        ),
        b.log,
    )
    return context.pk


def _vectors_api(b: Bench, vb: VectorBatches, naive: Rate) -> int:
    context = vb.new_context("api")
    bodies = [json.dumps({"messages": vb.items(i, as_lists=True)}) for i in range(vb.batches)]
    t = time.perf_counter()
    for body in bodies:
        b.post_raw(f"{API}/contexts/{context.pk}/messages/batch", body)
    b.report.add(
        Row(
            "ingest (API)",
            vb.label,
            Rate(vb.n / (time.perf_counter() - t)),
            naive,
            Target(">=", 2000, "≥ 2,000 msg/s"),
            note="in-process WSGI, JSON encoded beforehand",
        ),
        b.log,
    )
    return context.pk


def _vectors_http(b: Bench, vb: VectorBatches, naive: Rate) -> int:
    """Over HTTP with the product's client, its JSON encoding of numpy vectors included."""
    from memory_app.client import MemoryClient

    context = vb.new_context("http")
    batch = vb.batch
    # httpx logs every request at INFO: ten lines of noise in the benchmark's output.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with _http_server() as url, MemoryClient(url, b.api_secret) as client:
        plain = [
            [
                {k: v for k, v in m.items() if k not in ("vector", "vector_model")}
                for m in vb.items(i, False)
            ]
            for i in range(vb.batches)
        ]
        t = time.perf_counter()
        for i, messages in enumerate(plain):
            client.append_messages(
                context.pk,
                messages,
                vectors=vb.vectors[i * batch : (i + 1) * batch],
                vector_model=vb.model,
            )
        b.report.add(
            Row(
                "ingest (HTTP)",
                vb.label,
                Rate(vb.n / (time.perf_counter() - t)),
                naive,
                Target(">=", 2000, "≥ 2,000 msg/s"),
                note="memory_app.client.MemoryClient (numpy vectors, JSON encoding included) "
                "to a WSGI server on 127.0.0.1 in this process",
            ),
            b.log,
        )
    return context.pk


def _vectors_catch_up(b: Bench, vb: VectorBatches, contexts: list[int]) -> None:
    """Batches of AGENTMEMORY_INDEX_DEFER_MIN vectors or more are stored without their HNSW
    insertion (the indexer thread is held back, so the rows before measure the write path
    alone): how long one indexer takes to bring that backlog to 0, in vectors per second."""
    model, n = vb.model, vb.n
    waiting = queue.unindexed_count(model=model)
    _catch_up(
        b,
        f"catch-up after the batches above: {waiting:,} of their {3 * n:,} vectors waiting "
        "for the HNSW graph, until none",
        drain=indexer.index_pending,
        left=lambda: queue.unindexed_count(model=model),
        waiting=waiting,
        unit="vectors/s",
        note="one indexer (indexer.index_pending, batches of "
        f"{settings.AGENTMEMORY_INDEXER_BATCH:,}); searches scan waiting vectors exactly meanwhile",
    )
    stored = Embedding.objects.filter(
        context_id__in=contexts, model=model, vector__isnull=False
    ).count()
    if stored != 3 * n:
        raise BenchError(f"{stored:,} vectors stored for {3 * n:,} messages sent with vectors")


@contextlib.contextmanager
def _http_server():
    """The site's WSGI application on 127.0.0.1 (an ephemeral port) in a thread."""
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.core.wsgi import get_wsgi_application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = make_server(
        "127.0.0.1", 0, get_wsgi_application(), server_class=WSGIServer, handler_class=Quiet
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
