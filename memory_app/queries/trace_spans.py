"""The trace spans a context already keeps, among those an export or a batch of queued exports
brings: one statement for many contexts and spans, its ids sent as two text parameters rather
than one ORM `IN` list per column (whose compilation and psycopg's query splitting cost more
than the read itself at thousands of spans); the contexts traces went to, with the spans kept
among an export's; and the contexts keys digests name."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection

from memory_app.db import binding_cursor
from memory_app.models import Context, ContextKey, Run, SpanQueue, TraceSpan

# What a span kept is compared on when it is sent again (its ids aside).
SPAN_FIELDS = ("parent_span_id", "name", "role", "start_ns", "end_ns", "data")


_KEPT = (
    "SELECT context_id, trace_id, span_id, parent_span_id, name, role, start_ns, end_ns,"
    " data::text FROM {table} WHERE context_id = ANY(%s)"
    " AND trace_id = ANY(string_to_array(%s, ',')) AND span_id = ANY(string_to_array(%s, ','))"
)


def kept_spans(context_ids: list[int], rows: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """The kept spans of these contexts whose trace and span ids are among the rows', by
    (context id, trace id, span id), each as a dict of `SPAN_FIELDS`."""
    if not rows or not context_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            _KEPT.format(table=TraceSpan._meta.db_table),
            [
                list(context_ids),
                ",".join({r["trace_id"] for r in rows}),
                ",".join({r["span_id"] for r in rows}),
            ],
        )
        found = cursor.fetchall()
    wanted = {(r["trace_id"], r["span_id"]) for r in rows}
    return {
        (context_id, trace_id, span_id): dict(
            zip(SPAN_FIELDS, (*values, json.loads(data)), strict=True)
        )
        for context_id, trace_id, span_id, *values, data in found
        if (trace_id, span_id) in wanted
    }


# Where traces went: their kept spans' context, then (first queued first) the context of a
# queued export holding them. Filtered by trace id alone (a trace's context is what is asked),
# so on Citus a plain SELECT fanned out to the shards. The kept spans among those asked about
# come with their content in the same statement (what a re-sent span is compared with).
_PLACED = """
SELECT s.trace_id, c.keys::text, 0 AS source, 0 AS queued, s.context_id, s.span_id,
       s.parent_span_id, s.name, s.role, s.start_ns, s.end_ns,
       CASE WHEN s.span_id = ANY(string_to_array(%(spans)s, ',')::varchar(16)[])
            THEN s.data::text END
FROM {spans} s JOIN {contexts} c ON c.id = s.context_id
WHERE s.trace_id = ANY(string_to_array(%(ids)s, ',')){confined}
UNION ALL
SELECT t.trace_id, c.keys::text, 1, q.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM {queue} q JOIN {contexts} c ON c.id = q.context_id
CROSS JOIN LATERAL unnest(q.trace_ids) AS t(trace_id)
WHERE q.trace_ids && string_to_array(%(ids)s, ',')::varchar(32)[]
  AND t.trace_id = ANY(string_to_array(%(ids)s, ',')){confined}
ORDER BY source, queued
"""


def trace_contexts(
    rows: list[dict[str, Any]], confinement: dict[str, Any]
) -> tuple[dict[str, dict], dict[tuple, dict[str, Any]]]:
    """For the traces of these rows (`trace_id`, `span_id`), among the contexts whose keys
    contain `confinement` (all for an empty one), in one statement: the keys of the context each
    trace went to, kept or still queued; and the rows' spans already kept, as `kept_spans`
    answers them."""
    if not rows:
        return {}, {}
    sql = _PLACED.format(
        spans=TraceSpan._meta.db_table,
        queue=SpanQueue._meta.db_table,
        contexts=Context._meta.db_table,
        confined=" AND c.keys @> %(confinement)s::jsonb" if confinement else "",
    )
    params = {
        "ids": ",".join({r["trace_id"] for r in rows}),
        "spans": ",".join({r["span_id"] for r in rows}),
        "confinement": json.dumps(confinement),
    }
    # Bound apart from the text: hundreds of ids quoted into it cost the client more than the
    # statement costs the server. Each list of ids is one text the server splits (hex ids hold
    # no comma): sent as arrays, psycopg escaped every element of each, once per mention.
    with binding_cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    placed: dict[str, dict] = {}
    kept: dict[tuple, dict[str, Any]] = {}
    wanted = {(r["trace_id"], r["span_id"]) for r in rows}
    for trace_id, keys, _, _, context_id, span_id, *values, data in found:
        if trace_id not in placed:
            placed[trace_id] = json.loads(keys)
        if data is not None and (trace_id, span_id) in wanted:
            kept[(context_id, trace_id, span_id)] = dict(
                zip(SPAN_FIELDS, (*values, json.loads(data)), strict=True)
            )
    return placed, kept


def context_ids(digests: list[str]) -> dict[str, int]:
    """The contexts these keys digests name, by digest; a digest whose row is missing, or names
    a context deleted by hand, is left out (`contexts.context_get_or_create` mends it). Two plain
    statements: the digests and the contexts are distributed by different columns on Citus."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT digest, target_id FROM {ContextKey._meta.db_table}"  # noqa: S608
            " WHERE digest = ANY(%s)",
            [digests],
        )
        targets = dict(cursor.fetchall())
        if not targets:
            return {}
        cursor.execute(
            f"SELECT id FROM {Context._meta.db_table} WHERE id = ANY(%s)",  # noqa: S608
            [list(targets.values())],
        )
        found = {pk for (pk,) in cursor.fetchall()}
    return {digest: pk for digest, pk in targets.items() if pk in found}


# Traces a context has seen: spans of theirs kept, or a run made for them (`otel:<trace id>`).
_SEEN = """
SELECT trace_id FROM {spans}
WHERE context_id = %(context)s AND trace_id = ANY(string_to_array(%(ids)s, ','))
UNION
SELECT substr(client_id, 6) FROM {runs}
WHERE context_id = %(context)s AND client_id = ANY(string_to_array(%(clients)s, ','))
"""


def traces_seen(context_id: int, trace_ids: list[str]) -> set[str]:
    """Those of the trace ids the context has kept spans or a run of, in one statement (the
    ORM's two, each compiling an `IN` list of every id, cost more than they read)."""
    if not trace_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            _SEEN.format(spans=TraceSpan._meta.db_table, runs=Run._meta.db_table),
            {
                "context": context_id,
                "ids": ",".join(trace_ids),
                "clients": ",".join(f"otel:{t}" for t in trace_ids),
            },
        )
        return {trace_id for (trace_id,) in cursor.fetchall()}
