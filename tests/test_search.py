"""Search inside one small context of a large store returns exactly what a brute-force ranking does.

50,000 messages over 500 contexts plus one context of 20, each with a random 384-dimensional
vector and the model's HNSW index present: an HNSW scan filtered afterwards would return fewer
than k (often none) without pgvector's iterative scan.
"""

import random

import numpy as np
import pytest
from django.db import DataError, connection, transaction
from django.test import override_settings

from memory_app import db, errors, scale_out
from memory_app.embeddings import indexer
from memory_app.models import Context, Embedding, EmbeddingModel, Message, keys_digest
from memory_app.search.bm25 import split_websearch
from memory_app.search.keyword import keyword_ranking
from memory_app.search.messages import search_messages
from memory_app.search.semantic import (
    MAX_EF_SEARCH,
    ef_search_for,
    hnsw_settings_sql,
    nearest_vectors,
    semantic_ranking,
)
from memory_app.services.contexts import context_get_or_create
from memory_app.services.curation import messages_set_pruned
from tests.bm25_truth import bm25_truth
from tests.builders import prepared_plans

# Every test here, and so the module fixture, runs on the test database (pytest-django sets it
# up only for sessions holding a django_db test).
pytestmark = [pytest.mark.django_db, pytest.mark.slow]

MODEL = "test-random-384"
DIMS = 384
WORDS = [f"w{i}" for i in range(300)] + ["alpha", "beta", "gamma"]


def _copy_rows(cursor, table, columns, rows):
    with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def _vector_text(v):
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


@pytest.fixture(scope="module")
def store(django_db_setup, django_db_blocker):
    """Committed once for the module (bulk COPY), removed afterwards."""
    rng = np.random.default_rng(7)
    rnd = random.Random(7)
    with django_db_blocker.unblock():
        assert connection.settings_dict["NAME"].startswith("test"), (
            "refusing to bulk-load a non-test database"
        )
        big = [
            Context(keys={"bulk": str(i)}, keys_digest=keys_digest({"bulk": str(i)}))
            for i in range(500)
        ]
        Context.objects.bulk_create(big)
        small, _ = context_get_or_create(keys={"bulk": "small"})
        rows = []
        # One context holds 5,090 messages (a tenth of the store), the 499 others 90 each: 50,000.
        for ctx in big:
            for seq in range(1, (5091 if ctx is big[0] else 91)):
                words = rnd.sample(WORDS, 8)
                rows.append((ctx.pk, seq, "user", " ".join(words)))
        # The small context: some messages share the query words, some do not.
        small_texts = []
        for i in range(20):
            words = (
                rnd.sample(WORDS[:300], 6)
                + (["alpha"] if i % 2 == 0 else [])
                + (["beta"] * (i % 3))
            )
            small_texts.append(" ".join(words))
        rows += [
            (small.pk, i + 1, "user" if i % 2 else "assistant", t)
            for i, t in enumerate(small_texts)
        ]
        with connection.cursor() as cur:
            _copy_rows(
                cur.cursor,
                "memory_app_message",
                [
                    "context_id",
                    "seq",
                    "role",
                    "name",
                    "text",
                    "tags",
                    "metadata",
                    "token_count",
                    "tokenizer",
                    "source_timestamp",
                    "created_at",
                    "updated_at",
                    "pruned_by",
                ],
                ((c, s, r, "", t, "{}", "{}", 0, "", "", "now", "now", "") for c, s, r, t in rows),
            )
            cur.execute(
                "SELECT id, context_id FROM memory_app_message WHERE context_id = ANY(%s) "
                "ORDER BY id",
                [[c.pk for c in big] + [small.pk]],
            )
            ids = cur.fetchall()
            vectors = rng.normal(size=(len(ids), DIMS)).astype(np.float32)
            _copy_rows(
                cur.cursor,
                "memory_app_embedding",
                ["message_id", "context_id", "model", "dimensions", "vector"],
                (
                    (mid, cid, MODEL, DIMS, _vector_text(v))
                    for (mid, cid), v in zip(ids, vectors, strict=True)
                ),
            )
            cur.execute("ANALYZE memory_app_message")
            cur.execute("ANALYZE memory_app_embedding")
        indexer._ensured.discard((MODEL, DIMS))
        EmbeddingModel.objects.get_or_create(name=MODEL, defaults={"dimensions": DIMS})
        with connection.cursor() as cur:
            # A bigger build memory keeps the graph in RAM (the default 64MB spills and crawls).
            cur.execute("SET maintenance_work_mem = '256MB'")
        # A lighter graph than production's keeps the build to seconds on a busy CI machine.
        with override_settings(AGENTMEMORY_HNSW_M=8, AGENTMEMORY_HNSW_EF_CONSTRUCTION=24):
            assert indexer.ensure_model_index(model=MODEL, dimensions=DIMS)
        texts = dict(Message.objects.filter(context=small).values_list("pk", "text"))
        # The small context's counters as an append keeps them (BM25 reads its message count).
        Context.objects.filter(pk=small.pk).update(message_count=20, last_seq=20)
        small.refresh_from_db()
        yield {"small": small, "texts": texts, "big": big}
        Context.objects.filter(pk__in=[c.pk for c in big] + [small.pk]).delete()
        EmbeddingModel.objects.filter(name=MODEL).delete()


