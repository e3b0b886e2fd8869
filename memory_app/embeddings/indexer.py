"""Each model's HNSW index (a partial expression index over its rows, vectors at half precision):
made when the model is first used, rebuilt on demand, and filled by deferred insertion of
the rows a large batch wrote into the waiting side tables."""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from dataclasses import dataclass

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from memory_app import scale_out
from memory_app.embeddings.registry import registered_dimensions

log = logging.getLogger(__name__)
# HNSW indexes on the `vector` type take at most 2,000 dimensions; wider models are scanned exactly.
HNSW_MAX_DIMENSIONS = 2000


INDEX_PREFIX = "embedding_hnswi_"
MESSAGE_VECTORS, MEMORY_VECTORS = "memory_app_embedding", "memory_app_memoryembedding"
# Each table of vectors has its own index per model; the memory table's name is the message
# table's with `memory` before it (migration 0031 made them so).
VECTOR_TABLES = {MESSAGE_VECTORS: "", MEMORY_VECTORS: "memory"}
# Each one's side table of the vectors that wait for the graph (migration 0036), and the
# columns both have, the item's first.
WAITING_TABLES = {
    MESSAGE_VECTORS: "memory_app_embeddingwaiting",
    MEMORY_VECTORS: "memory_app_memoryembeddingwaiting",
}
SHARED_COLUMNS = {
    MESSAGE_VECTORS: "message_id, context_id, model, dimensions, vector",
    MEMORY_VECTORS: "memory_record_id, model, dimensions, vector",
}


def index_name(model: str, dimensions: int, *, prefix: str = INDEX_PREFIX) -> str:
    """`embedding_hnswi_…`: the i (indexed rows only, migration 0011) tells it from the earlier
    indexes of every row, `embedding_hnswh_…` (halfvec, 0010) and `embedding_hnsw_…`."""
    return f"{prefix}{hashlib.sha1(model.encode()).hexdigest()[:12]}_{dimensions}"  # noqa: S324


def index_sql(
    *,
    model: str,
    dimensions: int,
    concurrently: bool,
    name: str | None = None,
    table: str = MESSAGE_VECTORS,
):
    """CREATE INDEX for a model's partial HNSW index (cosine, on `vector::halfvec(D)`) of its
    rows, built with the configured m and ef_construction (`indexed`, true for every row since
    migration 0036, stays in the predicate: every index of the store has the same one); `name`
    other than the model's is for a rebuild. (The migrations that changed the definition carry
    their own copies of the statement as it was.)"""
    from psycopg import sql

    return sql.SQL(
        "CREATE INDEX {concurrently} IF NOT EXISTS {name} ON {table} "
        "USING hnsw ((vector::halfvec({dims})) halfvec_cosine_ops) "
        "WITH (m = {m}, ef_construction = {efc}) "
        "WHERE model = {model} AND dimensions = {dims} AND indexed"
    ).format(
        concurrently=sql.SQL("CONCURRENTLY" if concurrently else ""),
        name=sql.Identifier(name or VECTOR_TABLES[table] + index_name(model, dimensions)),
        table=sql.Identifier(table),
        dims=sql.Literal(int(dimensions)),
        m=sql.Literal(int(settings.AGENTMEMORY_HNSW_M)),
        efc=sql.Literal(int(settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION)),
        model=sql.Literal(model),
    )


_ensured: set[tuple[str, int]] = set()


