"""Vector search inside one context (pgvector cosine), and the query's vector.

Within one context it returns min(k, n) results, whatever share of the table that context holds:

- a context with fewer than `AGENTMEMORY_SEARCH_EXACT_THRESHOLD` messages is scanned exactly
  (its rows through the (context, model) btree index, the k nearest kept by a top-N sort): for a
  few thousand rows that is faster than any index walk, and exactly ranked;
- a larger context walks the model's HNSW index with pgvector's iterative scan (0.8), which goes
  on until k of the context's rows are found however small its share of the store, with
  `hnsw.ef_search` grown with the store's size (`AGENTMEMORY_HNSW_EF_SEARCH[_STEPS]`). The walk
  itself returns k; only a context with far fewer vectors than messages (most not embedded)
  can come back short, and then holds few vectors: those are scanned exactly ("hnsw+exact").
  Vectors of a large batch that wait for the indexer (not yet in the graph) are scanned exactly
  beside the walk and merged by distance ("hnsw+pending"), so a stored vector is found at once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection
from psycopg import sql as psql

from memory_app import db, errors, pipelines, scale_out
from memory_app.embeddings import client_vectors, indexer, providers
from memory_app.errors import Invalid, ProviderDown, SemanticUnavailable
from memory_app.models import Message


def vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def query_vector_param(vector: Sequence[float]) -> db.Float8Array:
    """The query vector as the statements' binary `float8[]` parameter (see db.binding_cursor)."""
    return db.Float8Array(vector)


def semantic_ranking(
    *,
    context_id: int,
    model: str,
    vector: Sequence[float],
    limit: int,
    exclude_ids: Sequence[int] = (),
    context_size: int | None = None,
    rows: dict[int, tuple] | None = None,
) -> tuple[list[tuple[int, float]], str]:
    """(message id, cosine distance) of the context's live messages nearest to `vector` under
    `model`, nearest first, ties by id; and which path answered ("exact", "hnsw", or
    "hnsw+exact" when the walk came back short, "hnsw+pending" when vectors waiting for the
    indexer were merged in).

    `context_size` (the context's message count, an upper bound on its vectors) spares the
    count of its vectors that otherwise decides between the exact scan and the index. `rows`:
    where the walk puts the messages it found (`MESSAGE_ROWS`' columns by id), read in its own
    statement; messages it did not read (the exact scan's) are not there."""
    threshold = settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD
    if context_size is None:
        with connection.cursor() as cursor:
            # Counted up to the threshold only: the decision needs no more. The vectors that
            # wait for the graph count as well (a context of one deferred batch is not empty).
            cursor.execute(
                "SELECT count(*) FROM (SELECT 1 FROM memory_app_embedding WHERE context_id = %s"
                " AND model = %s LIMIT %s) s UNION ALL SELECT count(*) FROM (SELECT 1 FROM"
                " memory_app_embeddingwaiting WHERE context_id = %s AND model = %s LIMIT %s) w",
                [context_id, model, max(threshold, limit)] * 2,
            )
            context_size = sum(count for (count,) in cursor.fetchall())
        if context_size == 0:
            return [], "exact"
    approximate = context_size >= threshold and len(vector) <= indexer.HNSW_MAX_DIMENSIONS
    return nearest_vectors(
        model=model,
        vector=vector,
        limit=limit,
        **message_filter(context_id, exclude_ids),
        approximate=approximate,
        share=context_size,
        rows=rows,
        rows_sql=MESSAGE_ROWS if rows is not None else None,
        one_plan=True,
    )


# The columns of the messages a walk found, read in the walk's own statement (`walk_statements`'
# `rows_sql`): the hits' rows without a round trip of their own.
MESSAGE_ROWS = (
    db.select_columns(Message, "h"),
    "LEFT JOIN memory_app_message h ON h.context_id = %s AND h.id = f.item_id",
)


def message_filter(context_id: int, exclude_ids: Sequence[int] = ()) -> dict[str, Any]:
    """`nearest_vectors`' arguments for one context's live messages."""
    return {
        "item_column": "message_id",
        # Joined on the context too (the vector's and its message's are one): on Citus a join
        # of two distributed tables on their distribution column stays on one shard.
        "join_sql": "JOIN memory_app_message m"
        " ON m.id = e.message_id AND m.context_id = e.context_id",
        # The context on both sides: the planner reaches the messages through its index
        # rather than scanning the whole table for a hash join.
        "where_sql": "e.context_id = %s AND m.context_id = %s AND m.pruned_at IS NULL"
        " AND NOT (m.id = ANY(%s))",
        "params": [context_id, context_id, list(exclude_ids)],
        "vectors_filter": ("e.context_id = %s", [context_id]),
    }


