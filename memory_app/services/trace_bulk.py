"""Queued OTLP spans of one context mapped many traces at a time (`span_queue`'s batches).

A trace none of whose spans was kept before and that has no run yet, the usual case for a
batch of queued exports, is mapped from the batch in memory: its run, steps, tool calls and
outcome are computed as `traces` computes them and written for all such traces at once
(`runs.runs_create_bulk`), with the spans, in a few statements for the whole batch. A trace that
already has spans or a run (its first spans came in an earlier batch; a step of it was purged)
is brought up to date from everything kept for it, one trace at a time, as `traces` does.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import orjson

from memory_app.db import binding_cursor, draw_ids, json_text
from memory_app.interop import otlp
from memory_app.interop.otlp_steps import run_agent_name, run_outcome, run_task, system_prompt
from memory_app.models import Context, Run, TraceSpan
from memory_app.queries.trace_spans import traces_seen
from memory_app.services import traces
from memory_app.services.runs import NewRun, runs_create_bulk


def traces_map_bulk(*, context: Context, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """As `traces.traces_map` of one context, whose lock the caller holds: the rows of queued
    exports (`traces.span_rows`, `traces.log_rows`; each span once, first received first) kept,
    every trace that gained rows brought up to date. Answers `{"new_spans", "runs"}`.

    The rows are kept first, in one statement that answers those it kept as it kept them, so
    PostgreSQL parses the batch's JSON once: the runs of the traces seen for the first time have
    their ids drawn beforehand (their spans name them; the foreign key is checked at commit)."""
    # Traces the context has seen before (asked before their new spans are kept): mapped from
    # what is kept, one by one.
    seen = traces_seen(context.pk, sorted({r["trace_id"] for r in rows}))
    # A trace seen for the first time makes a run once one of its rows is a span (`_new_run`);
    # the runs of a batch are made (their ids drawn) in the order their traces started.
    starts: dict[str, int] = {}
    spans = set()
    for r in rows:
        starts[r["trace_id"]] = min(r["start_ns"], starts.get(r["trace_id"], r["start_ns"]))
        if r["role"] != otlp.LOG:
            spans.add(r["trace_id"])
    first = sorted((spans - seen), key=lambda t: (starts[t], t))
    (drawn,) = draw_ids([(Run, len(first))])
    run_of = dict(zip(first, drawn, strict=True))
    fresh_rows = _keep_spans(context, rows, run_of)
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for row in fresh_rows:
        by_trace[row["trace_id"]].append(row)
    order = sorted(by_trace, key=lambda t: (starts[t], t))
    new_runs = []
    for trace_id in order:
        if trace_id in run_of:
            spec = _new_run(trace_id, by_trace[trace_id])
            if spec is None:  # its spans name a run that must exist
                raise RuntimeError(f"trace {trace_id} drew a run id and makes no run")
            spec.pk = run_of[trace_id]
            new_runs.append(spec)
    runs_create_bulk(context=context, new=new_runs)
    runs = []
    for trace_id in order:
        if trace_id in run_of:
            runs.append(run_of[trace_id])
            continue
        logs = {r["span_id"] for r in by_trace[trace_id] if r["role"] == otlp.LOG}
        run = traces._bring_up_to_date(context=context, trace_id=trace_id, new_logs=logs)
        if run is not None:
            runs.append(run.pk)
    return {"new_spans": len(fresh_rows), "runs": runs}


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)  # integers past 64 bits, which orjson refuses


# The rows kept in one statement, each with its trace's run when the batch makes it (the others'
# spans are linked as their trace is brought up to date): the JSON read by PostgreSQL, no row
# built in Python. A span already kept is kept once (the first received: the rows go in arrival
# order). The runs come as one JSON object of trace id to run id, and every row names the
# context, so on Citus the statement goes to the context's shard. The rows are read as `json`,
# which keeps each span's data as its text (object keys in the order received; `jsonb` would
# sort them), and come back as kept, so a trace mapped from the queue maps as one read back from
# what is kept.
_KEEP_SPANS = """
INSERT INTO {spans} (context_id, run_id, trace_id, span_id, parent_span_id, name, role,
                     start_ns, end_ns, data, received_at)
SELECT %s, (%s::jsonb ->> (s.value->>'trace_id'))::bigint,
       s.value->>'trace_id', s.value->>'span_id', s.value->>'parent_span_id',
       s.value->>'name', s.value->>'role', (s.value->>'start_ns')::bigint,
       (s.value->>'end_ns')::bigint, s.value->'data', now()
FROM json_array_elements(%s::json) WITH ORDINALITY AS s(value, n)
ORDER BY s.n
ON CONFLICT (context_id, trace_id, span_id) DO NOTHING
RETURNING trace_id, span_id, data::text
"""


def _keep_spans(
    context: Context, rows: list[dict[str, Any]], run_of: dict[str, int]
) -> list[dict[str, Any]]:
    """The rows not kept before, now kept, in arrival order, their data as kept. Bound apart
    from the statement: quoted into its text, megabytes of JSON were escaped by the client and
    read back as a literal by the server."""
    with binding_cursor() as cursor:
        cursor.execute(
            _KEEP_SPANS.format(spans=TraceSpan._meta.db_table),
            [context.pk, json.dumps(run_of), json_text(rows)],
        )
        kept = {(trace_id, span_id): data for trace_id, span_id, data in cursor.fetchall()}
    return [
        {**r, "data": _loads(data)}
        for r in rows
        if (data := kept.get((r["trace_id"], r["span_id"]))) is not None
    ]


def _new_run(trace_id: str, rows: list[dict[str, Any]]) -> NewRun | None:
    """The run a trace seen for the first time makes from these rows, as
    `traces._bring_up_to_date` would write it; None while only log events of it have come."""
    kept = [
        {
            "trace_id": r["trace_id"],
            "span_id": r["span_id"],
            "parent_span_id": r["parent_span_id"],
            "name": r["name"],
            "role": r["role"],
            "start_ns": r["start_ns"],
            "end_ns": r["end_ns"],
            **traces._EMPTY,
            **r["data"],
        }
        for r in sorted(rows, key=lambda r: r["start_ns"])
    ]
    spans = traces._with_logs(kept)
    if not spans:
        return None
    items, root, _ = traces._steps(spans)
    finish = None
    if root is not None:
        llms = [s for s in spans if s["role"] == otlp.LLM]
        outcome = run_outcome(root, llms)
        if any(_step_tokens(i) for i in items):
            # The steps' own usage, as `traces` counts it.
            outcome.update(input_tokens=None, output_tokens=None, total_tokens=None)
        finish = {
            "task": run_task(root, llms) if root["role"] != otlp.TOOL else None,
            "agent_name": run_agent_name(root) if root["role"] in traces._AGENT_ROOTS else None,
            "system_prompt": system_prompt(llms),
            "started_at": traces._when(root["start_ns"]),
            "finished_at": traces._when(root["end_ns"]),
            "outcome": outcome,
        }
    return NewRun(
        client_id=f"otel:{trace_id}",
        framework=otlp.framework(spans[0]),
        metadata={"otel_trace_id": trace_id},
        started_at=traces._when(spans[0]["start_ns"]),
        items=items,
        finish=finish,
    )


def _step_tokens(item: dict[str, Any]) -> bool:
    """Whether the step written from this item has a token total (given or in + out)."""
    return item.get("total_tokens") is not None or (
        item.get("input_tokens") is not None and item.get("output_tokens") is not None
    )
