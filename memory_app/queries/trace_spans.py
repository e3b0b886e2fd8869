"""The trace spans a context already keeps, among those an export or a batch of queued exports
brings: one statement for many contexts and spans, its ids sent as two text parameters rather
than one ORM `IN` list per column (whose compilation and psycopg's query splitting cost more
than the read itself at thousands of spans); and the contexts traces went to."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection

from memory_app.models import Context, SpanQueue, TraceSpan

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
# so on Citus a plain SELECT fanned out to the shards.
_PLACED = """
SELECT s.trace_id, c.keys::text, 0 AS source, 0 AS queued
FROM {spans} s JOIN {contexts} c ON c.id = s.context_id
WHERE s.trace_id = ANY(%(ids)s){confined}
UNION ALL
SELECT t.trace_id, c.keys::text, 1, q.id
FROM {queue} q JOIN {contexts} c ON c.id = q.context_id
CROSS JOIN LATERAL unnest(q.trace_ids) AS t(trace_id)
WHERE q.trace_ids && %(ids)s::varchar(32)[] AND t.trace_id = ANY(%(ids)s){confined}
ORDER BY source, queued
"""


def trace_contexts(trace_ids: list[str], confinement: dict[str, Any]) -> dict[str, dict]:
    """The keys of the context each of these traces went to, kept or still queued, among the
    contexts whose keys contain `confinement` (all for an empty one), in one statement."""
    if not trace_ids:
        return {}
    sql = _PLACED.format(
        spans=TraceSpan._meta.db_table,
        queue=SpanQueue._meta.db_table,
        contexts=Context._meta.db_table,
        confined=" AND c.keys @> %(confinement)s::jsonb" if confinement else "",
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, {"ids": list(trace_ids), "confinement": json.dumps(confinement)})
        found = cursor.fetchall()
    placed: dict[str, dict] = {}
    for trace_id, keys, _, _ in found:
        if trace_id not in placed:
            placed[trace_id] = json.loads(keys)
    return placed