# The walk (its statements, its Citus form, the rows it reads) and the exact scan it falls back
# to share their arguments and the decision between them: they read best in one piece.
def nearest_vectors(
    *,
    model: str,
    vector: Sequence[float],
    limit: int,
    item_column: str,
    join_sql: str,
    where_sql: str,
    params: Sequence[Any],
    approximate: bool,
    share: int | None = None,
    table: str = indexer.MESSAGE_VECTORS,
    rows: dict[int, tuple] | None = None,
    rows_sql: tuple[str, str] | None = None,
    one_plan: bool = False,
    vectors_filter: tuple[str, Sequence[Any]] | None = None,
) -> tuple[list[tuple[int, float]], str]:
    """(item id, cosine distance) of the `model` vectors (alias `e`) nearest to `vector` among
    those `where_sql` keeps, nearest first, ties by id; and the path that answered. `table`:
    the messages' vectors, or the memory records' (`indexer.MEMORY_VECTORS`).

    `approximate` walks the model's HNSW index with pgvector's iterative scan ("hnsw"): the walk
    goes on until `limit` rows pass the filter, so a filter keeping a small share of the store
    still gets `limit` rows (up to `hnsw.max_scan_tuples`, sized from `share`, the number of rows
    the filter may keep). It comes back short only when the filter keeps far fewer vectors than
    `share` says (messages not embedded yet, or most of the vectors still waiting for the
    indexer): those few are then scanned exactly ("hnsw+exact"). Vectors waiting for the indexer
    are scanned exactly beside the walk and merged by distance ("hnsw+pending" when any was).
    Otherwise ("exact") every kept row is scanned and the `limit` nearest kept (a top-N sort in
    memory: only `limit` rows are held, nothing spills to disk), exact and, for a few thousand
    rows, faster than the index.

    `rows` and `rows_sql`: the walk also reads each item it found (`walk_statements`) into
    `rows` by id, in the walk's statement (on Citus too: the rows are joined on the context and
    id, so the statement stays on the context's shard).

    `one_plan`: the walk's text fixes its plan (`walk_statements`); a filter built from a
    caller's own query (the memory records') is planned for each call's values instead.
    `vectors_filter`: the part of `where_sql` on the vectors alone, with its parameters
    (`walk_statements`)."""
    if approximate:
        sharded = scale_out.table_is_distributed(table)
        read = rows is not None and rows_sql is not None
        walk = walk_statements(
            model=model,
            vector=vector,
            limit=limit,
            item_column=item_column,
            join_sql=join_sql,
            where_sql=where_sql,
            params=params,
            share=share,
            table=table,
            rows_sql=rows_sql if read else None,
            one_plan=one_plan,
            vectors_filter=vectors_filter,
        )
        if sharded:
            # Citus passes SET LOCAL on to the workers that walk the shards' graphs, not
            # set_config(): one SET LOCAL a setting (names and values are this module's own),
            # sent with the walk (and a request's deferred key read) in one round trip, as the
            # one statement of set_config() calls is on one node.
            _, pairs = walk.settings
            kept = _callers_settings(pairs[::2])
            with db.binding_cursor() as setter, db.binding_cursor() as cursor:
                with pipelines.pipelined_transaction(setter):
                    for name, value in zip(pairs[::2], pairs[1::2], strict=True):
                        setter.execute(f"SET LOCAL {name} = '{value}'")
                    cursor.execute(walk.sql, walk.args)
                    for name, value in kept.items():
                        # (The names are this module's own; the values the server's.)
                        setter.execute(
                            psql.SQL("SET LOCAL {} TO DEFAULT").format(psql.SQL(name))
                            if value is None
                            else psql.SQL("SET LOCAL {} = {}").format(
                                psql.SQL(name), psql.Literal(value)
                            )
                        )
                found = cursor.fetchall()
        else:
            found = _walked(walk)
        if read:
            rows.update((row[3], row[3:]) for row in found if row[3] is not None)
        hits = sorted(((row[0], float(row[1])) for row in found), key=lambda hit: (hit[1], hit[0]))
        walked = sum(1 for row in found if not row[2])
        if walked == limit:
            return hits[:limit], "hnsw" if len(found) == walked else "hnsw+pending"
    # The walk built its own parts; the exact scan builds them only when it runs.
    hits = _exact_nearest(
        model=model,
        vector=vector,
        limit=limit,
        item_column=item_column,
        join_sql=join_sql,
        where_sql=where_sql,
        params=params,
        table=table,
    )
    return hits, "hnsw+exact" if approximate else "exact"