def brute_force_semantic(context, query):
    rows = Embedding.objects.filter(
        context=context, model=MODEL, message__pruned_at__isnull=True
    ).values_list("message_id", "vector")
    q = np.asarray(query, dtype=np.float64)
    scored = []
    for mid, v in rows:
        v = np.asarray(v, dtype=np.float64)
        scored.append((1 - float(v @ q / (np.linalg.norm(v) * np.linalg.norm(q))), mid))
    return [mid for _, mid in sorted(scored)]


def brute_force_keyword(context, query, match="any"):
    """Every message of the context, ranked in Python by BM25 over all of them."""
    strict = query if match == "all" else None
    parts = split_websearch(query)
    return [
        mid
        for mid, _ in bm25_truth(
            context,
            words=parts.words,
            phrases=parts.phrases,
            excluded=parts.excluded,
            strict=strict,
        )
    ]


def test_the_models_hnsw_index_is_present(store):
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = %s",
            [indexer.index_name(MODEL, DIMS)],
        )
        definition = cur.fetchone()[0]
    assert "USING hnsw" in definition and f"halfvec({DIMS})) halfvec_cosine_ops" in definition
    assert MODEL in definition


@pytest.mark.parametrize("k", [1, 5, 20, 50])
def test_semantic_search_in_the_small_context_equals_brute_force(store, settings, k):
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 20000  # the exact scan
    small = store["small"]
    query = np.random.default_rng(k).normal(size=DIMS).tolist()
    result = search_messages(
        context=small, query="", k=k, mode="semantic", model=MODEL, query_vector=query
    )
    assert [h.message.pk for h in result.hits] == brute_force_semantic(small, query)[: min(k, 20)]
    assert "vector scan: exact" in result.notes


def _exact(context_id, query, limit, exclude_ids=()):
    """The reference: search's exact scan."""
    hits, path = nearest_vectors(
        model=MODEL,
        vector=query,
        limit=limit,
        item_column="message_id",
        join_sql="JOIN memory_app_message m ON m.id = e.message_id AND m.context_id = e.context_id",
        where_sql="e.context_id = %s AND m.pruned_at IS NULL AND NOT (m.id = ANY(%s))",
        params=[context_id, list(exclude_ids)],
        approximate=False,
    )
    assert path == "exact"
    return hits


class CapturedVectorQueries:
    """The vector statements search runs (SQL and parameters), to EXPLAIN them as run."""

    def __init__(self):
        self.statements = []

    def __call__(self, execute, sql, params, many, context):
        if "<=>" in sql:
            self.statements.append((sql, params))
        return execute(sql, params, many, context)


def _sharded() -> bool:
    """On Citus each shard holds its own HNSW graph: a small context is a far larger share of
    its shard's graph than of the whole store, so a walk that comes back short on one node
    (the premise of the tests below) finds enough there. The answers are checked either way."""
    with connection.cursor() as cursor:
        return scale_out.is_distributed(cursor, indexer.MESSAGE_VECTORS)


