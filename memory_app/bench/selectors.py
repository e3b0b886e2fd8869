"""Selectors and search: the reads an agent makes before each step, on a small context and the
largest one (and at scale a large context that is a small part of the store), through the API
against the naive baseline."""

from __future__ import annotations

from collections.abc import Callable

from memory_app.bench import baseline
from memory_app.bench.harness import (
    API,
    MAX_TOKENS,
    SCALE_MESSAGES,
    SEARCH_K,
    WINDOW_K,
    Bench,
    contexts_label,
    naive_calls,
    naive_each,
    route_exists,
)
from memory_app.bench.measure import Latency, Row, Target, time_calls, time_each
from memory_app.models import Context

# Reads bounded by indexes, whatever the context's size (measured at 1M messages).
BOUNDED = Target("<=", 30, "p50 ≤ 30 ms")

Post = Callable[[str, dict], object]


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


def _select_call(b: Bench) -> tuple[Post, str, str]:
    """How a selection is made, and the areas its rows go to: through the API, or as a domain
    call while the API route has not landed."""
    if route_exists(f"{API}/contexts/1/select"):
        return b.post, "selectors (API)", "search (API)"
    from memory_app import selectors as sel

    b.report.skip(
        "selectors and search through the API",
        "POST /api/v1/contexts/{id}/select has not landed; measured as domain calls "
        "(memory_app.selectors.select) instead, without the HTTP layer",
        b.log,
    )
    contexts = {
        c.pk: c
        for c in Context.objects.filter(pk__in=[b.data.small_context_id, b.data.largest_context_id])
    }

    def post(path: str, body: dict):
        cid = int(path.split("/")[-2])
        return sel.select(context=contexts[cid], spec=_spec(body))

    return post, "selectors (domain)", "search (domain)"


def selectors(b: Bench) -> None:
    post, area_sel, area_search = _select_call(b)
    gen = b.gen()
    for label, cid in contexts_label(b).items():
        _window_rows(b, post, area_sel, label, cid)
        topics = b.data.context_topics[cid]
        queries = [gen.query(topics[i % len(topics)]) for i in range(b.samples + 3)]
        _search_rows(b, post, area_search, label, cid, queries)


def _window_rows(b: Bench, post: Post, area: str, label: str, cid: int) -> None:
    """The recent-window selectors and the composite one (recent messages plus search hits)."""
    n = b.samples
    path = f"{API}/contexts/{cid}/select"
    cases: list[tuple[str, dict, Callable[[], object], Target | None]] = [
        (
            f"window k={WINDOW_K}",
            {"selector": "window", "k": WINDOW_K},
            lambda: baseline.window(cid, WINDOW_K),
            Target("<=", 3, "p50 ≤ 3 ms"),
        ),
        (
            f"token_window {MAX_TOKENS} contiguous",
            {"selector": "token_window", "max_tokens": MAX_TOKENS, "policy": "contiguous"},
            lambda: baseline.token_window(cid, MAX_TOKENS, "contiguous"),
            Target("<=", 5, "p50 ≤ 5 ms"),
        ),
        (
            f"token_window {MAX_TOKENS} skip",
            {"selector": "token_window", "max_tokens": MAX_TOKENS, "policy": "skip"},
            lambda: baseline.token_window(cid, MAX_TOKENS, "skip"),
            Target("<=", 5, "p50 ≤ 5 ms"),
        ),
        (
            "composite (steamship)",
            {"selector": "composite", "search_mode": "keyword"},
            lambda: baseline.composite(cid, 2, 3),
            BOUNDED,
        ),
    ]
    for name, spec, naive, target in cases:
        ours = time_calls(lambda spec=spec: post(path, spec), n=n)
        base = naive_calls(cid, naive, max(3, n // 5))
        b.report.add(Row(area, f"{name}, {label}", ours, base, target), b.log)


def _search_body(mode: str, query: str, vector, model: str) -> dict:
    """A search selection; the vector is converted to a JSON list here, in the timed call, as a
    client would."""
    if mode == "keyword":
        return {"selector": "search", "query": query, "k": SEARCH_K, "mode": "keyword"}
    return {
        "selector": "search",
        "query": query if mode == "hybrid" else "",
        "k": SEARCH_K,
        "mode": mode,
        "model": model,
        "query_vector": [float(x) for x in vector],
    }


def _search_rows(
    b: Bench, post: Post, area: str, label: str, cid: int, queries: list[tuple[str, object]]
) -> None:
    """Keyword, semantic and hybrid search, each query once (repeating one would time a cache)."""
    path, model = f"{API}/contexts/{cid}/select", b.data.model
    scale = b.data.sizes.largest_messages >= SCALE_MESSAGES
    naive_queries = queries[: max(3, b.samples // 5)]
    naive_of = {
        "keyword": lambda q, v: baseline.keyword(cid, q, SEARCH_K),
        "semantic": lambda q, v: baseline.semantic(cid, model, v, SEARCH_K),
        "hybrid": lambda q, v: baseline.hybrid(cid, q, model, v, SEARCH_K),
    }
    targets = {
        "keyword": BOUNDED if scale else Target("<=", 20, "p50 ≤ 20 ms"),
        "semantic": Target("<=", 15, "p50 ≤ 15 ms"),
        "hybrid": BOUNDED,
    }
    for mode in ("keyword", "semantic", "hybrid"):
        ours: Latency = time_each(
            [
                lambda q=q, v=v, mode=mode: post(path, _search_body(mode, q, v, model))
                for q, v in queries
            ]
        )
        naive = naive_each(
            cid, [lambda q=q, v=v, mode=mode: naive_of[mode](q, v) for q, v in naive_queries]
        )
        row = Row(area, f"{mode} k={SEARCH_K}, {label}", ours, naive, targets[mode])
        b.report.add(row, b.log)
