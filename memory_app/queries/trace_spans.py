"""The trace spans a context already keeps, among those an export or a batch of queued exports
brings: one statement for many contexts and spans, its ids sent as two text parameters rather
than one ORM `IN` list per column (whose compilation and psycopg's query splitting cost more
than the read itself at thousands of spans)."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection

from memory_app.models import TraceSpan

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
