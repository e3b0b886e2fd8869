"""Vectors of a large batch are stored at COPY speed and inserted into the HNSW graph later by
the indexer; searches scan the waiting ones exactly, so every stored vector is found at once."""

from __future__ import annotations

import math

import psycopg
import pytest
from django.db import connection

from memory_app import backlog, scale_out
from memory_app.embeddings import indexer, queue
from memory_app.models import Embedding, EmbeddingWaiting, Message
from memory_app.queries.memories import _semantic_hits, memories_visible
from memory_app.search.messages import search_messages
from memory_app.search.semantic import semantic_ranking
from memory_app.services.contexts import context_get_or_create
from memory_app.services.memories import memories_record
from memory_app.services.messages import messages_append
from tests.builders import register_models

MODEL = "defer-4"


def vector(i: int) -> list[float]:
    a = i / 25
    return [math.cos(a), math.sin(a), 0.3 * math.cos(5 * a), 0.2]


def append(context, start: int, count: int) -> list[int]:
    result = messages_append(
        context=context,
        items=[
            {"role": "user", "text": f"t{i}", "vector": vector(i), "vector_model": MODEL}
            for i in range(start, start + count)
        ],
    )
    return [m.pk for m in result.messages]


def exact(context, query, k):
    rows = [
        *Embedding.objects.filter(context=context, model=MODEL).values_list("message_id", "vector"),
        *EmbeddingWaiting.objects.filter(context=context, model=MODEL).values_list(
            "message_id", "vector"
        ),
    ]

    def cosine(v):
        dot = sum(a * b for a, b in zip(v, query, strict=True))
        return 1 - dot / (math.dist(v, [0] * 4) * math.dist(query, [0] * 4))

    return [
        mid
        for mid, _ in sorted(
            ((mid, cosine(list(v))) for mid, v in rows), key=lambda r: (r[1], r[0])
        )
    ][:k]


@pytest.fixture
def defer(settings):
    settings.AGENTMEMORY_INDEX_DEFER_MIN = 8
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 10  # the walk, not the small-context scan
    indexer._ensured.discard((MODEL, 4))
    register_models(**{MODEL: 4})
    yield settings
    indexer._ensured.discard((MODEL, 4))


@pytest.mark.django_db
def test_a_deferred_batch_is_searchable_at_once_then_indexed(defer):
    context, _ = context_get_or_create(keys={"test": "defer-search"})
    indexed_ids = [pk for start in range(0, 140, 7) for pk in append(context, start, 7)]
    assert not EmbeddingWaiting.objects.exists()
    assert Embedding.objects.filter(message_id__in=indexed_ids).count() == len(indexed_ids)
    # A batch of exactly the threshold is deferred: stored beside the graph, not in it.
    waiting = append(context, 140, 8)
    assert set(EmbeddingWaiting.objects.values_list("message_id", flat=True)) == set(waiting)
    assert not Embedding.objects.filter(message_id__in=waiting).exists()
    assert queue.unindexed_count(model=MODEL, context_id=context.pk) == 8
    context.refresh_from_db()
    query = vector(144)  # nearest to the waiting rows
    first = search_messages(
        context=context, query="", k=5, mode="semantic", model=MODEL, query_vector=query
    )
    assert "vector scan: hnsw+pending" in first.notes
    assert [h.message.pk for h in first.hits] == exact(context, query, 5)
    assert {h.message.pk for h in first.hits} <= set(waiting)
    # Exact k over both sides when the nearest mix indexed and waiting rows.
    ids, path = semantic_ranking(
        context_id=context.pk, model=MODEL, vector=vector(139), limit=12, context_size=148
    )
    assert path == "hnsw+pending" and [i for i, _ in ids] == exact(context, vector(139), 12)
    assert set(i for i, _ in ids) & set(waiting) and set(i for i, _ in ids) & set(indexed_ids)

    assert indexer.index_pending(batch_size=3) == 8
    assert queue.unindexed_count() == 0
    again = search_messages(
        context=context, query="", k=5, mode="semantic", model=MODEL, query_vector=query
    )
    assert "vector scan: hnsw" in again.notes
    assert [h.message.pk for h in again.hits] == [h.message.pk for h in first.hits]


@pytest.mark.django_db
def test_a_batch_below_the_threshold_goes_into_the_graph_at_once(defer):
    context, _ = context_get_or_create(keys={"test": "defer-small"})
    ids = append(context, 0, 7)
    assert Embedding.objects.filter(message_id__in=ids).count() == 7
    assert not EmbeddingWaiting.objects.exists()
    assert indexer.index_pending() == 0


@pytest.mark.django_db
def test_deleting_a_message_whose_vector_waits(defer):
    context, _ = context_get_or_create(keys={"test": "defer-delete"})
    ids = append(context, 0, 10)
    Message.objects.filter(pk=ids[0]).delete()
    assert queue.unindexed_count(context_id=context.pk) == 9
    assert indexer.index_pending() == 9
    assert not Embedding.objects.filter(message_id=ids[0]).exists()
    assert Embedding.objects.filter(message_id__in=ids[1:]).count() == 9


