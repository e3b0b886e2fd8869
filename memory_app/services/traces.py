"""OpenTelemetry trace ingest: spans (decoded by `memory_app.interop.otlp`) -> runs and steps.

One mapping (a request's, or a batch of queued exports of a context: `span_queue`) is one
transaction. Its spans are kept first (`TraceSpan`, idempotent by trace and span id), then every
trace that gained spans is brought up to date from all the spans kept for it, whoever brought
them:

- the trace's run (client id `otel:<trace id>`) is created with its first span;
- a step is written once the span that makes it has arrived (a CHAIN span ends after the LLM and
  TOOL spans inside it, so those are already kept); its client id is that span's id, so a batch
  sent twice writes nothing new;
- steps directly under the root (task, planning, GenAI-style flat steps) and the run's outcome
  are written when the root span arrives, which an exporter sends last;
- steps are renumbered by start time, whatever order the requests came in;
- log events (`POST /v1/logs`) are kept beside the spans, as rows of role `log` whose parent is
  the span they belong to and whose id is a digest of their content (a log record has no id of
  its own), so a re-sent record is not kept twice; they join their span's step when it is made.

Every write goes through the run and context services (`memory_app.services`).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from memory_app import auth
from memory_app.db import copy_models
from memory_app.errors import Invalid, KeysNotAllowed
from memory_app.interop import otlp
from memory_app.interop.otlp_steps import (
    action_step,
    flat_step,
    planning_step,
    run_agent_name,
    run_outcome,
    run_task,
    system_prompt,
    task_step,
)
from memory_app.models import (
    ApiKey,
    Context,
    Run,
    RunStatus,
    Step,
    TraceSpan,
    keys_digest,
)
from memory_app.queries.trace_spans import (
    SPAN_FIELDS,
    context_ids,
    kept_spans,
    trace_contexts,
)
from memory_app.services.contexts import context_get_or_create
from memory_app.services.runs import (
    run_create,
    run_finish,
    run_update,
    step_fill,
    steps_append,
    steps_order_by_start,
)

STEP_CHUNK = 200


def _when(ns: int | None) -> datetime | None:
    return datetime.fromtimestamp(ns / otlp.NS, tz=UTC) if ns else None


def traces_ingest(*, key: ApiKey, spans: list[dict[str, Any]]) -> dict[str, Any]:
    """Store decoded spans as runs and steps of the contexts their attributes name, all or nothing,
    in the caller's request (the synchronous path; `span_queue` queues them instead).

    Returns `{"spans", "new_spans", "rejected", "rejected_ids", "runs"}`; `rejected` counts spans
    sent again with different content (the first version is kept).
    """
    return _ingest(key=key, spans=span_rows(spans))


def logs_ingest(*, key: ApiKey, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Keep decoded log records with the spans of their traces and bring those traces' runs up to
    date, all or nothing. A record outside any span has no step to join: it is not kept and
    counts as `rejected` (its index in `rejected_ids`)."""
    kept, outside = log_rows(records)
    result = _ingest(key=key, spans=kept)
    return {**result, "rejected": len(outside), "rejected_ids": outside}


