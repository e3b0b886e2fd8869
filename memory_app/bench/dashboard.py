"""Dashboard pages: server time and HTML size of the pages an operator opens on the largest
context and the longest run."""

from __future__ import annotations

from urllib.parse import quote

from django.urls import NoReverseMatch, reverse

from memory_app.bench.harness import API, MAX_TOKENS, WINDOW_K, Bench, BenchError
from memory_app.bench.measure import Amount, Row, Target, time_calls
from memory_app.models import Context, Message, Run, Step


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
    pages += _runs_table_pages(largest)
    pages += _search_pages(b, largest)
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


def _runs_table_pages(largest: Context) -> list[tuple[str, str | None]]:
    """The runs table across every context (one page of 50), as a reviewer opens it: unfiltered,
    the failed runs with errors, one context's key and the costliest first; and the home page,
    which leads with the failed and running runs."""
    runs = _url("runs")
    if runs is None:
        return [("runs table", None)]
    size = f"{Run.objects.count():,} runs, {Step.objects.count():,} steps"
    key, value = next(iter(largest.keys.items()))
    return [
        ("home page (failed and running runs)", _url("home")),
        (f"runs table ({size})", runs),
        (f"runs table, failed with errors ({size})", f"{runs}?status=failed&has_error=1"),
        (f"runs table, one context's key ({size})", f"{runs}?key={quote(f'{key}={value}')}"),
        (f"runs table, costliest first ({size})", f"{runs}?sort=cost"),
    ]


def _search_pages(b: Bench, largest: Context) -> list[tuple[str, str | None]]:
    """Search everything across every context, as a reviewer types it: a word of the largest
    context's latest message (frequent in the dataset's vocabulary) and two of its words; the
    Agent API's answer to the same search is timed here too (its own row)."""
    search = _url("search")
    if search is None:
        return [("search everything", None)]
    text = (
        Message.objects.filter(context_id=largest.pk, text__gt="")
        .order_by("-seq")
        .values_list("text", flat=True)
        .first()
    ) or "report"
    words = [w for w in text.split() if w.isalpha() and len(w) > 3][:2] or ["report"]
    size = f"{Message.objects.count():,} msgs, {Step.objects.count():,} steps"
    one, two = quote(words[0]), quote(" ".join(words))
    api = f"{API}/search?q={two}"
    try:
        b.get(api)
        latency = time_calls(lambda: b.get(api), n=max(5, b.samples // 2))
        target = Target("<=", 150, "p50 ≤ 150 ms")
        name = f"search everything API, two words ({size})"
        b.report.add(Row("dashboard", name, latency, None, target), b.log)
    except BenchError as exc:
        b.report.skip("dashboard: search everything API", f"failed: {exc}", b.log)
    return [
        (f"search everything, one word ({size})", f"{search}?q={one}"),
        (f"search everything, two words ({size})", f"{search}?q={two}"),
    ]


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
