"""OTLP exports are answered once queued; the worker maps them into runs and steps
(memory_app/services/span_queue.py). A test that reads what an export made maps the queue first,
as the worker would."""

from __future__ import annotations

from memory_app.services.span_queue import spans_map_pending


def mapped(response):
    """The export's answer, once every queued span is mapped."""
    spans_map_pending()
    return response


def map_queued() -> int:
    """Map every queued span; the spans mapped."""
    return spans_map_pending()