def ensure_model_index(*, model: str, dimensions: int) -> bool:
    """Create the partial HNSW expression index for one model (cosine), once.

    `vector` has no fixed dimensions (models differ), so the index is on `vector::halfvec(D)`
    (at half precision) restricted to the model's rows; searches use the same expression and
    predicate so the planner can pick it. Built CONCURRENTLY outside a transaction so writes go on
    meanwhile; an advisory lock keeps two workers from building it at the same time. Returns False
    when the model is too wide for an HNSW index (it is then always scanned exactly), or is not
    registered with these dimensions: the number of indexes is bounded by registered models.
    """
    if (model, dimensions) in _ensured:
        return True
    if registered_dimensions(model) != dimensions:
        log.warning("model %s (%d-d) is not registered: no HNSW index", model, dimensions)
        return False
    if dimensions > HNSW_MAX_DIMENSIONS:
        log.warning(
            "model %s has %d dimensions: no HNSW index, exact scans only", model, dimensions
        )
        return False
    built = True
    for table, prefix in VECTOR_TABLES.items():
        built &= _build_once(
            table=table,
            name=prefix + index_name(model, dimensions),
            statement=index_sql(
                model=model,
                dimensions=dimensions,
                concurrently=not connection.in_atomic_block,
                table=table,
            ),
        )
    if built:
        _ensured.add((model, dimensions))
    return True


def _build_once(*, table: str, name: str, statement) -> bool:
    """Build one index unless another session is building it (False then)."""
    connection.ensure_connection()
    statement = statement.as_string(connection.connection)
    with connection.cursor() as cursor:
        if connection.in_atomic_block and scale_out.is_distributed(cursor, table):
            # On Citus the shards' deferred foreign-key checks of this transaction are pending on
            # the workers, where SET CONSTRAINTS does not reach: the index is built by the next
            # call outside a transaction (the worker's, the indexer's), searches scan meanwhile.
            return False
        # Never wait for the lock: a CREATE INDEX CONCURRENTLY in the session holding it waits
        # for every running transaction to end, this one (blocked on the lock) included, which
        # PostgreSQL ends as a deadlock. The other session is building the same index; searches
        # scan exactly until it is there, and the next call here checks again.
        cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [name])
        if not cursor.fetchone()[0]:
            return False
        try:
            if connection.in_atomic_block:
                # Inside a transaction PostgreSQL refuses CREATE INDEX while deferred foreign-key
                # checks are pending: run them now, then defer again (Django's FKs are deferrable).
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                cursor.execute(statement)
                cursor.execute("SET CONSTRAINTS ALL DEFERRED")
            else:
                cursor.execute(statement)
        finally:
            cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [name])
    return True


# pgvector's own values for an index built without them.
PGVECTOR_DEFAULT_M, PGVECTOR_DEFAULT_EF_CONSTRUCTION = 16, 64
_PREDICATE_MODEL = re.compile(r"\(model\)::text = '((?:[^']|'')*)'::text")
_PREDICATE_DIMS = re.compile(r"\(dimensions = (\d+)\)")


@dataclass(frozen=True)
class BuiltIndex:
    """A model's HNSW index as it stands in the database, with the parameters it was built with
    (changing AGENTMEMORY_HNSW_M / _EF_CONSTRUCTION affects new indexes only)."""

    name: str
    model: str
    dimensions: int
    m: int
    ef_construction: int
    table: str = MESSAGE_VECTORS

    @property
    def configured(self) -> tuple[int, int]:
        return settings.AGENTMEMORY_HNSW_M, settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION

    @property
    def stale(self) -> bool:
        """Built with other parameters than the settings ask for."""
        return (self.m, self.ef_construction) != self.configured

    def describe(self) -> str:
        of = ", memory vectors" if self.table == MEMORY_VECTORS else ""
        return (
            f"model {self.model!r} ({self.dimensions}-d{of}): m={self.m}, "
            f"ef_construction={self.ef_construction}"
        )