def _walked(walk: Walk) -> list[tuple]:
    """The rows of a walk on one node: its settings and the walk in one transaction, one round
    trip (in a caller's transaction, the caller's settings put back in it too)."""
    names = walk.settings[1][::2]
    kept = _callers_settings(names)
    with (
        db.binding_cursor(prepared=walk.prepared) as setter,
        db.binding_cursor(prepared=walk.prepared) as cursor,
    ):
        with pipelines.pipelined_transaction(setter):
            setter.execute(*walk.settings)
            cursor.execute(walk.sql, walk.args)
            if kept:
                # NULL (a setting not defined before the walk's) resets it.
                setter.execute(
                    "SELECT " + ", ".join("set_config(%s, %s, true)" for _ in kept),
                    [x for pair in kept.items() for x in pair],
                )
        return cursor.fetchall()


def _callers_settings(names: Sequence[str]) -> dict[str, str | None]:
    """Inside a caller's transaction, the values of the walk's settings before the walk (None
    for one not defined yet), which the walk puts back after itself: its settings are made for
    the transaction (SET LOCAL), and the caller's statements after the walk (a memory batch's
    next records, say) are to be planned with the caller's own. Outside, nothing: the walk's
    transaction is its own and ends with it."""
    if not connection.in_atomic_block:
        return {}
    with db.binding_cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join("current_setting(%s, true)" for _ in names), list(names)
        )
        return dict(zip(names, cursor.fetchone(), strict=True))


def _exact_nearest(
    *,
    model: str,
    vector: Sequence[float],
    limit: int,
    item_column: str,
    join_sql: str,
    where_sql: str,
    params: Sequence[Any],
    table: str,
) -> list[tuple[int, float]]:
    """The exact scan of `nearest_vectors`: the `limit` nearest of the vectors in the graph and
    of those waiting for it, merged by distance (each side a statement of its own table, as the
    walk's: on Citus each names its context's shard)."""
    # OFFSET 0 keeps each subquery apart, so no ORDER BY is answered by the HNSW index.
    dims = int(len(vector))
    query_cte, distance, rows = _query_parts(model, dims, table, join_sql, where_sql)
    waiting_table = indexer.WAITING_TABLES[table]
    _, _, waiting_rows = _query_parts(model, dims, waiting_table, join_sql, where_sql)

    def nearest(of: str) -> str:
        return f"""
            SELECT item_id, distance FROM (
                SELECT e.{item_column} AS item_id, {distance} AS distance {of} OFFSET 0
            ) s ORDER BY distance, item_id LIMIT %s
        """  # noqa: S608

    sql = f"""
        WITH {query_cte}, stored AS MATERIALIZED ({nearest(rows)}),
        waiting AS MATERIALIZED ({nearest(waiting_rows)})
        SELECT item_id, distance FROM (
            SELECT * FROM stored UNION ALL SELECT * FROM waiting
        ) s ORDER BY distance, item_id LIMIT %s
    """  # noqa: S608
    args = [query_vector_param(vector), *params, limit, *params, limit, limit]
    with db.binding_cursor() as cursor:
        cursor.execute(sql, args)
        hits = [(row[0], float(row[1])) for row in cursor.fetchall()]
    return hits


