"""Storage: the bytes on disk a stored message costs, its vectors and every index included."""

from __future__ import annotations

from memory_app.bench.harness import Bench
from memory_app.bench.measure import Amount, Row, Target

# Every table a stored message occupies: the message, its full-text vector, its vectors (and
# those waiting for their HNSW graph) and (while its provider fails) its vectors' retries.
STORED_TABLES = (
    "memory_app_message",
    "memory_app_messagesearch",
    "memory_app_embedding",
    "memory_app_embeddingwaiting",
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