def built_indexes(using=None) -> list[BuiltIndex]:
    """Every model's valid HNSW index (whatever its name): its model and dimensions read from its
    predicate, its m and ef_construction from its storage options. Empty before the first
    migration."""
    from django.db import connections

    conn = connections[using] if using else connection
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, coalesce(c.reloptions, '{}'), pg_get_expr(i.indpred, i.indrelid),"
            " i.indrelid::regclass::text"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_am a ON a.oid = c.relam AND a.amname = 'hnsw'"
            " WHERE i.indrelid IN (to_regclass(%s), to_regclass(%s)) AND i.indisvalid"
            r" AND c.relname NOT LIKE '%%\_rebuild' ORDER BY c.relname",
            [MESSAGE_VECTORS, MEMORY_VECTORS],
        )
        rows = cursor.fetchall()
    found = []
    for name, options, predicate, table in rows:
        model, dims = (
            _PREDICATE_MODEL.search(predicate or ""),
            _PREDICATE_DIMS.search(predicate or ""),
        )
        if not (model and dims):
            continue
        params = dict(option.split("=", 1) for option in options)
        found.append(
            BuiltIndex(
                name=name,
                model=model.group(1).replace("''", "'"),
                dimensions=int(dims.group(1)),
                m=int(params.get("m", PGVECTOR_DEFAULT_M)),
                ef_construction=int(
                    params.get("ef_construction", PGVECTOR_DEFAULT_EF_CONSTRUCTION)
                ),
                table=table,
            )
        )
    return found


class IndexBusy(Exception):
    """Another session is building this index."""


def rebuild_model_index(index: BuiltIndex) -> BuiltIndex:
    """Rebuild a model's HNSW index with the configured m and ef_construction, without a pause:
    the new graph is built CONCURRENTLY under another name while the old one serves searches,
    then the old one is dropped (CONCURRENTLY) and the new one takes its name. Outside a
    transaction only. A rebuild that was interrupted leaves an invalid `…_rebuild` index, which
    the next one drops first."""
    if connection.in_atomic_block:
        raise RuntimeError("an HNSW index is rebuilt CONCURRENTLY, outside a transaction")
    from psycopg import sql

    temporary = f"{index.name}_rebuild"
    connection.ensure_connection()
    statement = index_sql(
        model=index.model,
        dimensions=index.dimensions,
        concurrently=True,
        name=temporary,
        table=index.table,
    ).as_string(connection.connection)
    with connection.cursor() as cursor:
        # The same lock as ensure_model_index: never two builds of one model's index at once.
        cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [index.name])
        if not cursor.fetchone()[0]:
            raise IndexBusy(f"the index of model {index.model!r} is being built by another session")
        try:
            drop = sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}")
            cursor.execute(drop.format(sql.Identifier(temporary)).as_string(connection.connection))
            cursor.execute(statement)
            cursor.execute(drop.format(sql.Identifier(index.name)).as_string(connection.connection))
            cursor.execute(
                sql.SQL("ALTER INDEX {} RENAME TO {}")
                .format(sql.Identifier(temporary), sql.Identifier(index.name))
                .as_string(connection.connection)
            )
        finally:
            cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [index.name])
    [rebuilt] = [i for i in built_indexes() if i.name == index.name]
    return rebuilt


# Waiting vectors, read without a lock (any number of contexts, on Citus any number of shards).
WAITING_SQL = (
    "SELECT id, context_id FROM memory_app_embeddingwaiting WHERE id > %s ORDER BY id LIMIT %s"
)
# One context's rows among those read: on Citus a row lock names its distribution value.
CLAIM_CONTEXT_SQL = (
    "SELECT id FROM memory_app_embeddingwaiting WHERE context_id = %s AND id = ANY(%s)"
    " ORDER BY id FOR UPDATE SKIP LOCKED"
)
# The claimed rows into the vector table (with their context: on Citus an INSERT ... SELECT
# between co-located shards), then out of the waiting one. An item has its vector in one of
# the two tables only; should a row for it be in the vector table all the same, that one stays.
MOVE_CONTEXT_SQL = (
    "INSERT INTO memory_app_embedding (message_id, context_id, model, dimensions, vector)"
    " SELECT message_id, context_id, model, dimensions, vector FROM memory_app_embeddingwaiting"
    " WHERE context_id = %s AND id = ANY(%s) ORDER BY id"
    " ON CONFLICT (message_id, model, context_id) DO NOTHING"
)
DELETE_CONTEXT_SQL = (
    "DELETE FROM memory_app_embeddingwaiting WHERE context_id = %s AND id = ANY(%s)"
)
# Memory vectors go with the memories, not with a shard: claimed and moved in one statement.
MOVE_MEMORIES_SQL = """
    WITH moved AS (
        DELETE FROM memory_app_memoryembeddingwaiting WHERE id IN (
            SELECT id FROM memory_app_memoryembeddingwaiting
            ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
        ) RETURNING id, memory_record_id, model, dimensions, vector
    )
    INSERT INTO memory_app_memoryembedding (memory_record_id, model, dimensions, vector)
    SELECT memory_record_id, model, dimensions, vector FROM moved ORDER BY id
    ON CONFLICT (memory_record_id, model) DO NOTHING
"""