@pytest.mark.django_db(transaction=True)
def test_two_indexers_never_take_the_same_rows(defer):
    context, _ = context_get_or_create(keys={"test": "defer-skip-locked"})
    try:
        append(context, 0, 20)
        locked = list(
            EmbeddingWaiting.objects.filter(context=context)
            .order_by("id")
            .values_list("id", flat=True)[:5]
        )
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        with psycopg.connect(**params) as other:
            # The other indexer holds its batch (uncommitted): this one skips it, without waiting.
            # Named by its context, as the indexer's own claim is (on Citus a row lock names one).
            other.execute(
                "SELECT id FROM memory_app_embeddingwaiting WHERE context_id = %s"
                " AND id = ANY(%s) FOR UPDATE SKIP LOCKED",
                [context.pk, locked],
            )
            assert indexer.index_pending() == 15
            assert set(EmbeddingWaiting.objects.values_list("id", flat=True)) == set(locked)
        assert indexer.index_pending() == 5
    finally:
        context.delete()


@pytest.mark.django_db(transaction=True)
def test_the_indexer_thread_drains_after_the_batch_commits(defer):
    defer.AGENTMEMORY_INDEXER_THREAD = True
    context, _ = context_get_or_create(keys={"test": "defer-thread"})
    try:
        append(context, 0, 30)
        assert backlog.indexer.wait_idle(60)
        assert queue.unindexed_count() == 0
        assert Embedding.objects.filter(context=context).count() == 30
    finally:
        context.delete()


@pytest.mark.django_db
def test_health_and_the_command_show_the_backlog(defer, client):
    from io import StringIO

    from django.core.management import call_command

    context, _ = context_get_or_create(keys={"test": "defer-health"})
    append(context, 0, 9)
    assert client.get("/healthz").json()["vectors_unindexed"] == 9
    out = StringIO()
    call_command("index_pending", "--batch-size", "4", stdout=out)
    assert "9 vectors waiting" in out.getvalue() and "done: 9 indexed, 0 waiting" in out.getvalue()
    assert client.get("/healthz").json()["vectors_unindexed"] == 0


@pytest.mark.django_db
def test_memories_recorded_with_a_deferred_batch_are_recalled_at_once(defer, system_actor):
    from memory_app.memories import Scope

    context, _ = context_get_or_create(keys={"test": "defer-memories"})
    items = [
        {"content": f"fact {i}", "vector": vector(i), "vector_model": MODEL} for i in range(40)
    ]
    for start in range(0, 40, 5):  # small batches: in the graph at once
        memories_record(
            scope=Scope(context=context), items=items[start : start + 5], actor=system_actor
        )
    late = memories_record(
        scope=Scope(context=context),
        items=[
            {"content": f"late {i}", "vector": vector(100 + i), "vector_model": MODEL}
            for i in range(8)
        ],
        actor=system_actor,
    )
    assert queue.unindexed_count(model=MODEL) == 8
    qs = memories_visible(context=context)
    hits = _semantic_hits(qs, vector(102), MODEL, 3)
    assert [rid for rid, _ in hits][0] == late[2].record.pk
    assert {rid for rid, _ in hits} <= {r.record.pk for r in late}