def _plan(sql, params, settings_sql):
    with transaction.atomic(), db.binding_cursor() as cur:
        cur.execute(*settings_sql)
        cur.execute("EXPLAIN (COSTS OFF) " + sql, params)
        return "\n".join(row[0] for row in cur.fetchall())


@pytest.mark.parametrize("k", [5, 10])
def test_iterative_scan_returns_exactly_k_from_a_context_that_is_a_tiny_share_of_the_store(
    store, settings, k
):
    """20 of 50,020 vectors: the index's unfiltered candidate list (ef_search) holds none or a
    few of them, but the iterative scan walks on until k of them are found."""
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 5  # the 20-message context takes the index
    small = store["small"]
    query = np.random.default_rng(100 + k).normal(size=DIMS).tolist()
    captured = CapturedVectorQueries()
    with connection.execute_wrapper(captured):
        ids, path = semantic_ranking(
            context_id=small.pk, model=MODEL, vector=query, limit=k, context_size=20
        )
    assert path == "hnsw" and len(ids) == k
    assert {m.context_id for m in Message.objects.filter(pk__in=[i for i, _ in ids])} == {small.pk}
    truth = dict(_exact(small.pk, query, 20))
    distances = [d for _, d in ids]
    assert distances == sorted(distances)
    assert distances == pytest.approx([truth[i] for i, _ in ids], abs=1e-5)
    # One statement answered (no exact fallback), and it walked the HNSW index (on a shard the
    # planner may rank a context this small exactly instead: its share of the shard is larger).
    [(sql, params)] = captured.statements
    if _sharded():
        return
    settings_sql = hnsw_settings_sql(model=MODEL, dims=DIMS, limit=k, share=20)
    plan = _plan(sql, params, settings_sql)
    assert f"Index Scan using {indexer.index_name(MODEL, DIMS)}" in plan, plan
    # Without the iterative scan the same statement finds fewer than k: the test means something.
    with transaction.atomic(), db.binding_cursor() as cur:
        cur.execute(*settings_sql)
        cur.execute("SET LOCAL hnsw.iterative_scan = off")
        cur.execute(sql, params)
        assert len(cur.fetchall()) < k


def test_a_context_with_fewer_vectors_than_k_gets_them_all_exactly_ranked(store, settings):
    """The walk cannot find 50 rows of a 20-row context: it comes back short, and the exact
    scan of those 20 answers."""
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 5
    small = store["small"]
    small.message_count = 20  # (the fixture's COPY left the counter alone)
    query = np.random.default_rng(9).normal(size=DIMS).tolist()
    result = search_messages(
        context=small, query="", k=50, mode="semantic", model=MODEL, query_vector=query
    )
    assert "vector scan: hnsw+exact" in result.notes
    assert [h.message.pk for h in result.hits] == brute_force_semantic(small, query)


def test_hnsw_path_on_a_large_context_returns_k_results_of_that_context(store, settings):
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 1000  # the 5,090-message context takes HNSW
    ctx = store["big"][0]
    query = np.random.default_rng(3).normal(size=DIMS).tolist()
    captured = CapturedVectorQueries()
    with connection.execute_wrapper(captured):
        ids, path = semantic_ranking(
            context_id=ctx.pk, model=MODEL, vector=query, limit=10, context_size=5090
        )
    assert path == "hnsw" and len(ids) == 10
    assert set(
        Message.objects.filter(pk__in=[i for i, _ in ids]).values_list("context_id", flat=True)
    ) == {ctx.pk}
    # Approximate recall (random 384-d vectors are HNSW's hardest case), but ranked by true
    # distance.
    distances = [d for _, d in ids]
    assert distances == sorted(distances)
    exact = dict(_exact(ctx.pk, query, 6000))
    assert distances == pytest.approx([exact[i] for i, _ in ids], abs=1e-5)
    # No exact scan on a large context: one statement, an HNSW walk, no sort of its rows.
    [(sql, params)] = captured.statements
    plan = _plan(sql, params, hnsw_settings_sql(model=MODEL, dims=DIMS, limit=10, share=5090))
    assert f"Index Scan using {indexer.index_name(MODEL, DIMS)}" in plan, plan
    # (The side table of vectors waiting for the graph is empty here: scanning it is free.)
    assert "embedding_context_model_idx" not in plan, plan
    assert "Seq Scan" not in plan.replace("Seq Scan on memory_app_embeddingwaiting", ""), plan
    # The walk is the index of the vector table (its predicate ends with `AND indexed`, true for
    # every row) and sorts nothing; the rows still waiting for the indexer come from their side
    # table's index.
    walk, *waiting_parts = (
        plan.split("CTE Scan on nearest")[0].split("CTE nearest")[1].split("CTE waiting")
    )
    waiting = "".join(waiting_parts)
    assert "Sort" not in walk, plan
    assert "memory_app_embeddingwaiting" in waiting, plan
    assert "on memory_app_embedding " not in waiting, plan
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = %s",
            [indexer.index_name(MODEL, DIMS)],
        )
        assert cur.fetchone()[0].endswith("AND indexed)")