def span_rows(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Decoded spans as the rows kept of them, each with its role."""
    return [_row({**s, "role": otlp.span_role(s)}) for s in spans]


def log_rows(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Decoded log records as rows beside the spans, and the indexes of the records outside any
    span (not kept)."""
    kept, outside = [], []
    for index, record in enumerate(records):
        if record["trace_id"] and record["span_id"]:
            kept.append(_row(_log_span(record)))
        else:
            outside.append(str(index))
    return kept, outside


def _log_span(record: dict[str, Any]) -> dict[str, Any]:
    """A log record as a row beside the spans: its id a digest of its content."""
    digest = hashlib.sha256(
        json.dumps(record, sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()
    return {
        "trace_id": record["trace_id"],
        "span_id": digest[:16],
        "parent_span_id": record["span_id"],
        "name": record["name"],
        "role": otlp.LOG,
        "start_ns": record["time_ns"],
        "end_ns": record["time_ns"],
        "status": "unset",
        "status_message": "",
        "attributes": record["attributes"],
        "events": [],
        "body": record["body"],
        "resource": record["resource"],
        "scope": record["scope"],
    }


def traces_place(
    *, key: ApiKey, rows: list[dict[str, Any]], create: bool = True
) -> tuple[list[tuple[int, list[dict]]] | None, dict[tuple, dict[str, Any]]]:
    """The contexts (ids) the rows of an export go to, each with its rows, created when missing
    (`create`; else None when one is missing); and the rows' spans already kept, by (context id,
    trace id, span id), each a dict of `SPAN_FIELDS`.

    A trace stays in the context its first spans (or log events) went to, kept or still queued
    (later spans may lack a session id); a new trace goes where its spans' attributes say. A
    context outside the key's confinement is refused (`KeysNotAllowed`), and so is a span id
    that repeats within the export (`Invalid`)."""
    if len({(r["trace_id"], r["span_id"]) for r in rows}) != len(rows):
        raise Invalid("a span id repeats within the request")
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_trace[row["trace_id"]].append(row)
    known, kept = trace_contexts(rows, key.context_keys or {})
    groups: dict[str, tuple[dict, list[dict]]] = {}
    for trace_id, trace_rows in by_trace.items():
        keys = known.get(trace_id) or otlp.context_keys([r["data"] for r in trace_rows])
        groups.setdefault(keys_digest(keys), (keys, []))[1].extend(trace_rows)
    for keys, _ in groups.values():
        if not auth.keys_allowed(key, keys):
            raise KeysNotAllowed(
                f"spans name context keys {keys}; this API key may only use contexts whose keys "
                f"contain {key.context_keys}"
            )
    found = context_ids(list(groups))
    if not create and len(found) < len(groups):
        return None, kept
    placed = [
        (found.get(digest) or context_get_or_create(keys=keys)[0].pk, group)
        for digest, (keys, group) in groups.items()
    ]
    return placed, kept


def _ingest(*, key: ApiKey, spans: list[dict[str, Any]]) -> dict[str, Any]:
    with transaction.atomic():
        placed, _ = traces_place(key=key, rows=spans)
        result = traces_map(placed)
    return {"spans": len(spans), **result}


def traces_map(placed: list[tuple[int, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Keep the rows (`span_rows`, `log_rows`) in their contexts and bring every trace that gained
    rows up to date, in the caller's transaction. Answers `{"new_spans", "rejected",
    "rejected_ids", "runs"}`."""
    new_count, rejected, runs, pending = 0, [], [], []
    # One writer per context at a time: two writers of one trace must not both create its run.
    # Locked in one order, so two writers over the same contexts do not deadlock.
    locked = {
        c.pk: c
        for c in Context.objects.select_for_update()
        .filter(pk__in=[context_id for context_id, _ in placed])
        .order_by("pk")
    }
    for context_id, group in placed:
        context = locked[context_id]
        new, differing = trace_spans_record(context=context, spans=group)
        new_count += len(new)
        rejected += differing
        starts: dict[str, int] = {}
        late_logs: dict[str, set[str]] = defaultdict(set)
        for row in new:
            starts[row.trace_id] = min(starts.get(row.trace_id, row.start_ns), row.start_ns)
            if row.role == otlp.LOG:
                late_logs[row.trace_id].add(row.span_id)
        pending += [
            (start, trace_id, context, late_logs[trace_id]) for trace_id, start in starts.items()
        ]
    # The runs of one export are made in the order their traces started.
    for _, trace_id, context, logs in sorted(pending, key=lambda p: (p[0], p[1])):
        run = _bring_up_to_date(context=context, trace_id=trace_id, new_logs=logs)
        if run is not None:
            runs.append(run.pk)
    return {
        "new_spans": new_count,
        "rejected": len(rejected),
        "rejected_ids": rejected,
        "runs": runs,
    }


def _row(span: dict[str, Any]) -> dict[str, Any]:
    return {
        "trace_id": span["trace_id"],
        "span_id": span["span_id"],
        "parent_span_id": span["parent_span_id"],
        "name": span["name"][:500],
        "role": span["role"],
        "start_ns": span["start_ns"],
        "end_ns": span["end_ns"],
        "data": {
            k: span[k]
            for k in (
                "status",
                "status_message",
                "attributes",
                "events",
                "body",
                "resource",
                "scope",
            )
            if k in span
        },
    }


# What a purged span's content reads as: its ids, name, role and times stay (they place the
# spans around it in the trace), everything the agent wrote is gone.
_EMPTY = {
    "status": "unset",
    "status_message": "",
    "attributes": {},
    "events": [],
    "resource": {},
    "scope": "",
}
# A purged task step's text on the root span (`otlp_steps.run_task` reads these); the rest of the
# root (outcome, final answer, token totals) still describes the run.
TASK_ATTRIBUTES = ("smolagents.task", "input.value", "gen_ai.input.messages")
# OpenInference flattens a LangChain root's input messages into these.
TASK_PREFIXES = ("llm.input_messages.",)


def _span(row: TraceSpan) -> dict[str, Any]:
    return {
        "trace_id": row.trace_id,
        "span_id": row.span_id,
        "parent_span_id": row.parent_span_id,
        "name": row.name,
        "role": row.role,
        "start_ns": row.start_ns,
        "end_ns": row.end_ns,
        **_EMPTY,
        **row.data,
    }


def _tombstones(spans: list[dict[str, Any]]) -> set[str]:
    """Client ids of the purged steps of a trace: no later span brings them back."""
    out = set()
    for s in spans:
        if s.get("purged"):
            out.add(s["span_id"])
        if s.get("purged_task"):
            out.add(f"{s['span_id']}:task")
    return out


def _with_logs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans among a trace's kept rows, each with the log events of its own (`logs`, in time
    order) attached."""
    spans = [r for r in rows if r["role"] != otlp.LOG]
    by_id = {s["span_id"]: s for s in spans}
    for s in spans:
        s["logs"] = []
    for log in rows:
        if log["role"] == otlp.LOG and log["parent_span_id"] in by_id:
            by_id[log["parent_span_id"]]["logs"].append(log)
    return spans


def _bring_up_to_date(*, context: Context, trace_id: str, new_logs: set[str]) -> Run | None:
    """The trace's run after its new rows, or None while only log events of it have come.
    `new_logs` are the ids of the log events among the new rows: a step written before they came
    is completed with what they hold."""
    rows = [
        _span(r)
        for r in TraceSpan.objects.filter(context=context, trace_id=trace_id).order_by("start_ns")
    ]
    spans = _with_logs(rows)
    if not spans:
        return None
    run = Run.objects.filter(context=context, client_id=f"otel:{trace_id}").first()
    if run is None:
        run, _ = run_create(
            context=context,
            client_id=f"otel:{trace_id}",
            framework=otlp.framework(spans[0]),
            metadata={"otel_trace_id": trace_id},
            started_at=_when(spans[0]["start_ns"]),
        )
    TraceSpan.objects.filter(context=context, trace_id=trace_id, run__isnull=True).update(run=run)
    done = set(
        Step.objects.filter(context_id=run.context_id, run=run).values_list("client_id", flat=True)
    )
    items, root, sources = _steps(spans)
    purged = _tombstones(rows)
    # A span of a purged step that arrives later (a child sent after its parent) is erased too.
    _redact(context, rows, {c: sources[c] for c in purged if c in sources})
    # Log events that came after their span's step was written complete it (and the task step,
    # whose task may be read from a model call's messages).
    filled = False
    for item in items:
        late = new_logs & set(sources[item["client_id"]]) or (new_logs and item["kind"] == "task")
        if late and item["client_id"] in done - purged:
            filled = step_fill(run=run, item=item) or filled
    done |= purged
    # In start order, so renumbering is needed only when a step starts before one already written.
    items = sorted(
        (i for i in items if i["client_id"] not in done), key=lambda i: i.get("start_time") or 0.0
    )
    for i in range(0, len(items), STEP_CHUNK):
        steps_append(run=run, items=items[i : i + STEP_CHUNK])
    if items:
        steps_order_by_start(run=run)
    # The root ends last, but a retried batch may bring steps after it: then finish again.
    # A purged root (or one whose content expired) no longer says how the run ended.
    if (
        root is not None
        and not root.get("purged")
        and (run.status == RunStatus.RUNNING or items or filled)
    ):
        llms = [s for s in spans if s["role"] == otlp.LLM]
        task = (
            run_task(root, llms)
            if root["role"] != otlp.TOOL and not root.get("purged_task")
            else None
        )
        run_update(
            run=run,
            task=task,
            agent_name=run_agent_name(root) if root["role"] in _AGENT_ROOTS else None,
            system_prompt=system_prompt(llms),
            started_at=_when(root["start_ns"]),
        )
        outcome = run_outcome(root, llms)
        if Step.objects.filter(
            context_id=run.context_id, run=run, total_tokens__isnull=False
        ).exists():
            # The steps' own usage, as for any other run (smolagents' AGENT span leaves the
            # planning calls out of its totals).
            outcome.update(input_tokens=None, output_tokens=None, total_tokens=None)
        run = run_finish(run=run, finished_at=_when(root["end_ns"]), **outcome)
    return run


# Roots that stand for an agent (or a graph, or the caller's own span around model calls), not
# for one model or tool call.
_AGENT_ROOTS = (otlp.AGENT, otlp.OTHER)


# Why long: one pass over the trace tree that tells each mapping (smolagents' steps, planning
# calls beside them, a lone call, model calls under an agent or graph) apart.
def _steps(
    spans: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, dict[str, list[str]]]:
    """The logbook items the kept spans of one trace make so far, its root span if it came, and
    for each item's client id the ids of the spans it was made from, their log events included
    (what a purge erases). `spans` come from `_with_logs`."""
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str, list[dict]] = defaultdict(list)
    for s in spans:
        children[s["parent_span_id"]].append(s)

    def descendants(span_id: str) -> list[dict]:
        out, stack = [], list(children.get(span_id, []))
        while stack:
            s = stack.pop()
            out.append(s)
            stack.extend(children.get(s["span_id"], []))
        return out

    def outermost_calls(span_id: str) -> list[dict]:
        """The model and tool calls under a span that no other call contains (a LangChain
        model call may hold the OpenAI client's own span)."""
        out, stack = [], list(children.get(span_id, []))
        while stack:
            s = stack.pop()
            if s["role"] in (otlp.LLM, otlp.TOOL):
                out.append(s)
            else:
                stack.extend(children.get(s["span_id"], []))
        return sorted(out, key=lambda s: s["start_ns"])

    def inside_step(span: dict) -> bool:
        parent = by_id.get(span["parent_span_id"])
        while parent is not None:
            if parent["role"] == otlp.STEP:
                return True
            parent = by_id.get(parent["parent_span_id"])
        return False

    items: list[dict[str, Any]] = []
    sources: dict[str, list[str]] = {}

    def add(item: dict[str, Any], made_of: list[dict]) -> None:
        items.append(item)
        sources[item["client_id"]] = [s["span_id"] for s in made_of] + [
            log["span_id"] for s in made_of for log in s.get("logs") or []
        ]

    steps = [s for s in spans if s["role"] == otlp.STEP and not inside_step(s)]
    for step in steps:
        inner = descendants(step["span_id"])
        add(
            action_step(
                step,
                llms=[s for s in inner if s["role"] == otlp.LLM],
                tools=[s for s in inner if s["role"] == otlp.TOOL],
            ),
            [step, *inner],
        )
    # smolagents plans outside its steps: a model call beside a step (same parent) is a planning
    # step, written as soon as that is known, so it shows while the run goes on.
    step_parents = {s["parent_span_id"] for s in steps if s["parent_span_id"]}
    for s in spans:
        if s["role"] == otlp.LLM and s["parent_span_id"] in step_parents and not inside_step(s):
            add(planning_step(s), [s])
    root = next((s for s in spans if not s["parent_span_id"]), None)
    if root is None or root["role"] == otlp.STEP:
        return items, root, sources
    if root["role"] in (otlp.LLM, otlp.TOOL):
        # A lone model or tool call is a one-step run.
        inner = descendants(root["span_id"])
        add(flat_step(root, [s for s in inner if s["role"] == otlp.TOOL]), [root, *inner])
        return items, root, sources
    loose = [] if steps else outermost_calls(root["span_id"])
    if root["role"] == otlp.AGENT or loose:
        task = run_task(root, [s for s in loose if s["role"] == otlp.LLM])
        if root["role"] == otlp.AGENT or task:
            add(task_step(root, task), [root])
    # GenAI-style and LangChain / LangGraph: every model call is a step; each tool call joins
    # the model call before it.
    anchors: list[tuple[dict, list[dict]]] = []
    for s in loose:
        if s["role"] == otlp.LLM or not anchors:
            anchors.append((s, []))
        if s["role"] == otlp.TOOL:
            anchors[-1][1].append(s)
    call_step: dict[str, str] = {}
    for anchor, tools in anchors:
        inner = [d for c in (anchor, *tools) for d in descendants(c["span_id"])]
        add(flat_step(anchor, tools), [anchor, *tools, *inner])
        call_step.update({c["span_id"]: anchor["span_id"] for c in (anchor, *tools)})
    for client_id, around in _runnables(spans, by_id, root, call_step).items():
        sources[client_id] += [s["span_id"] for s in around]
    return items, root, sources


def _runnables(
    spans: list[dict[str, Any]], by_id: dict[str, dict], root: dict, call_step: dict[str, str]
) -> dict[str, list[dict]]:
    """The spans around the model and tool calls (LangChain's graph nodes, prompts, routers), by
    the step they belong to: the one whose calls they hold or, holding none, their nearest
    ancestor's. They carry copies of the messages, which a purge of the step erases with it; a
    span holding the calls of several steps (the graph) stays out."""

    def ancestors(span: dict):
        parent = by_id.get(span["parent_span_id"])
        while parent is not None and parent is not root:
            yield parent
            parent = by_id.get(parent["parent_span_id"])

    below: dict[str, set[str]] = defaultdict(set)
    for span_id, client_id in call_step.items():
        for a in ancestors(by_id[span_id]):
            below[a["span_id"]].add(client_id)
    out: dict[str, list[dict]] = defaultdict(list)
    for span in spans:
        if span is root or span["span_id"] in call_step or span["role"] != otlp.OTHER:
            continue
        holder = next(
            (below[s["span_id"]] for s in (span, *ancestors(span)) if below.get(s["span_id"])),
            set(),
        )
        if len(holder) == 1:
            out[next(iter(holder))].append(span)
    return out


def _redact(context: Context, spans: list[dict[str, Any]], made_of: dict[str, list[str]]) -> None:
    """Erase what the agent wrote from the spans these purged steps were made of.

    `made_of` maps a purged step's client id to its spans (`_steps`). A span keeps its ids,
    name, role and times, so the rest of the trace still maps as before, and `purged` marks it:
    the step it made is not written again. A task step's span is the run's root: only the task
    leaves it (`purged_task`), the outcome stays with the run.
    """
    by_id = {s["span_id"]: s for s in spans}
    whole, task_roots = set(), set()
    for client_id, span_ids in made_of.items():
        if client_id.endswith(":task"):
            # The root's own log events hold nothing but what the agent wrote.
            whole.update(
                i for i in span_ids if by_id[i]["role"] == otlp.LOG and not by_id[i].get("purged")
            )
            task_roots.update(
                i
                for i in span_ids
                if by_id[i]["role"] != otlp.LOG and not by_id[i].get("purged_task")
            )
        else:
            whole.update(i for i in span_ids if not by_id[i].get("purged"))
    if not (whole or task_roots):
        return
    trace_ids = {s["trace_id"] for s in spans}
    rows = TraceSpan.objects.filter(
        context=context, trace_id__in=trace_ids, span_id__in=whole | task_roots
    )
    for row in rows.select_for_update():
        if row.span_id in whole:
            row.data = {"purged": True}
        else:
            data = dict(row.data)
            # A LangGraph root's output is its final state: every message, the task first.
            dropped = TASK_ATTRIBUTES + (
                ("output.value",) if data.get("scope") == otlp.LANGCHAIN_SCOPE else ()
            )
            data["attributes"] = {
                k: v
                for k, v in data.get("attributes", {}).items()
                if k not in dropped and not k.startswith(TASK_PREFIXES)
            }
            row.data = {**data, "purged_task": True}
        row.save(update_fields=["data"])
        by_id[row.span_id].update(_EMPTY if row.span_id in whole else {}, **row.data)


def trace_steps_purge(*, run: Run, client_ids: list[str]) -> int:
    """Erase the spans the run's steps with these client ids were made from (a purge of those
    steps, in the caller's transaction); answers how many spans changed.

    Without it a later span of the same trace would map the kept spans again and bring the
    purged steps back live."""
    rows = TraceSpan.objects.filter(context_id=run.context_id, run=run).order_by("start_ns")
    spans = [_span(r) for r in rows]
    if not spans:
        return 0
    _, _, sources = _steps(_with_logs([dict(s) for s in spans]))
    wanted = {c: sources[c] for c in client_ids if c in sources}
    before = [dict(s) for s in spans]
    _redact(run.context, spans, wanted)
    return sum(1 for a, b in zip(before, spans, strict=True) if a != b)


def trace_spans_record(
    *, context: Context, spans: list[dict[str, Any]]
) -> tuple[list[TraceSpan], list[str]]:
    """Keep received spans; a span id already kept is not written again.

    Returns the new rows and the ids of re-sent spans whose content differs from the kept one
    (the kept one wins: a span does not change once it has ended).
    """
    with transaction.atomic():
        fresh, differing = trace_spans_unkept(context=context, spans=spans)
        new = [
            TraceSpan(
                context=context,
                trace_id=s["trace_id"],
                span_id=s["span_id"],
                **{k: s[k] for k in SPAN_FIELDS},
            )
            for s in fresh
        ]
        copy_models(new)
    return new, differing


def trace_spans_unkept(
    *, context: Context, spans: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The spans of the context not kept yet, and the ids of those kept with other content."""
    ids = {(s["trace_id"], s["span_id"]) for s in spans}
    if len(ids) != len(spans):
        raise Invalid("a span id repeats within the request")
    stored = kept_spans([context.pk], spans)
    fresh, differing = [], []
    for s in spans:
        row = stored.get((context.pk, s["trace_id"], s["span_id"]))
        if row is None:
            fresh.append(s)
        elif any(row[k] != s[k] for k in SPAN_FIELDS):
            differing.append(s["span_id"])
    return fresh, differing
