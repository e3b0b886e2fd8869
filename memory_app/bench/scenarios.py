"""The measurements. Each function adds rows (or "not measured" lines) to the report.

Requests go through Django's full stack in-process (`django.test.Client`: WSGI handler,
middleware, API-key authentication, JSON parsing and rendering) with a real API key; dashboard
pages with a logged-in superuser. Server time is the time until the response is complete.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.test import Client
from django.urls import NoReverseMatch, Resolver404, resolve, reverse

from memory_app import backlog
from memory_app.bench import baseline
from memory_app.bench.dataset import Dataset, Generator
from memory_app.bench.measure import (
    Amount,
    Latency,
    Rate,
    Report,
    Row,
    Target,
    time_calls,
    time_each,
)
from memory_app.embeddings import indexer, queue
from memory_app.models import Context, Embedding, Message, Run
from memory_app.search import fulltext
from memory_app.search.messages import ef_search_for, semantic_ranking, store_size
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append

API = "/api/v1"


@dataclass
class Bench:
    data: Dataset
    report: Report
    api: Client
    web: Client
    log: Callable[[str], None]
    samples: int
    quick: bool
    api_secret: str = ""

    def gen(self, seed_offset: int = 1) -> Generator:
        """Same vocabulary and topic vectors as the dataset, fresh random draws for queries."""
        gen = Generator(self.data.sizes)
        gen.rng = np.random.default_rng(self.data.sizes.seed + 1000 + seed_offset)
        return gen

    def post(self, path: str, body: dict, expect: tuple[int, ...] = (200, 201)):
        response = self.api.post(path, data=json.dumps(body), content_type="application/json")
        if response.status_code not in expect:
            raise BenchError(
                f"POST {path} answered {response.status_code}: {response.content[:300]!r}"
            )
        return response

    def post_raw(self, path: str, body: str, expect: tuple[int, ...] = (200, 201)):
        """POST an already encoded JSON body (the client's encoding is not server time)."""
        response = self.api.post(path, data=body, content_type="application/json")
        if response.status_code not in expect:
            raise BenchError(
                f"POST {path} answered {response.status_code}: {response.content[:300]!r}"
            )
        return response

    def get(self, path: str, client: Client | None = None, expect: tuple[int, ...] = (200,)):
        response = (client or self.api).get(path)
        if response.status_code not in expect:
            raise BenchError(
                f"GET {path} answered {response.status_code}: {response.content[:300]!r}"
            )
        return response


class BenchError(Exception):
    pass


def route_exists(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def module_available(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


# The naive baseline loads a whole context into Python: above this it would take minutes per
# call and gigabytes, so larger contexts are measured without it (the peers mode compares there).
BASELINE_MAX_MESSAGES = 200_000


def _size(cid: int) -> int:
    return Context.objects.only("message_count").get(pk=cid).message_count


def contexts_label(b: Bench) -> dict[str, int]:
    """The contexts read from: a typical small one, the largest, and at scale also a large one
    that is a small part of the store (the filtered-HNSW case)."""
    labels = {f"small context ({_size(b.data.small_context_id):,} msgs)": b.data.small_context_id}
    if b.data.sizes.largest_messages >= SCALE_MESSAGES:
        # Context 3 holds 1/40 of the messages (30,000 of 1,200,000): see dataset.context_sizes.
        labels[f"large context in the store ({_size(3):,} msgs)"] = 3
    labels[f"largest context ({_size(b.data.largest_context_id):,} msgs)"] = (
        b.data.largest_context_id
    )
    return labels


def _naive_calls(cid: int, fn: Callable[[], object], n: int) -> Latency | None:
    return time_calls(fn, n=n, warmup=0) if _size(cid) <= BASELINE_MAX_MESSAGES else None


def _naive_each(cid: int, fns: list[Callable[[], object]]) -> Latency | None:
    return time_each(fns, warmup=0) if _size(cid) <= BASELINE_MAX_MESSAGES else None


# --- selectors --------------------------------------------------------------------------------

# Issue 11: reads bounded by indexes, whatever the context's size (measured at 1M messages).
BOUNDED = Target("<=", 30, "p50 ≤ 30 ms")
SCALE_MESSAGES = 500_000
WINDOW_K = 20
MAX_TOKENS = 2000
SEARCH_K = 10


def _spec(body: dict):
    """The domain spec for an API body (used only while the API route has not landed)."""
    from memory_app import selectors as sel

    kind = body["selector"]
    if kind == "window":
        return sel.WindowSpec(k=body["k"])
    if kind == "token_window":
        return sel.TokenWindowSpec(max_tokens=body["max_tokens"], policy=body["policy"])
    if kind == "search":
        vector = body.get("query_vector")
        return sel.SearchSpec(
            query=body["query"],
            k=body["k"],
            mode=body["mode"],
            model=body.get("model"),
            query_vector=tuple(vector) if vector is not None else None,
        )
    return sel.CompositeSpec(search_mode=body["search_mode"])


def selectors(b: Bench) -> None:
    use_api = route_exists(f"{API}/contexts/1/select")
    area_sel, area_search = "selectors (API)", "search (API)"
    if not use_api:
        from memory_app import selectors as sel

        b.report.skip(
            "selectors and search through the API",
            "POST /api/v1/contexts/{id}/select has not landed; measured as domain calls "
            "(memory_app.selectors.select) instead, without the HTTP layer",
            b.log,
        )
        area_sel, area_search = "selectors (domain)", "search (domain)"
        contexts = {
            c.pk: c
            for c in Context.objects.filter(
                pk__in=[b.data.small_context_id, b.data.largest_context_id]
            )
        }

        def post(path: str, body: dict):
            cid = int(path.split("/")[-2])
            return sel.select(context=contexts[cid], spec=_spec(body))
    else:
        post = b.post
    gen = b.gen()
    n = b.samples
    scale = b.data.sizes.largest_messages >= SCALE_MESSAGES
    for label, cid in contexts_label(b).items():
        topics = b.data.context_topics[cid]
        path = f"{API}/contexts/{cid}/select"
        cases: list[tuple[str, dict, Callable[[], object], Target | None]] = [
            (
                f"window k={WINDOW_K}",
                {"selector": "window", "k": WINDOW_K},
                lambda cid=cid: baseline.window(cid, WINDOW_K),
                Target("<=", 3, "p50 ≤ 3 ms"),
            ),
            (
                f"token_window {MAX_TOKENS} contiguous",
                {"selector": "token_window", "max_tokens": MAX_TOKENS, "policy": "contiguous"},
                lambda cid=cid: baseline.token_window(cid, MAX_TOKENS, "contiguous"),
                Target("<=", 5, "p50 ≤ 5 ms"),
            ),
            (
                f"token_window {MAX_TOKENS} skip",
                {"selector": "token_window", "max_tokens": MAX_TOKENS, "policy": "skip"},
                lambda cid=cid: baseline.token_window(cid, MAX_TOKENS, "skip"),
                Target("<=", 5, "p50 ≤ 5 ms"),
            ),
            (
                "composite (steamship)",
                {"selector": "composite", "search_mode": "keyword"},
                lambda cid=cid: baseline.composite(cid, 2, 3),
                BOUNDED,
            ),
        ]
        for name, spec, naive, target in cases:
            ours = time_calls(lambda spec=spec, path=path: post(path, spec), n=n)
            base = _naive_calls(cid, naive, max(3, n // 5))
            b.report.add(Row(area_sel, f"{name}, {label}", ours, base, target), b.log)

        queries = [gen.query(topics[i % len(topics)]) for i in range(n + 3)]
        kw = [
            lambda q=q, path=path: post(
                path, {"selector": "search", "query": q, "k": SEARCH_K, "mode": "keyword"}
            )
            for q, _ in queries
        ]
        b.report.add(
            Row(
                area_search,
                f"keyword k={SEARCH_K}, {label}",
                time_each(kw),
                _naive_each(
                    cid,
                    [
                        lambda q=q, cid=cid: baseline.keyword(cid, q, SEARCH_K)
                        for q, _ in queries[: max(3, n // 5)]
                    ],
                ),
                BOUNDED if scale else Target("<=", 20, "p50 ≤ 20 ms"),
            ),
            b.log,
        )
        sem = [
            lambda v=v, path=path: post(
                path,
                {
                    "selector": "search",
                    "query": "",
                    "k": SEARCH_K,
                    "mode": "semantic",
                    "model": b.data.model,
                    "query_vector": [float(x) for x in v],
                },
            )
            for _, v in queries
        ]
        b.report.add(
            Row(
                area_search,
                f"semantic k={SEARCH_K}, {label}",
                time_each(sem),
                _naive_each(
                    cid,
                    [
                        lambda v=v, cid=cid: baseline.semantic(cid, b.data.model, v, SEARCH_K)
                        for _, v in queries[: max(3, n // 5)]
                    ],
                ),
                Target("<=", 15, "p50 ≤ 15 ms"),
            ),
            b.log,
        )
        hyb = [
            lambda q=q, v=v, path=path: post(
                path,
                {
                    "selector": "search",
                    "query": q,
                    "k": SEARCH_K,
                    "mode": "hybrid",
                    "model": b.data.model,
                    "query_vector": [float(x) for x in v],
                },
            )
            for q, v in queries
        ]
        b.report.add(
            Row(
                area_search,
                f"hybrid k={SEARCH_K}, {label}",
                time_each(hyb),
                _naive_each(
                    cid,
                    [
                        lambda q=q, v=v, cid=cid: baseline.hybrid(cid, q, b.data.model, v, SEARCH_K)
                        for q, v in queries[: max(3, n // 5)]
                    ],
                ),
                BOUNDED,
            ),
            b.log,
        )


def recall(b: Bench) -> None:
    """Semantic search recall@10 against an exact scan, on the largest context (and at scale on
    a large context that is a small part of the store: the filtered-HNSW case)."""
    contexts = {"largest context": b.data.largest_context_id}
    if b.data.sizes.largest_messages >= SCALE_MESSAGES:
        contexts[f"context of {_size(3):,} msgs in a store of {b.data.sizes.messages:,}"] = 3
    for label, cid in contexts.items():
        _recall(b, label, cid)


def _recall(b: Bench, label: str, cid: int) -> None:

    gen = b.gen(seed_offset=2)
    ids, matrix = _live_vectors(cid, b.data.model, b.data.sizes.dims)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    topics = b.data.context_topics[cid]
    n_queries = 20 if b.quick else 100
    total, paths = 0.0, set()
    for i in range(n_queries):
        _, v = gen.query(topics[i % len(topics)])
        hits, path = semantic_ranking(
            context_id=cid, model=b.data.model, vector=[float(x) for x in v], limit=SEARCH_K
        )
        paths.add(path)
        exact = set(ids[np.argsort(-(matrix @ (v / np.linalg.norm(v))))[:SEARCH_K]].tolist())
        total += len(exact & {mid for mid, _ in hits}) / SEARCH_K
    value = total / n_queries
    # The index as built (the settings shape new indexes only; see `manage.py hnsw_rebuild`).
    built = [
        f"m={i.m}, ef_construction={i.ef_construction}"
        for i in indexer.built_indexes()
        if (i.model, i.dimensions) == (b.data.model, b.data.sizes.dims)
    ]
    store = store_size(b.data.model, b.data.sizes.dims)
    share = Context.objects.get(pk=cid).message_count
    settings_text = (
        f"path {'/'.join(sorted(paths))}; HNSW {' / '.join(built) or 'index not found'}, "
        f"ef_search={ef_search_for(store, SEARCH_K, share)} (store {store:,}, context {share:,}), "
        "iterative scan; "
        f"exact scan below {settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD:,} messages per context; {n_queries} queries"
    )
    b.report.add(
        Row(
            "search",
            f"semantic recall@{SEARCH_K} vs exact scan, {label}",
            Amount(value, ""),
            None,
            Target(">=", 0.95, "≥ 0.95"),
            note=settings_text,
        ),
        b.log,
    )


def _live_vectors(context_id: int, model: str, dims: int) -> tuple[np.ndarray, np.ndarray]:
    """The ground truth's input: every live message's vector, read in binary on a connection of
    its own (pgvector's numpy loader) rather than parsed from text by the ORM."""
    import psycopg
    from pgvector.psycopg import register_vector

    from memory_app.bench.database import conninfo

    with psycopg.connect(**conninfo()) as conn:
        register_vector(conn)
        rows = conn.execute(
            f"""
            SELECT e.message_id, e.vector::vector({int(dims)}) FROM memory_app_embedding e
            JOIN memory_app_message m ON m.id = e.message_id
            WHERE e.context_id = %s AND e.model = %s AND m.pruned_at IS NULL AND e.vector IS NOT NULL
            """,  # noqa: S608 - dims is an int
            [context_id, model],
            binary=True,
        ).fetchall()
    ids = np.array([r[0] for r in rows])
    matrix = np.vstack(
        [
            np.asarray(r[1].to_numpy() if hasattr(r[1], "to_numpy") else r[1], dtype=np.float32)
            for r in rows
        ]
    )
    return ids, matrix


# --- transcript and export ----------------------------------------------------------------------


def transcript(b: Bench) -> None:
    run = Run.objects.get(pk=b.data.transcript_run_id)
    label = f"transcript of a {run.step_count:,}-step run"
    path = f"{API}/runs/{run.pk}/messages"
    naive = time_calls(lambda: baseline.transcript(run.pk), n=max(3, b.samples // 10), warmup=1)
    target = Target("<=", 100, "≤ 100 ms")
    if route_exists(path):
        ours = time_calls(lambda: b.get(path), n=max(5, b.samples // 2))
        b.report.add(
            Row("transcript (API)", f"GET /runs/{{id}}/messages, {label}", ours, naive, target),
            b.log,
        )
    elif module_available("memory_app.transcripts"):
        from memory_app import transcripts

        ours = time_calls(lambda: transcripts.run_messages(run=run), n=max(5, b.samples // 2))
        b.report.add(
            Row(
                "transcript (domain)",
                label,
                ours,
                naive,
                target,
                note="transcripts.run_messages; GET /api/v1/runs/{id}/messages has not landed",
            ),
            b.log,
        )
    else:
        b.report.skip(label, "memory_app.transcripts has not landed", b.log)


def _export_once(fn: Callable[[], int]) -> tuple[float, int, float]:
    """(seconds, items, peak MB under tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    t = time.perf_counter()
    items = fn()
    seconds = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return seconds, items, peak / 1e6


def export(b: Bench) -> None:
    if not module_available("memory_app.backup"):
        b.report.skip("export", "memory_app.backup has not landed", b.log)
        return
    from memory_app.backup.export import contexts_matching, export_lines

    samples: list[float] = []

    def ours(cid: int) -> int:
        count = 0
        for line in export_lines(contexts=contexts_matching(context_ids=[cid])):
            if line.startswith('{"type":"message"'):
                count += 1
                if count % 500 == 0 and tracemalloc.is_tracing():
                    samples.append(tracemalloc.get_traced_memory()[0] / 1e6)
        return count

    def naive(cid: int) -> int:
        baseline.export(cid)
        return Message.objects.filter(context_id=cid).count()

    largest = b.data.largest_context_id
    # A context about a tenth the size of the largest one, to see whether memory grows with size.
    tenth = (
        Context.objects.filter(
            message_count__lte=max(Context.objects.get(pk=largest).message_count // 10, 1)
        )
        .order_by("-message_count")
        .values_list("pk", "message_count")
        .first()
    )
    o_sec, o_items, o_peak = _export_once(lambda: ours(largest))
    if _size(largest) <= BASELINE_MAX_MESSAGES:
        n_sec, n_items, n_peak = _export_once(lambda: naive(largest))
        naive_rate, naive_peak = Rate(n_items / n_sec), Amount(n_peak, "MB")
    else:
        naive_rate = naive_peak = None
    b.report.add(
        Row(
            "export",
            f"backup.export_lines, largest context ({o_items:,} msgs), without tracemalloc",
            _rate_untraced(lambda: ours(largest)),
            naive_rate,
            Target(">=", 20000, "≥ 20,000 msg/s"),
        ),
        b.log,
    )
    # Flat memory: the memory held while the messages stream out does not rise from the first
    # third of the messages to the last.
    during = samples[:]
    note = ""
    if len(during) >= 3:
        third = max(len(during) // 3, 1)
        early, late = max(during[:third]), max(during[-third:])
        flat = late <= early * 1.5 + 1
        note = (
            f"held while messages stream: {early:.1f} MB in the first third, {late:.1f} MB in the last: "
            f"{'flat' if flat else 'grows'}"
        )
    if tenth:
        samples.clear()
        _, t_items, t_peak = _export_once(lambda: ours(tenth[0]))
        note += f"; peak {t_peak:.1f} MB for a {t_items:,}-message context (peaks are per-chunk: 1,000 rows)"
    b.report.add(
        Row(
            "export",
            "peak Python memory (tracemalloc), largest context",
            Amount(o_peak, "MB"),
            naive_peak,
            note=note,
        ),
        b.log,
    )


def _rate_untraced(fn: Callable[[], int]) -> Rate:
    gc.collect()
    t = time.perf_counter()
    items = fn()
    return Rate(items / (time.perf_counter() - t))


# --- dashboard ------------------------------------------------------------------------------------


def dashboard(b: Bench) -> None:
    data = b.data
    run = Run.objects.get(pk=data.long_run_id)
    largest = Context.objects.get(pk=data.largest_context_id)
    pages = [
        ("contexts list", _url("contexts")),
        (
            f"context page ({largest.message_count:,} msgs)",
            _url("context", data.largest_context_id),
        ),
        (f"run logbook ({run.step_count:,} steps)", _url("run", data.long_run_id)),
    ]
    playground = _url("playground", data.largest_context_id)
    if playground:
        pages.append((f"selector playground ({largest.message_count:,} msgs)", playground))
        pages.append(
            (
                f"playground window k={WINDOW_K} ({largest.message_count:,} msgs)",
                f"{playground}?selector=window&k={WINDOW_K}",
            )
        )
        pages.append(
            (
                f"playground token_window {MAX_TOKENS} ({largest.message_count:,} msgs)",
                f"{playground}?selector=token_window&max_tokens={MAX_TOKENS}&policy=contiguous",
            )
        )
    else:
        b.report.skip(
            "dashboard: selector playground",
            "the playground view has not landed (no URL named 'playground')",
            b.log,
        )
    for name, url in pages:
        if url is None:
            b.report.skip(f"dashboard: {name}", "its view has not landed", b.log)
            continue
        try:
            url = _landing(b, url)
            size = len(b.get(url, client=b.web).content) / 1024
            ours = time_calls(lambda url=url: b.get(url, client=b.web), n=max(5, b.samples // 2))
        except BenchError as exc:
            b.report.skip(f"dashboard: {name}", f"failed: {exc}", b.log)
            continue
        target = (
            Target("<=", 100, "p50 < 100 ms")
            if name.startswith("playground ")
            else Target("<=", 150, "p50 ≤ 150 ms")
        )
        b.report.add(Row("dashboard", f"{name}: server time", ours, None, target), b.log)
        b.report.add(
            Row(
                "dashboard",
                f"{name}: HTML size",
                Amount(size, "KB"),
                None,
                Target("<=", 300, "≤ 300 KB"),
            ),
            b.log,
        )


def _landing(b: Bench, url: str) -> str:
    """The page a link lands on (a run's URL redirects to its first step): that page is timed."""
    response = b.web.get(url, follow=True)
    if response.redirect_chain:
        return response.redirect_chain[-1][0]
    return url


def _url(name: str, *args) -> str | None:
    try:
        return reverse(name, args=args)
    except NoReverseMatch:
        return None


# --- ingest (last: it writes) ---------------------------------------------------------------------


def ingest(b: Bench) -> None:
    gen = b.gen(seed_offset=3)
    stamp = int(time.time())
    ctx = b.post(f"{API}/contexts", {"keys": {"bench": "ingest", "at": str(stamp)}}).json()
    cid = ctx["id"]
    naive_ctx = Context.objects.create(
        keys={"bench": "naive", "at": str(stamp)}, keys_digest=f"naive-{stamp}"
    )
    texts = gen.texts(np.array([i % 40 for i in range(4000)]))
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

    batch = 100 if b.quick else 1000
    batches = 2 if b.quick else 10
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
    b.post(
        f"{API}/contexts/{cid}/messages/batch", {"messages": [{"role": "user", "text": "warm-up"}]}
    )
    bodies = [json.dumps(p) for p in payloads]  # the client's encoding is not server time
    # The indexer thread would write the batches' full-text vectors (and later the deferred
    # HNSW insertions) while the next batches are measured: held back here, its work is
    # measured on its own (the "ingest (indexer)" rows).
    threaded, settings.AGENTMEMORY_INDEXER_THREAD = settings.AGENTMEMORY_INDEXER_THREAD, False
    try:
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
        _ingest_vectors(b, gen, texts, stamp, batch=batch, batches=batches)
        # Every batch above left its messages' full-text vectors to the indexer.
        waiting = fulltext.pending_count()
        _catch_up(
            b,
            f"full-text catch-up after the batches above: {waiting:,} messages waiting for their "
            "full-text vectors, until none",
            drain=fulltext.index_pending,
            left=fulltext.pending_count,
            waiting=waiting,
            unit="msg/s",
            note=f"one indexer (fulltext.index_pending, batches of {settings.AGENTMEMORY_INDEXER_BATCH:,} "
            "seqs); keyword search parses waiting messages' text meanwhile",
        )
    finally:
        settings.AGENTMEMORY_INDEXER_THREAD = threaded
    if threaded:
        _ingest_sustained(b, bodies, stamp, batch=batch, batches=batches)
    _ingest_steps(b, texts, cid=cid, naive_ctx=naive_ctx)


def _catch_up(b: Bench, label: str, *, drain, left, waiting: int, unit: str, note: str) -> None:
    """How long one indexer takes to bring a backlog of `waiting` items to none (`drain()`
    until `left()` is 0), as a rate: the work a large batch leaves for after its request."""
    t = time.perf_counter()
    drain()
    elapsed = time.perf_counter() - t
    if left():
        raise BenchError(f"the indexer left work waiting: {label}")
    b.report.add(
        Row("ingest (indexer)", label, Rate(waiting / elapsed if elapsed else 0.0, unit), note=note),
        b.log,
    )


def _ingest_sustained(b: Bench, bodies: list[str], stamp: int, *, batch: int, batches: int) -> None:
    """The same text batches with the indexer thread running beside them, timed until the last
    message has its full-text vector: the rate a steady stream of batches is stored and indexed
    at, the two sharing the machine."""
    context = b.post(f"{API}/contexts", {"keys": {"bench": "ingest-sustained", "at": str(stamp)}}).json()
    t = time.perf_counter()
    for body in bodies:
        b.post_raw(f"{API}/contexts/{context['id']}/messages/batch", body)
    if not backlog.indexer.wait_idle(120) or fulltext.pending_count():
        raise BenchError("the indexer thread did not write the batches' full-text vectors")
    b.report.add(
        Row(
            "ingest (API)",
            f"batch of {batch:,} messages ({batches} batches), until every full-text vector is written",
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


def _ingest_vectors(
    b: Bench, gen: Generator, texts: list[str], stamp: int, *, batch: int, batches: int
) -> None:
    """Batches that carry their vectors (issue 11.3): through the write path in-process, through
    the API in-process (WSGI), and over HTTP with the product's client; against one ORM INSERT
    per message and per vector."""
    from memory_app.client import MemoryClient

    model, n = b.data.model, batch * batches
    vectors = gen.vectors(np.array([i % 40 for i in range(n)]))
    label = f"batch of {batch:,} messages with {vectors.shape[1]}-d vectors ({batches} batches)"

    def items(i: int, as_lists: bool) -> list[dict]:
        return [
            {
                "role": "user" if j % 2 else "assistant",
                "text": texts[(i * batch + j) % len(texts)],
                "vector": vectors[i * batch + j].tolist() if as_lists else vectors[i * batch + j],
                "vector_model": model,
            }
            for j in range(batch)
        ]

    def new_context(kind: str) -> Context:
        context, _ = context_get_or_create(
            keys={"bench": f"ingest-vectors-{kind}", "at": str(stamp)}
        )
        return context

    naive_ctx = new_context("naive")
    naive_n = min(batch, 200)
    t = time.perf_counter()
    baseline.append_loop_with_vectors(
        naive_ctx.pk, texts[:naive_n], model, [vectors[i].tolist() for i in range(naive_n)]
    )
    naive = Rate(naive_n / (time.perf_counter() - t))

    domain_ctx = new_context("domain")
    payloads = [items(i, as_lists=False) for i in range(batches)]
    t = time.perf_counter()
    for p in payloads:
        messages_append(context=domain_ctx, items=p)
    b.report.add(
        Row(
            "ingest (domain)",
            f"{label}, messages_append",
            Rate(n / (time.perf_counter() - t)),
            naive,
            Target(">=", 5000, "≥ 5,000 msg/s"),
        ),
        b.log,
    )

    api_ctx = new_context("api")
    bodies = [json.dumps({"messages": items(i, as_lists=True)}) for i in range(batches)]
    t = time.perf_counter()
    for body in bodies:
        b.post_raw(f"{API}/contexts/{api_ctx.pk}/messages/batch", body)
    b.report.add(
        Row(
            "ingest (API)",
            label,
            Rate(n / (time.perf_counter() - t)),
            naive,
            Target(">=", 2000, "≥ 2,000 msg/s"),
            note="in-process WSGI, JSON encoded beforehand",
        ),
        b.log,
    )

    http_ctx = new_context("http")
    # httpx logs every request at INFO: ten lines of noise in the benchmark's output.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with _http_server() as url, MemoryClient(url, b.api_secret) as client:
        plain = [
            [
                {k: v for k, v in m.items() if k not in ("vector", "vector_model")}
                for m in items(i, False)
            ]
            for i in range(batches)
        ]
        t = time.perf_counter()
        for i, messages in enumerate(plain):
            client.append_messages(
                http_ctx.pk,
                messages,
                vectors=vectors[i * batch : (i + 1) * batch],
                vector_model=model,
            )
        b.report.add(
            Row(
                "ingest (HTTP)",
                label,
                Rate(n / (time.perf_counter() - t)),
                naive,
                Target(">=", 2000, "≥ 2,000 msg/s"),
                note="memory_app.client.MemoryClient (numpy vectors, JSON encoding included) "
                "to a WSGI server on 127.0.0.1 in this process",
            ),
            b.log,
        )
    # Batches of AGENTMEMORY_INDEX_DEFER_MIN vectors or more are stored without their HNSW
    # insertion (the indexer thread was held back above, so the rows measure the write path
    # alone): how long one indexer takes to bring that backlog to 0, in vectors per second.
    contexts = [domain_ctx.pk, api_ctx.pk, http_ctx.pk]
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
    # The baseline keeps no counters: its rows go, so a reused database stays consistent.
    naive_ctx.delete()


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


__all__ = ["Bench", "BenchError", "Latency"]


# --- storage ----------------------------------------------------------------------------------------

# Every table a stored message occupies: the message, its full-text vector, its vectors and
# (while its provider fails) its vectors' retries.
STORED_TABLES = (
    "memory_app_message",
    "memory_app_messagesearch",
    "memory_app_embedding",
    "memory_app_embeddingretry",
)


def stored_bytes() -> tuple[int, list[tuple[str, int, int]]]:
    """The messages stored, and (table, table bytes with TOAST, index bytes) of each table they
    occupy (`STORED_TABLES`)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memory_app_message")
        messages = cursor.fetchone()[0]
        parts = []
        for table in STORED_TABLES:
            cursor.execute(
                "SELECT pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)", [table, table]
            )
            parts.append((table, *cursor.fetchone()))
    return messages, parts


def storage(b: Bench) -> None:
    """On-disk size of messages with their vectors (tables, TOAST and every index, the HNSW one
    included), per 100,000 messages."""
    messages, parts = stored_bytes()
    if not messages:
        b.report.skip("storage", "no messages", b.log)
        return
    per = 100_000 / messages / 1e6
    total = sum(t + i for _, t, i in parts) * per
    note = "; ".join(
        f"{table.removeprefix('memory_app_')}: table {t * per:,.1f} MB + indexes {i * per:,.1f} MB"
        for table, t, i in parts
    )
    b.report.add(
        Row(
            "storage",
            f"messages with {b.data.sizes.dims}-d vectors, per 100,000 messages "
            f"({messages:,} stored)",
            Amount(total, "MB"),
            None,
            Target("<=", 450, "≤ 450 MB"),
            note=note,
        ),
        b.log,
    )