def test_the_messages_walk_keeps_one_generic_plan_that_walks_the_model_index(store, settings):
    """On one node the walk is prepared and planned once without its values (its settings say
    so): that plan must still be the model's HNSW index walked in its order, not a sort of the
    context's rows, and answer as the exact ranking does, for each query and context."""
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 1000
    rng = np.random.default_rng(21)
    for ctx in store["big"][:2]:
        for _ in range(3):
            query = rng.normal(size=DIMS).tolist()
            ids, path = semantic_ranking(
                context_id=ctx.pk, model=MODEL, vector=query, limit=10, context_size=5090
            )
            assert path == "hnsw" and len(ids) == 10
            exact = dict(_exact(ctx.pk, query, 6000))
            assert [d for _, d in ids] == pytest.approx([exact[i] for i, _ in ids], abs=1e-5)
    prepared = prepared_plans("%nearest AS MATERIALIZED%")
    if _sharded():
        assert prepared == []  # on Citus the walk is planned for each call
        return
    assert prepared and all(custom == 0 for _, _, custom in prepared), prepared
    assert sum(generic for _, generic, _ in prepared) >= 6
    # The plan those runs kept: the statement planned without values, under its settings.
    settings_sql = hnsw_settings_sql(model=MODEL, dims=DIMS, limit=10, share=5090, generic=True)
    assert "force_generic_plan" in settings_sql[1]
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(*settings_sql)
        cur.execute("EXPLAIN (GENERIC_PLAN, COSTS OFF) " + prepared[0][0])
        plan = "\n".join(row[0] for row in cur.fetchall())
    walk = plan.split("CTE Scan on nearest")[0].split("CTE nearest")[1].split("CTE waiting")[0]
    assert f"Index Scan using {indexer.index_name(MODEL, DIMS)}" in walk, plan
    assert "Sort" not in walk, plan
    # Its joins are key lookups, sized for no particular context: no hash of a context's rows.
    assert "Hash" not in plan and "Merge" not in plan, plan