def index_batch(*, batch_size: int | None = None) -> int:
    """Insert up to `batch_size` waiting vectors into their HNSW graph, oldest first, in one
    committed transaction; returns how many. Each is moved from its side table into the
    vector table (`memory_app_embeddingwaiting` into `memory_app_embedding`, the memories'
    likewise): the insertion there is the graph insertion the batch's COPY skipped, and the
    vector table's row is written once.

    Claimed in two steps, so indexers in several processes share the backlog and never take a
    row twice: the oldest waiting rows are read without a lock, then each context's share of
    them is locked by one statement naming that context (FOR UPDATE SKIP LOCKED: rows another
    indexer holds are passed over, and one moved meanwhile is gone) and moved. When every row
    read was taken, the next older ones are read, as the single SKIP LOCKED scan did before."""
    size = batch_size or settings.AGENTMEMORY_INDEXER_BATCH
    done, after = 0, 0
    with transaction.atomic(), connection.cursor() as cursor:
        while done < size:
            cursor.execute(WAITING_SQL, [after, size - done])
            rows = cursor.fetchall()
            if not rows:
                break
            per_context: dict[int, list[int]] = {}
            for pk, context_id in rows:
                per_context.setdefault(context_id, []).append(pk)
            for context_id, ids in per_context.items():
                cursor.execute(CLAIM_CONTEXT_SQL, [context_id, ids])
                claimed = [pk for (pk,) in cursor.fetchall()]
                if claimed:
                    cursor.execute(MOVE_CONTEXT_SQL, [context_id, claimed])
                    cursor.execute(DELETE_CONTEXT_SQL, [context_id, claimed])
                    done += len(claimed)
            after = rows[-1][0]
        if done < size:
            cursor.execute(MOVE_MEMORIES_SQL, [size - done])
            done += cursor.rowcount
    return done


def index_pending(
    *,
    batch_size: int | None = None,
    stop: threading.Event | None = None,
    max_batches: int | None = None,
) -> int:
    """Drain the backlog batch by batch (each committed) until it is empty; returns rows indexed.
    A drain that emptied the side tables of many rows vacuums them (`side_tables_vacuumed`)."""
    total = batches = 0
    while not (stop and stop.is_set()) and (max_batches is None or batches < max_batches):
        done = index_batch(batch_size=batch_size)
        total += done
        batches += 1
        if not done:
            if total >= VACUUM_AFTER:
                side_tables_vacuumed()
            break
    return total


# Rows moved out of the side tables after which a drain that empties them vacuums them.
VACUUM_AFTER = 1000


def side_tables_vacuumed() -> bool:
    """VACUUM the side tables once a drain has moved their rows out: until a vacuum, a search
    of a context's waiting vectors visits every page the moved rows left dead (an index or
    bitmap scan follows their index entries to each one, and the planner, from statistics
    taken while they were full, may scan them whole and in parallel: 10-19 ms a search after
    a batch of 10,000), and autovacuum comes only on its next round. SKIP_LOCKED: a vacuum
    already running (autovacuum's) is left to finish. Not inside a transaction, which VACUUM
    cannot run in; answers whether it ran."""
    if connection.in_atomic_block:
        return False
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM (SKIP_LOCKED) {', '.join(WAITING_TABLES.values())}")
    except DatabaseError as exc:
        # Only a saving: the drain is done whether or not the pages went back (autovacuum's
        # next round gives them back too).
        log.warning("indexer: the side tables' vacuum failed (%s)", exc)
        return False
    return True