def _written(table: str) -> tuple[int, int, int]:
    """(inserted, updated, deleted) row versions of `table` this backend wrote, not yet flushed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_inserted(%s::regclass),"
            " pg_stat_get_xact_tuples_updated(%s::regclass),"
            " pg_stat_get_xact_tuples_deleted(%s::regclass)",
            [table] * 3,
        )
        return cursor.fetchone()


def _delta(table: str, before: dict) -> tuple[int, ...]:
    return tuple(now - then for now, then in zip(_written(table), before[table], strict=True))


@pytest.mark.django_db
def test_a_deferred_batch_writes_each_vector_row_once(defer, system_actor):
    from memory_app.memories import Scope

    context, _ = context_get_or_create(keys={"test": "defer-once"})
    # The counters hold what earlier transactions of this connection wrote until the backend
    # flushes its statistics, so each table is read before and after.
    tables = [*indexer.VECTOR_TABLES, *(indexer.WAITING_TABLES[t] for t in indexer.VECTOR_TABLES)]
    before = {table: _written(table) for table in tables}
    ids = append(context, 0, 40)
    memories_record(
        scope=Scope(context=context),
        items=[
            {"content": f"fact {i}", "vector": vector(i), "vector_model": MODEL} for i in range(9)
        ],
        actor=system_actor,
    )
    assert queue.unindexed_count() == 49
    assert indexer.index_pending(batch_size=7) == 49
    with connection.cursor() as cursor:
        # On Citus the message vectors' counters are the shards', on the workers.
        sharded = scale_out.is_distributed(cursor, indexer.MESSAGE_VECTORS)
    for table, count in ((indexer.MESSAGE_VECTORS, 40), (indexer.MEMORY_VECTORS, 9)):
        if sharded and table == indexer.MESSAGE_VECTORS:
            continue
        # One row version each, written by the indexer into the graph: none updated or replaced.
        assert _delta(table, before) == (count, 0, 0), table
        waiting_in, _, waiting_out = _delta(indexer.WAITING_TABLES[table], before)
        assert waiting_in == waiting_out > 0  # in, then out again
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT message_id, xmin::text FROM memory_app_embedding WHERE message_id = ANY(%s)",
            [ids],
        )
        xmins = dict(cursor.fetchall())
    assert set(xmins) == set(ids)
    # The indexer has nothing more to write: the rows stay the versions it wrote.
    assert indexer.index_pending() == 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT message_id, xmin::text FROM memory_app_embedding WHERE message_id = ANY(%s)",
            [ids],
        )
        assert dict(cursor.fetchall()) == xmins


@pytest.mark.django_db
def test_every_vector_is_found_once_before_during_and_after_indexing(defer):
    context, _ = context_get_or_create(keys={"test": "defer-every"})
    ids = append(context, 0, 30) + append(context, 30, 5)  # a deferred batch, then a small one
    assert queue.unindexed_count(context_id=context.pk) == 30

    def found(query):
        hits, _ = semantic_ranking(context_id=context.pk, model=MODEL, vector=query, limit=len(ids))
        return [pk for pk, _ in hits]

    for stage in ("before", "during", "during", "after"):
        for query in (vector(3), vector(33)):
            hits = found(query)
            assert sorted(hits) == sorted(ids), stage  # each vector once, none left out
            assert hits == exact(context, query, len(ids)), stage
        if stage != "after":
            indexer.index_pending(batch_size=11, max_batches=1)
    assert queue.unindexed_count() == 0
    # With every vector in the graph, the walk alone finds the nearest.
    context.refresh_from_db()
    first = search_messages(
        context=context, query="", k=5, mode="semantic", model=MODEL, query_vector=vector(12)
    )
    assert "vector scan: hnsw" in first.notes
    assert [h.message.pk for h in first.hits] == exact(context, vector(12), 5)


@pytest.mark.django_db
def test_an_item_s_vector_is_in_one_table_whatever_writes_it_next(defer, system_actor):
    """A vector put over a waiting one replaces it, an edit makes a waiting vector pending like
    any other, and a re-embed queues no second row beside a waiting one."""
    from memory_app.embeddings.client_vectors import vector_put
    from memory_app.services.messages import message_edit

    context, _ = context_get_or_create(keys={"test": "defer-one-table"})
    ids = append(context, 0, 10)
    put, edited = Message.objects.get(pk=ids[0]), Message.objects.get(pk=ids[1])

    vector_put(model=MODEL, vector=vector(50), message=put)
    assert not EmbeddingWaiting.objects.filter(message=put).exists()
    [row] = Embedding.objects.filter(message=put, model=MODEL)
    assert list(row.vector) == pytest.approx(vector(50))

    message_edit(message=edited, actor=system_actor, text="changed")
    assert not EmbeddingWaiting.objects.filter(message=edited).exists()
    [row] = Embedding.objects.filter(message=edited, model=MODEL)
    assert row.vector is None  # pending: its text changed

    assert queue.reembed_enqueue(model=MODEL, context_id=context.pk) == 0
    assert queue.model_coverage(model=MODEL, context_id=context.pk) == (9, 10)
    assert indexer.index_pending() == 8
    hits, _ = semantic_ranking(context_id=context.pk, model=MODEL, vector=vector(50), limit=20)
    assert sorted(pk for pk, _ in hits) == sorted(set(ids) - {edited.pk})
    assert hits[0][0] == put.pk


def _side_table_pages() -> int:
    """The side table's pages (on Citus its shards', which the coordinator does not hold)."""
    table = "memory_app_embeddingwaiting"
    size = "citus_relation_size" if scale_out.table_is_distributed(table) else "pg_relation_size"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {size}(%s::regclass) / 8192", [table])
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_drain_that_moved_many_rows_vacuums_the_side_table(defer, monkeypatch):
    """Until a vacuum, a search of a context's waiting vectors visits every page the moved rows
    left dead: a drain of many rows (the indexer thread's, `index_pending`) and the worker's turns
    that find none left after many (`embed_worker`) vacuum the side tables, which gives the empty
    pages back; a drain of few leaves it to autovacuum."""
    context, _ = context_get_or_create(keys={"test": "defer-vacuum"})
    try:
        monkeypatch.setattr(indexer, "VACUUM_AFTER", 40)
        append(context, 0, 30)
        assert _side_table_pages() > 0
        assert indexer.index_pending() == 30
        assert _side_table_pages() > 0  # 30 < 40: left to autovacuum
        append(context, 30, 50)
        assert indexer.index_pending() == 50
        assert _side_table_pages() == 0
        # The worker's turns: one batch a turn, then a turn with none left after 40 or more.
        append(context, 80, 45)
        moved = 0
        while done := indexer.index_batch(batch_size=20):
            moved += done
        assert moved == 45 and _side_table_pages() > 0
        assert backlog._vacuumed_after(39) == 39  # fewer than 40 since the last: no vacuum
        assert _side_table_pages() > 0
        assert backlog._vacuumed_after(moved) == 0
        assert _side_table_pages() == 0
        assert Embedding.objects.filter(context=context).count() == 125
    finally:
        context.delete()