def test_the_walks_one_plan_looks_its_rows_up_by_key_among_many_small_contexts(store, settings):
    """The walk's one plan is made without the context, for the average context of the store's
    statistics; the walk itself runs only in large contexts. Among thousands of one-message
    contexts the average is a row or two, and a plan that read the context's messages once,
    kept them in memory and matched each walked vector against all of them, looked cheaper than
    a key lookup per vector: in a large context that reads them all for each search (the
    benchmark's semantic rows measure it). The walk's rows are looked up by key whatever the
    statistics."""
    if _sharded():
        return  # on Citus the walk is planned for each call, with its values
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 1000
    ctx = store["big"][0]
    tiny = Context.objects.bulk_create(
        Context(keys={"tiny": str(i)}, keys_digest=keys_digest({"tiny": str(i)}))
        for i in range(3000)
    )
    try:
        with connection.cursor() as cur:
            _copy_rows(
                cur.cursor,
                "memory_app_message",
                ["context_id", "seq", "role", "name", "text", "tags", "metadata"]
                + ["token_count", "tokenizer", "source_timestamp", "created_at", "updated_at"]
                + ["pruned_by"],
                (
                    (c.pk, 1, "user", "", "w1", "{}", "{}", 0, "", "", "now", "now", "")
                    for c in tiny
                ),
            )
            cur.execute("ANALYZE memory_app_message")
        query = np.random.default_rng(41).normal(size=DIMS).tolist()
        ids, path = semantic_ranking(
            context_id=ctx.pk, model=MODEL, vector=query, limit=10, context_size=5090
        )
        assert path == "hnsw" and len(ids) == 10
        exact = dict(_exact(ctx.pk, query, 6000))
        assert [d for _, d in ids] == pytest.approx([exact[i] for i, _ in ids], abs=1e-5)
        [(statement, generic, _)] = prepared_plans("%nearest AS MATERIALIZED%")
        assert generic >= 1
        settings_sql = hnsw_settings_sql(model=MODEL, dims=DIMS, limit=10, share=5090, generic=True)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(*settings_sql)
            cur.execute("EXPLAIN (GENERIC_PLAN, COSTS OFF) " + statement)
            plan = "\n".join(row[0] for row in cur.fetchall())
        walk = plan.split("CTE Scan on nearest")[0].split("CTE nearest")[1].split("CTE waiting")[0]
        assert "Materialize" not in walk, plan
        assert "Index Scan using memory_app_message_pkey on memory_app_message m" in walk, plan
    finally:
        # ANALYZE writes the table's size in place, outside the rolled-back transaction.
        Context.objects.filter(pk__in=[c.pk for c in tiny]).delete()
        with connection.cursor() as cur:
            cur.execute("ANALYZE memory_app_message")


def test_the_waiting_vectors_are_read_by_their_context_whatever_the_side_table_statistics(
    store, settings
):
    """The side table of vectors waiting for the indexer is analysed in whatever state it is in
    (by autovacuum; empty after a drain's vacuum). Analysed while it held one other context's
    batch, a walk planned with the join read the searched context's every message to look each
    up there; analysed empty, it scanned the table whole for each batch landing after. The
    walk reads a context's waiting vectors through the (context, model) index, then joins
    them, and finds them beside the walk."""
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 1000
    ctx, other = store["big"][:2]
    columns = ["context_id", "message_id", "model", "dimensions", "vector"]
    listed = ", ".join(columns)
    with connection.cursor() as cur:
        # Another context's batch waiting, and three of this context's own messages (their
        # vectors moved out of the graph's table, as a deferred batch's are until indexed).
        cur.execute(
            f"INSERT INTO memory_app_embeddingwaiting ({listed}) SELECT {listed}"  # noqa: S608
            " FROM memory_app_embedding WHERE context_id = %s AND model = %s",
            [other.pk, MODEL],
        )
        cur.execute(
            "SELECT id, message_id, vector::text FROM memory_app_embedding"
            " WHERE context_id = %s AND model = %s ORDER BY id LIMIT 3",
            [ctx.pk, MODEL],
        )
        moved = cur.fetchall()
        cur.execute(
            f"INSERT INTO memory_app_embeddingwaiting ({listed}) SELECT {listed}"  # noqa: S608
            " FROM memory_app_embedding WHERE context_id = %s AND id = ANY(%s)",
            [ctx.pk, [pk for pk, _, _ in moved]],
        )
        cur.execute(
            "DELETE FROM memory_app_embedding WHERE context_id = %s AND id = ANY(%s)",
            [ctx.pk, [pk for pk, _, _ in moved]],
        )
        if not _sharded():
            cur.execute("ANALYZE memory_app_embeddingwaiting")
    try:
        _walk_with_waiting_vectors(ctx, moved)
    finally:
        if not _sharded():
            # ANALYZE writes the table's size in place, outside the rolled-back transaction:
            # the side table is left analysed empty, as a drain's vacuum leaves it.
            with connection.cursor() as cur:
                cur.execute("DELETE FROM memory_app_embeddingwaiting")
                cur.execute("ANALYZE memory_app_embeddingwaiting")