def _query_parts(
    model: str, dims: int, table: str, join_sql: str, where_sql: str
) -> tuple[str, str, str]:
    """The query vector's CTE, the full-precision distance and the rows' FROM/WHERE (`table`:
    a table of vectors, or its side table of those waiting for the graph). The model is in the
    text, as in the HNSW index's predicate: a plan made without the call's values
    (`walk_statements`' `one_plan`) can still prove the index holds the rows it asks for."""
    # The query vector is sent once (binary doubles) and referenced from each part; an
    # uncorrelated subquery is a parameter the index scan takes.
    query_cte = f"q AS MATERIALIZED (SELECT %s::float8[]::vector({dims}) AS v)"
    distance = f"e.vector::vector({dims}) <=> (SELECT v FROM q)"  # noqa: S608 - dims is an int
    rows = f"""
        FROM {table} e {join_sql}
        WHERE e.model = {_literal(model)} AND e.dimensions = {dims} AND e.vector IS NOT NULL
        AND {where_sql}
    """  # noqa: S608 - dims is an int, the model quoted; the fragments are the callers' constants
    return query_cte, distance, rows


@functools.lru_cache(maxsize=256)
def _literal(text: str) -> str:
    """`text` quoted as an SQL string (by libpq, for a UTF-8 connection: the same on each), in a
    statement whose parameters are placeholders (its `%` doubled); kept per text."""
    connection.ensure_connection()
    with connection.wrap_database_errors:  # a NUL is a DataError, as in a parameter
        return psql.Literal(text).as_string(connection.connection).replace("%", "%%")


class Walk(NamedTuple):
    """The HNSW walk as sent (`walk_statements`): its settings' statement and parameters, the
    walk's SQL and arguments, and whether both are prepared on the connection."""

    settings: tuple[str, list[str]]
    sql: str
    args: list[Any]
    prepared: bool


def walk_statements(
    *,
    model: str,
    vector: Sequence[float],
    limit: int,
    item_column: str,
    join_sql: str,
    where_sql: str,
    params: Sequence[Any],
    share: int | None,
    table: str = indexer.MESSAGE_VECTORS,
    rows_sql: tuple[str, str] | None = None,
    one_plan: bool = False,
    vectors_filter: tuple[str, Sequence[Any]] | None = None,
) -> Walk:
    """The HNSW walk as sent: its settings (one statement), the walk's SQL and arguments (rows:
    item id, distance, whether it waited for the indexer). The benchmark runs the same.

    `one_plan` (the messages' walk, whose text depends only on the model, the columns read and
    the filter's shape): on one node its statements are prepared on the connection and the walk
    keeps one generic plan (`plan_cache_mode` in its settings). Planning it for each call's
    values costs the server more than its parse, for the same plan every time: the model's
    index walked in its order (sorting is off), the context's rows kept by key lookups. On
    Citus the walk is unprepared and planned for each call.

    `rows_sql` (columns of alias `h`, a join of `h` on the found item `f.item_id` whose one
    parameter is the walk's first, the context): each found item's row after those three, read
    by the same statement, so the hits need no round trip of their own.

    `vectors_filter` (the part of `where_sql` on the vectors alone, alias `e`, and its
    parameters: the messages' context): the vectors waiting for the indexer are read by it on
    their own, through their side table's (context, model) index, before any join. Planned
    with the join, the side table's statistics chose the order: taken while it held a few
    other contexts' batches, they made a context's waiting rows look many, and the plan read
    the context's every message to look each up there (a hundred times the walk's own cost in
    a large context); taken while it was empty, a sequential scan of every batch that lands
    after (measured in memory_app/bench/notes.md)."""
    dims = int(len(vector))
    query_cte, distance, rows = _query_parts(model, dims, table, join_sql, where_sql)
    waiting_table = indexer.WAITING_TABLES[table]
    waiting_cte = ""
    if vectors_filter is not None:
        # Materialized: read alone, then joined (the join cannot be planned into it).
        _, _, own = _query_parts(model, dims, waiting_table, "", vectors_filter[0])
        read = f"e.{item_column}, e.context_id, e.model, e.dimensions, e.vector"
        waiting_cte = f", waiting_vectors AS MATERIALIZED (SELECT {read} {own})"
        waiting_table = "waiting_vectors"
    _, _, waiting_rows = _query_parts(model, dims, waiting_table, join_sql, where_sql)
    # The walk orders by the index's expression (half precision); the rows it keeps are then
    # ranked by their full-precision distance.
    walk_distance = f"e.vector::halfvec({dims}) <=> (SELECT v::halfvec({dims}) FROM q)"  # noqa: S608
    # Relaxed order lets the walk return rows slightly out of distance order (better recall
    # per visited node); the materialized CTE sorts the `limit` rows it kept. The walk
    # covers the vector table's rows (`e.indexed`, true for each, is in the index's
    # predicate); rows of a deferred batch still waiting for the indexer, in the side table,
    # are scanned exactly and merged by distance, so they are found at once.
    sql = f"""
        WITH {query_cte}, nearest AS MATERIALIZED (
            SELECT e.{item_column} AS item_id, {distance} AS distance {rows} AND e.indexed
            ORDER BY {walk_distance} LIMIT %s
        ){waiting_cte}, waiting AS MATERIALIZED (
            SELECT e.{item_column} AS item_id, {distance} AS distance {waiting_rows}
            ORDER BY distance, item_id LIMIT %s
        )
        SELECT item_id, distance, false AS waited FROM nearest
        UNION ALL SELECT item_id, distance, true FROM waiting
    """  # noqa: S608
    own_params = list(vectors_filter[1]) if vectors_filter is not None else []
    args = [query_vector_param(vector), *params, limit, *own_params, *params, limit]
    if rows_sql is not None:
        columns, join = rows_sql
        sql = f"SELECT f.item_id, f.distance, f.waited, {columns} FROM ({sql}) f {join}"  # noqa: S608
        args.append(params[0])
    prepared = one_plan and not scale_out.table_is_distributed(table)
    settings_sql = hnsw_settings_sql(
        model=model, dims=dims, limit=limit, share=share, table=table, generic=prepared
    )
    return Walk(settings_sql, sql, args, prepared)


