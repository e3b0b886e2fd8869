"""Messages' full-text vectors, off the write path (`MessageSearch`, `Context.search_seq`).

Parsing text into a tsvector was a third of PostgreSQL's work for a batch of messages. A large
batch (COPY) is therefore stored without it; the indexer fills `memory_app_messagesearch` after
the commit, one context at a time in seq order, and moves the context's `search_seq` on. Small
appends to a context that is caught up write their vectors in their own transaction (a chat
turn is searchable by index at once and the indexer has nothing to do).

What a search may rely on, for every context:
- a live message with `seq <= search_seq` has its vector in MessageSearch, current with its text,
  and a pruned one has none (migration 0013's triggers parse an edited text again, drop the
  vector of a pruned or deleted message and write it back for a restored one);
- a message with `seq > search_seq` may not: searches match it from its text, so it is found the
  moment its batch commits, only more slowly until the indexer catches up.

Every vector is `memory_app_search_vector(config, text)` (migration 0018): the vector of the
text's first `memory_app_search_chars()` characters, so that no text, however long, exceeds
PostgreSQL's limit on a tsvector; a message is found by the words of that first part. A vector
that cannot be written all the same (a fault of that row, not of the connection) is stored null
with its error, and the indexer goes on: one message never holds up the others.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.postgres.search import SearchConfig, SearchVectorField
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Func

from memory_app import pipelines
from memory_app.models import FTS_CONFIG

log = logging.getLogger(__name__)

TABLE = "memory_app_messagesearch"
# Messages waiting for their vector, over all contexts (also read by /healthz).
PENDING_SQL = (
    "SELECT coalesce(sum(last_seq - search_seq), 0) FROM memory_app_context "
    "WHERE search_seq < last_seq"
)

WRITE_SQL = (
    f"INSERT INTO {TABLE} (context_id, seq, search_vector)"  # noqa: S608 - constants
    " SELECT context_id, seq, memory_app_search_vector(%s::regconfig, text)"
    " FROM memory_app_message"
    " WHERE context_id = %s AND seq > %s AND seq <= %s AND pruned_at IS NULL"
    " ON CONFLICT (context_id, seq) DO UPDATE"
    " SET search_vector = EXCLUDED.search_vector, error = NULL"
)
FAILED_SQL = (
    f"INSERT INTO {TABLE} (context_id, seq, search_vector, error) VALUES (%s, %s, NULL, %s)"  # noqa: S608
    " ON CONFLICT (context_id, seq) DO UPDATE SET search_vector = NULL, error = EXCLUDED.error"
)
# SQLSTATE classes of faults that are not one row's: connection, transaction rollback
# (deadlock, serialization), resources, lock not available, cancel or shutdown, system error.
# They propagate, and the whole range is tried again later.
PASSING_FAULTS = {"08", "40", "53", "55", "57", "58"}


def row_fault(exc: DatabaseError) -> bool:
    """A fault of the row a statement wrote (its SQLSTATE's class not a connection's,
    transaction's, resource's or the server's)."""
    state = getattr(exc.__cause__, "sqlstate", None)
    return bool(state) and state[:2] not in PASSING_FAULTS


def _error_text(exc: DatabaseError) -> str:
    """SQLSTATE and primary message: the detail may quote the whole row."""
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    message = (diag.message_primary if diag else None) or str(exc).split("\n", 1)[0]
    return f"{getattr(cause, 'sqlstate', None) or 'error'}: {message}"


def _write_range(cursor, context_id: int, after: int, upto: int) -> int:
    """Parse and store the vectors of the context's live messages with after < seq <= upto.

    In one statement; when a row's vector fails it, each message is written on its own (a
    savepoint each) and the ones that fail are stored without a vector, with their error."""
    try:
        with transaction.atomic():
            with pipelines.synced():
                cursor.execute(WRITE_SQL, [FTS_CONFIG, context_id, after, upto])
            return cursor.rowcount
    except DatabaseError as exc:
        if not row_fault(exc):
            raise
    cursor.execute(
        "SELECT seq FROM memory_app_message WHERE context_id = %s AND seq > %s AND seq <= %s"
        " AND pruned_at IS NULL ORDER BY seq",
        [context_id, after, upto],
    )
    seqs = [seq for (seq,) in cursor.fetchall()]
    for seq in seqs:
        try:
            with transaction.atomic(), pipelines.synced():
                cursor.execute(WRITE_SQL, [FTS_CONFIG, context_id, seq - 1, seq])
        except DatabaseError as exc:
            if not row_fault(exc):
                raise
            error = _error_text(exc)
            log.warning("full-text vector of context %s seq %s failed: %s", context_id, seq, error)
            cursor.execute(FAILED_SQL, [context_id, seq, error])
    return len(seqs)


def text_vector(column: str = "text") -> Func:
    """The ORM expression of a message's vector, as MessageSearch holds it."""
    return Func(
        SearchConfig(FTS_CONFIG),
        F(column),
        function="memory_app_search_vector",
        output_field=SearchVectorField(),
    )


_indexed_chars: int | None = None


def indexed_chars() -> int:
    """How many leading characters of a message's text its full-text vector covers (the
    database's `memory_app_search_chars()`, read once per process)."""
    global _indexed_chars
    if _indexed_chars is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT memory_app_search_chars()")
            _indexed_chars = int(cursor.fetchone()[0])
    return _indexed_chars


def index_messages(context_id: int, first_seq: int, last_seq: int) -> None:
    """Write the vectors of messages just stored, seqs `first_seq..last_seq` of one context (in
    the caller's transaction, which holds the context's row)."""
    with connection.cursor() as cursor:
        _write_range(cursor, context_id, first_seq - 1, last_seq)


# Contexts behind, read per round of the claim (plain reads, any number of shards on Citus).
CANDIDATES = 16
BEHIND_SQL = (
    "SELECT id FROM memory_app_context WHERE search_seq < last_seq AND id > %s ORDER BY id LIMIT %s"
)
# One context's row by its id: on Citus a row lock names its distribution value.
CLAIM_SQL = (
    "SELECT id, search_seq, last_seq FROM memory_app_context"
    " WHERE id = %s AND search_seq < last_seq FOR NO KEY UPDATE SKIP LOCKED"
)


def claim_behind(cursor) -> tuple[int, int, int] | None:
    """Lock the first context that is behind and not held by a writer or another indexer:
    (id, search_seq, last_seq), or None.

    Two steps: the contexts behind are read without a lock (`context_search_behind_idx`, a few
    at a time in id order), then each is locked by its id with SKIP LOCKED until one is free;
    the lock re-reads the row, so a context that caught up meanwhile is passed over."""
    after = 0
    while True:
        cursor.execute(BEHIND_SQL, [after, CANDIDATES])
        ids = [i for (i,) in cursor.fetchall()]
        for context_id in ids:
            cursor.execute(CLAIM_SQL, [context_id])
            if (row := cursor.fetchone()) is not None:
                return row
        if len(ids) < CANDIDATES:
            return None
        after = ids[-1]


def index_batch(*, batch_size: int | None = None) -> int | None:
    """Parse the next up to `batch_size` seqs of one context that is behind, in one committed
    transaction; returns the messages written, or None when no context is behind.

    The context's row is locked while it is filled (SKIP LOCKED: a context being appended to is
    left for the next round): an appender waits for it, so the messages read here are every one
    up to the `last_seq` read with the lock, and `search_seq` never passes a message that has no
    vector. FOR NO KEY UPDATE, as appenders and the triggers take it: rows that only reference
    the context (runs, audit events) are not held up."""
    size = batch_size or settings.AGENTMEMORY_INDEXER_BATCH
    with transaction.atomic(), connection.cursor() as cursor:
        row = claim_behind(cursor)
        if row is None:
            return None
        context_id, done, last = row
        upto = min(last, done + size)
        written = _write_range(cursor, context_id, done, upto)
        cursor.execute(
            "UPDATE memory_app_context SET search_seq = %s WHERE id = %s", [upto, context_id]
        )
    return written


def index_pending(*, batch_size: int | None = None, max_batches: int | None = None) -> int:
    """Fill every context that is behind (each batch committed); returns messages written.
    Contexts locked by a writer meanwhile are skipped (the indexer thread looks again a second
    later; `embed_worker` at its next turn)."""
    total = batches = 0
    while max_batches is None or batches < max_batches:
        written = index_batch(batch_size=batch_size)
        if written is None:
            break
        total += written
        batches += 1
    return total


def pending_count() -> int:
    """Messages waiting for their vector, over all contexts."""
    with connection.cursor() as cursor:
        cursor.execute(PENDING_SQL)
        return int(cursor.fetchone()[0])


def reindex_from(context_id: int, seq: int) -> None:
    """Messages from `seq` on were written below the context's `search_seq` (an import into an
    existing context): move it back so they are matched from their text until re-indexed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memory_app_context SET search_seq = LEAST(search_seq, %s) WHERE id = %s",
            [max(seq - 1, 0), context_id],
        )


def truncation_notes(messages) -> list[str]:
    """A note for each message whose text is longer than its full-text vector covers."""
    limit = indexed_chars()
    return [
        f"message #{m.seq} is longer than {limit} characters: keyword search reads its"
        f" first {limit} only"
        for m in messages
        if len(m.text) > limit
    ]