def _walk_with_waiting_vectors(ctx, moved) -> None:
    rng = np.random.default_rng(33)
    # Three queries, then one of the waiting vectors' own: its message comes first.
    its_own = [float(x) for x in moved[0][2].strip("[]").split(",")]
    for query in [*(rng.normal(size=DIMS).tolist() for _ in range(3)), its_own]:
        ids, path = semantic_ranking(
            context_id=ctx.pk, model=MODEL, vector=query, limit=10, context_size=5090
        )
        exact = dict(_exact(ctx.pk, query, 6000))
        assert len(ids) == 10
        assert [d for _, d in ids] == pytest.approx([exact[i] for i, _ in ids], abs=1e-5)
    assert ids[0] == (moved[0][1], pytest.approx(0, abs=1e-6)) and path == "hnsw+pending"
    if _sharded():
        return  # planned on the workers for each call
    [(statement, _, _)] = prepared_plans("%nearest AS MATERIALIZED%")
    settings_sql = hnsw_settings_sql(model=MODEL, dims=DIMS, limit=10, share=5090, generic=True)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(*settings_sql)
        cur.execute("EXPLAIN (GENERIC_PLAN, COSTS OFF) " + statement)
        plan = "\n".join(row[0] for row in cur.fetchall())
    waiting = "".join(plan.split("CTE Scan on nearest")[0].split("CTE waiting")[1:])
    assert "Seq Scan" not in plan, plan
    # The context's waiting vectors by the side table's index (context and model), each one's
    # message then looked up by its key: never the context's messages read first.
    assert "embeddingwaiting_context_model" in waiting, plan
    assert "Index Cond: (context_id = " not in waiting, plan


def test_a_model_name_with_quotes_and_percent_signs_is_searched_as_written(store, settings):
    """The model is in the walk's text (as in its index's predicate), quoted: a name with
    quotes, a backslash and placeholders finds its own vectors through its own index and the
    exact scan alike, and a name that reads as SQL is a value that finds nothing."""
    small = store["small"]
    odd = "o'brien %s \\ %b"
    columns = [f.column for f in Embedding._meta.concrete_fields if f.column not in ("id", "model")]
    listed = ", ".join(columns)
    with connection.cursor() as cur:
        # The index first: a table with checks pending in the transaction cannot be indexed.
        cur.execute(indexer.index_sql(model=odd, dimensions=DIMS, concurrently=False))
        cur.execute(
            f"INSERT INTO memory_app_embedding (model, {listed}) SELECT %s, {listed}"  # noqa: S608
            " FROM memory_app_embedding WHERE context_id = %s AND model = %s",
            [odd, small.pk, MODEL],
        )
    query = np.random.default_rng(5).normal(size=DIMS).tolist()
    truth = [i for i, _ in _exact(small.pk, query, 20)]
    for threshold, path in ((5, "hnsw"), (20000, "exact")):
        settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = threshold
        ids, took = semantic_ranking(
            context_id=small.pk, model=odd, vector=query, limit=20, context_size=20
        )
        assert took == path and [i for i, _ in ids] == truth
        assert semantic_ranking(
            context_id=small.pk, model="x') OR (true", vector=query, limit=5, context_size=20
        ) == ([], "hnsw+exact" if path == "hnsw" else "exact")
        with pytest.raises(DataError):  # as when it was a parameter
            semantic_ranking(
                context_id=small.pk, model="a\x00b", vector=query, limit=5, context_size=20
            )


def test_small_context_exact_scan_keeps_only_k_rows_in_memory(store, settings):
    """The exact scan ranks with a top-N heap sort (k rows held), not a sort of every vector
    spilled to a temporary file."""
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 20000
    ctx = store["big"][0]
    query = np.random.default_rng(4).normal(size=DIMS).tolist()
    captured = CapturedVectorQueries()
    with connection.execute_wrapper(captured):
        ids, path = semantic_ranking(
            context_id=ctx.pk, model=MODEL, vector=query, limit=10, context_size=5090
        )
    assert path == "exact" and len(ids) == 10
    [(sql, params)] = captured.statements
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL work_mem = '1MB'")
        cur.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "top-N heapsort" in plan and "Disk" not in plan, plan
    assert "embedding_hnsw" not in plan, plan