# pgvector's defaults: hnsw.ef_search 40, hnsw.max_scan_tuples 20,000.
MIN_SCAN_TUPLES = 20_000
MAX_EF_SEARCH = 1000
SCAN_WORK_MEM_MB = 64
_store_sizes: dict[tuple[str, int, str], tuple[float, int]] = {}
STORE_SIZE_TTL = 300.0


def store_size(model: str, dims: int, table: str = indexer.MESSAGE_VECTORS) -> int:
    """How many vectors the model's HNSW index holds, from the planner's statistics (kept up to
    date by autovacuum's ANALYZE, which estimates a partial index's own rows), cached per
    process for a few minutes.

    The index's own estimate, not the table's: the table holds every model's vectors (a
    re-embed keeps the old ones), and a store counted too large makes every search walk
    further. Only an index with no estimate yet (never analysed, or built empty and filled
    since) falls back to the table's."""
    import time

    key = (model, dims, table)
    now = time.monotonic()
    cached = _store_sizes.get(key)
    if cached and cached[0] > now:
        return cached[1]
    with connection.cursor() as cursor:
        index = indexer.VECTOR_TABLES[table] + indexer.index_name(model, dims)
        if scale_out.is_distributed(cursor, table):
            # On Citus the coordinator's index is an empty shell: the shards hold the rows.
            size = scale_out.index_rows_on_shards(cursor, table, index)
        else:
            cursor.execute(
                "SELECT greatest(CASE WHEN i.reltuples > 0 THEN i.reltuples"
                " ELSE t.reltuples END, 0)::bigint"
                " FROM pg_class t LEFT JOIN pg_class i ON i.relname = %s WHERE t.relname = %s",
                [index, table],
            )
            size = int(cursor.fetchone()[0])
    _store_sizes[key] = (now + STORE_SIZE_TTL, size)
    return size


def ef_search_for(store: int, limit: int, share: int | None = None) -> int:
    """hnsw.ef_search for a store of `store` vectors: `AGENTMEMORY_HNSW_EF_SEARCH` when set,
    else grown with the store (a bigger graph needs a longer candidate list for the same recall)
    along `AGENTMEMORY_HNSW_EF_SEARCH_STEPS`, log-linearly between two steps (the store size is
    the planner's estimate: 999,963 and 1,000,000 must get about the same); never below twice
    the rows asked for.

    `share`: how many of the store's vectors the search's filter keeps (one context's). The
    iterative scan finds `limit` of them however few they are, but the further the walk goes
    past its first candidate list the likelier it is to step over some of the nearest: a filter
    keeping a small share gets a longer list, by the square root of store / share (a context of
    30,000 vectors in a store of 1,200,000: 6.3 times), up to MAX_EF_SEARCH."""
    base = settings.AGENTMEMORY_HNSW_EF_SEARCH
    if not base:
        steps = settings.AGENTMEMORY_HNSW_EF_SEARCH_STEPS or [(0, 40)]
        base = steps[0][1]
        for (size, ef), (next_size, next_ef) in zip(steps, steps[1:], strict=False):
            if store >= next_size:
                base = next_ef
            elif store > size > 0:
                step = math.log(store / size) / math.log(next_size / size)
                base = round(ef + (next_ef - ef) * step)
                break
            else:
                break
        if share and 0 < share < store:
            base = math.ceil(base * math.sqrt(store / share))
    return max(1, min(max(base, 2 * limit), MAX_EF_SEARCH))