@pytest.mark.parametrize("k", [1, 3, 10, 50])
@pytest.mark.parametrize(
    "query",
    [
        "alpha",
        "beta",
        "alpha beta",
        "alpha -beta",
        "alpha gamma",
        '"alpha beta"',
        'beta "alpha beta"',
    ],
)
@pytest.mark.parametrize("match", ["any", "all"])
def test_keyword_search_in_the_small_context_equals_brute_force(store, k, query, match):
    small = store["small"]
    expected = brute_force_keyword(small, query, match)
    if match == "all" and "gamma" in query:
        # No message holds "gamma": every word required, nothing matches.
        assert not search_messages(context=small, query=query, k=k, match=match).hits
        return
    assert expected, "the query must match something"
    result = search_messages(context=small, query=query, k=k, mode="keyword", match=match)
    assert [h.message.pk for h in result.hits] == expected[:k]
    assert len(result.hits) == min(k, len(expected))


def test_search_excludes_pruned_messages(store, system_actor):
    small = store["small"]
    top = search_messages(context=small, query="alpha", k=3, mode="keyword").hits[0].message
    messages_set_pruned(context=small, ids=[top.pk], pruned=True, actor=system_actor)
    assert top.pk not in [
        h.message.pk
        for h in search_messages(context=small, query="alpha", k=50, mode="keyword").hits
    ]
    query = np.asarray(Embedding.objects.get(message=top, model=MODEL).vector).tolist()
    hits = search_messages(
        context=small, query="", k=50, mode="semantic", model=MODEL, query_vector=query
    ).hits
    assert top.pk not in [h.message.pk for h in hits] and len(hits) == 19


def test_hybrid_fuses_both_rankings_by_their_weighted_scores(store):
    small = store["small"]
    first = Message.objects.get(context=small, seq=1)  # its text holds "alpha"
    query_vec = np.asarray(Embedding.objects.get(message=first, model=MODEL).vector).tolist()
    # The query is the message's own words and vector: it is first in both rankings, whatever
    # the random vectors of the others, so it must lead the fusion.
    result = search_messages(
        context=small, query=first.text, k=5, mode="hybrid", model=MODEL, query_vector=query_vec
    )
    assert result.mode == "hybrid" and len(result.hits) == 5
    # 0.8 × BM25 over the best BM25 of the keyword list, 0.2 × cosine similarity scaled over
    # the semantic list (each list the 20 best: hybrid reads three times k, at least 20).
    keyword = keyword_ranking(context_id=small.pk, query=first.text, limit=20)
    semantic, _ = semantic_ranking(context_id=small.pk, model=MODEL, vector=query_vec, limit=20)
    best = max(score for _, score in keyword)
    sims = {mid: 1 - d for mid, d in semantic}
    low, high = min(sims.values()), max(sims.values())
    for h in result.hits:
        expected = 0.8 * dict(keyword).get(h.message.pk, 0.0) / best
        if h.message.pk in sims:
            expected += 0.2 * (sims[h.message.pk] - low) / (high - low)
        assert h.score == pytest.approx(expected)
    assert [h.score for h in result.hits] == sorted((h.score for h in result.hits), reverse=True)
    both = [h for h in result.hits if h.keyword_rank and h.semantic_rank]
    assert first.pk in [h.message.pk for h in both]
    assert result.hits[0].message.pk == first.pk
    assert (result.hits[0].keyword_rank, result.hits[0].semantic_rank) == (1, 1)


def test_a_query_vector_of_the_wrong_dimension_is_invalid(store):
    with pytest.raises(errors.DimensionMismatch):
        search_messages(
            context=store["small"], query="", mode="semantic", model=MODEL, query_vector=[0.1] * 10
        )


def test_search_uses_the_context_size_to_pick_the_index_and_still_answers_k(store, settings):
    """A context at or above the exact-scan threshold goes through HNSW without counting its
    vectors; a tiny context whose size says 'large' still gets min(k, n) from the iterative scan."""
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 1000
    big = store["big"][0]
    big.message_count = 5090
    query = np.random.default_rng(5).normal(size=DIMS).tolist()
    result = search_messages(
        context=big, query="", k=10, mode="semantic", model=MODEL, query_vector=query
    )
    assert len(result.hits) == 10 and "vector scan: hnsw" in result.notes
    assert {h.message.context_id for h in result.hits} == {big.pk}

    small = store["small"]
    small.message_count = 5000  # claims 5,000 messages, has 20 vectors: the walk comes back short
    captured = CapturedVectorQueries()
    with connection.execute_wrapper(captured):
        result = search_messages(
            context=small, query="", k=15, mode="semantic", model=MODEL, query_vector=query
        )
    if not _sharded():
        assert "vector scan: hnsw+exact" in result.notes and len(captured.statements) == 2
    assert [h.message.pk for h in result.hits] == [mid for mid, _ in _exact(small.pk, query, 15)]


@pytest.mark.parametrize(
    ("vectors", "limit", "expected"),
    [
        (0, 10, 40),
        (10_000, 10, 40),
        (50_000, 10, 100),
        (999_963, 10, 320),
        (1_000_000, 10, 320),
        (5_000_000, 10, 320),
        (1_000_000, 300, 600),
        (111_803, 10, 150),
    ],
)
def test_ef_search_grows_with_the_store_between_steps(settings, vectors, limit, expected):
    settings.AGENTMEMORY_HNSW_EF_SEARCH = 0
    settings.AGENTMEMORY_HNSW_EF_SEARCH_STEPS = [
        (0, 40),
        (50_000, 100),
        (250_000, 200),
        (1_000_000, 320),
    ]
    assert abs(ef_search_for(vectors, limit) - expected) <= 1
    settings.AGENTMEMORY_HNSW_EF_SEARCH = 64
    assert ef_search_for(vectors, 10) == 64


def test_ef_search_grows_for_a_context_that_is_a_small_share_of_the_store(settings):
    """A filtered walk gets a longer candidate list the smaller the filter's share (square root
    of store / share), never above the cap; a fixed AGENTMEMORY_HNSW_EF_SEARCH stays fixed."""
    settings.AGENTMEMORY_HNSW_EF_SEARCH = 0
    settings.AGENTMEMORY_HNSW_EF_SEARCH_STEPS = [(0, 40), (100_000, 64), (1_000_000, 100)]
    store = 1_200_000
    assert ef_search_for(store, 10) == 100
    assert ef_search_for(store, 10, store) == 100  # the whole store: no filter to pay for
    assert ef_search_for(store, 10, 1_000_000) == 110
    assert ef_search_for(store, 10, 30_000) == 633
    assert ef_search_for(store, 10, 300) == MAX_EF_SEARCH
    settings.AGENTMEMORY_HNSW_EF_SEARCH = 64
    assert ef_search_for(store, 10, 30_000) == 64


WALK_SETTINGS = ("enable_sort", "enable_seqscan", "plan_cache_mode", "work_mem")


def _current(names) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join("current_setting(%s)" for _ in names), list(names))
        return dict(zip(names, cursor.fetchone(), strict=True))


def test_a_walk_inside_a_callers_transaction_leaves_the_callers_settings_alone(store, settings):
    """The walk's settings (no sort, no sequential scan, a generic plan, its own work_mem) are
    its own: in a caller's transaction they end with the walk, not with that transaction, and
    the caller's next statement is planned as before."""
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 1000  # the 5,090-message context takes HNSW
    ctx = store["big"][0]
    ctx.message_count = 5090  # (the fixture's COPY left the counter alone)
    query = np.random.default_rng(31).normal(size=DIMS).tolist()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL work_mem = '7MB'")  # the caller's own, kept as it is
        before = _current(WALK_SETTINGS)
        result = search_messages(
            context=ctx, query="", k=10, mode="semantic", model=MODEL, query_vector=query
        )
        assert "vector scan: hnsw" in result.notes and len(result.hits) == 10
        assert _current(WALK_SETTINGS) == before
        assert before["enable_sort"] == "on" and before["work_mem"] == "7MB"