def hnsw_settings_sql(
    *,
    model: str,
    dims: int,
    limit: int,
    share: int | None,
    table: str = indexer.MESSAGE_VECTORS,
    generic: bool = False,
) -> tuple[str, list[str]]:
    """The settings of one HNSW query as one statement and its parameters: `set_config(...,
    true)` is SET LOCAL, so they end with the transaction (`pipelines.pipelined_transaction`
    sends them with the walk, in one round trip). `generic`: the prepared walk after them keeps
    one plan made without its values (`walk_statements`' `one_plan`)."""
    store = store_size(model, dims, table)
    ef = ef_search_for(store, limit, share)
    # To find `limit` rows of a filter keeping `share` of `store` rows, the walk visits about
    # limit * store / share rows; four times that, so a clustered filter still gets its rows.
    share = max(share or store or 1, 1)
    scan = max(MIN_SCAN_TUPLES, 4 * limit * max(store, share) // share)
    # The walk also stops when the tuples it holds outgrow work_mem * hnsw.scan_mem_multiplier
    # (each holds its vector): room for `scan` of them.
    multiplier = max(1, -(-scan * (dims * 4 + 256) // (SCAN_WORK_MEM_MB << 20)))
    values = {
        "hnsw.ef_search": int(ef),
        "hnsw.iterative_scan": "relaxed_order",
        "hnsw.max_scan_tuples": int(scan),
        "work_mem": f"{SCAN_WORK_MEM_MB}MB",
        "hnsw.scan_mem_multiplier": int(min(multiplier, 1000)),
        # The index is the plan asked for: a sort over the filter's rows is what it replaces.
        # (A planner setting: it holds for the walk, the statement after this one.)
        "enable_sort": "off",
    }
    if generic:
        # Read when the walk is bound, as enable_sort is when it is planned. A plan made
        # without the context sizes its joins for an average context, where a hash of the
        # context's messages, or the context's messages read once and kept in memory for each
        # walked vector to be matched against, may look cheap (among many one-message
        # contexts); the walk runs in large contexts only, and its few rows are joined by key
        # lookups in any context, so the one plan joins by nested loops over the keys.
        values["plan_cache_mode"] = "force_generic_plan"
        values["enable_hashjoin"] = "off"
        values["enable_mergejoin"] = "off"
        values["enable_material"] = "off"
        # Every table the walk reads has the index it needs; a plan made while the side table
        # of waiting vectors was empty would scan it whole for each batch that lands after.
        values["enable_seqscan"] = "off"
    calls = ", ".join("set_config(%s, %s, true)" for _ in values)
    return f"SELECT {calls}", [str(x) for pair in values.items() for x in pair]


def query_vector_for(
    *, query: str, model: str | None, query_vector: Sequence[float] | None
) -> tuple[list[float], str]:
    """The vector to search with and its model: the client's own, or the provider's."""
    if query_vector is not None:
        if not model:
            raise Invalid("a query_vector needs the name of the model it comes from")
        return client_vectors.check_vector(model=model, vector=query_vector), model
    provider = providers.get_provider()
    if provider is None:
        raise SemanticUnavailable(
            "semantic search needs an embedding provider (AGENTMEMORY_EMBEDDING_PROVIDER is "
            "'none') "
            "or a query_vector with its model; keyword search is available"
        )
    if model and model != provider.model:
        raise SemanticUnavailable(
            f"the server embeds queries with {provider.model!r}; send a query_vector to "
            f"search {model!r}"
        )
    try:
        [vector] = provider.embed([query])
    except errors.ProviderError as exc:
        raise ProviderDown(f"the embedding provider is unavailable: {exc}") from exc
    return vector, provider.model
