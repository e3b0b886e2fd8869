"""Vectors sent inline with a batch of messages or memories: stored with the items
(COPY), not queued for the worker; a wrong dimension is a 422 naming the item, nothing written."""

from __future__ import annotations

import math

import pytest
from django.db import connection

from memory_app import scale_out
from memory_app.embeddings import indexer, queue
from memory_app.models import Embedding, EmbeddingWaiting, MemoryEmbedding, MemoryRecord, Message
from memory_app.search.semantic import semantic_ranking
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from tests.api_helpers import make_key, new_context
from tests.builders import analyse, register_models

pytestmark = pytest.mark.django_db

BATCH = "/api/v1/contexts/{cid}/messages/batch"


def unit(*xs: float) -> list[float]:
    norm = math.sqrt(sum(x * x for x in xs))
    return [x / norm for x in xs]


def angle(i: int) -> list[float]:
    """Unit vectors 1.5 degrees apart: the nearest neighbours of one are its index neighbours."""
    return [math.cos(i * math.pi / 120), math.sin(i * math.pi / 120), 0.0]


@pytest.fixture
def api(settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    # Each test's transaction rolls back the indexes the process cache remembers.
    indexer._ensured.clear()
    register_models(**{"inline-3": 3, "inline-4": 4, "conf-model": 3, "m": 2})
    return make_key(scopes=["read", "write"])


def _stored(model: str) -> dict[int, list[float]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT message_id, vector::text FROM memory_app_embedding WHERE model = %s", [model]
        )
        return {
            mid: [float(x) for x in text.strip("[]").split(",")] for mid, text in cur.fetchall()
        }


@pytest.mark.parametrize("size", [3, 60])  # a small batch (INSERT) and one written with COPY
def test_batch_vectors_are_stored_with_the_messages_and_searchable(api, size):
    cid = new_context(api, {"test": f"inline-{size}"})
    vectors = [unit(1.0, i / size, 0.1) for i in range(size)]
    response = api.post(
        BATCH.format(cid=cid),
        {
            "messages": [
                {"role": "user", "text": f"message {i}", "vector": v, "vector_model": "inline-3"}
                for i, v in enumerate(vectors)
            ]
        },
    )
    assert response.status_code == 201, response.content
    ids = [m["id"] for m in response.json()["messages"]]
    stored = _stored("inline-3")
    assert set(ids) <= set(stored)
    for mid, v in zip(ids, vectors, strict=True):
        assert stored[mid] == pytest.approx(v, abs=1e-6)
    rows = Embedding.objects.filter(message_id__in=ids)
    assert rows.filter(vector__isnull=True).count() == 0  # nothing left pending
    assert set(rows.values_list("dimensions", flat=True)) == {3}
    assert set(rows.values_list("context_id", flat=True)) == {cid}
    # The vectors serve a semantic search at once, through the model's HNSW index.
    hits = api.post(
        f"/api/v1/contexts/{cid}/select",
        {
            "selector": "search",
            "mode": "semantic",
            "k": 1,
            "model": "inline-3",
            "query_vector": vectors[-1],
        },
    )
    assert hits.status_code == 200, hits.content
    assert [i["message"]["id"] for i in hits.json()["items"]] == [ids[-1]]
    if _index_waits_for_the_transaction():
        return
    with connection.cursor() as cur:
        cur.execute(
            "SELECT 1 FROM pg_indexes WHERE indexname = %s",
            [indexer.index_name("inline-3", 3)],
        )
        assert cur.fetchone() is not None


def _index_waits_for_the_transaction() -> bool:
    """On Citus a model's first index is built by the next call outside a transaction (the
    worker's, the indexer's: indexer._build_once), never inside this test's."""
    return scale_out.table_is_distributed("memory_app_embedding")


def test_a_wrong_dimension_is_422_naming_the_item_and_nothing_is_written(api):
    cid = new_context(api, {"test": "inline-wrong"})
    first = api.post(
        BATCH.format(cid=cid),
        {
            "messages": [
                {"role": "user", "text": "a", "vector": [1, 0, 0, 0], "vector_model": "inline-4"}
            ]
        },
    )
    assert first.status_code == 201
    before = (Message.objects.count(), Embedding.objects.count())
    items = [
        {
            "role": "user",
            "text": f"m{i}",
            "vector": [0.5, 0.5, 0.5, 0.5],
            "vector_model": "inline-4",
        }
        for i in range(60)
    ]
    items[37]["vector"] = [0.5, 0.5, 0.5]
    bad = api.post(BATCH.format(cid=cid), {"messages": items})
    assert bad.status_code == 422
    detail = bad.json()["detail"]
    assert "messages[37]" in detail and "4 dimensions" in detail and "has 3" in detail
    assert (Message.objects.count(), Embedding.objects.count()) == before


def test_a_registered_models_dimensions_hold_for_every_item_of_the_batch(api):
    cid = new_context(api, {"test": "inline-mixed"})
    register_models(**{"inline-new": 2})
    bad = api.post(
        BATCH.format(cid=cid),
        {
            "messages": [
                {"role": "user", "text": "a", "vector": [1, 0], "vector_model": "inline-new"},
                {"role": "user", "text": "b", "vector": [1, 0, 0], "vector_model": "inline-new"},
            ]
        },
    )
    assert bad.status_code == 422 and "messages[1]" in bad.json()["detail"]
    assert not Message.objects.filter(context_id=cid).exists()
    assert not Embedding.objects.filter(model="inline-new").exists()


def test_without_a_provider_the_model_must_be_named(api):
    cid = new_context(api, {"test": "inline-nomodel"})
    bad = api.post(
        BATCH.format(cid=cid),
        {
            "messages": [
                {"role": "user", "text": "a"},
                {"role": "user", "text": "b", "vector": [1.0, 0.0]},
            ]
        },
    )
    assert bad.status_code == 422
    assert "messages[1]" in bad.json()["detail"] and "vector_model" in bad.json()["detail"]
    assert not Message.objects.filter(context_id=cid).exists()
    lonely = api.post(
        BATCH.format(cid=cid),
        {"messages": [{"role": "user", "text": "a", "vector_model": "inline-3"}]},
    )
    assert lonely.status_code == 422 and "without a vector" in lonely.json()["detail"]


def test_non_finite_or_oversized_vectors_are_422(api):
    cid = new_context(api, {"test": "inline-nan"})
    nan = api.post(
        BATCH.format(cid=cid),
        raw=(
            '{"messages": [{"role": "user", "text": "a", "vector": [NaN, 1], "vector_model": "m"}]}'
        ),
    )
    assert nan.status_code in (400, 422)
    huge = api.post(
        BATCH.format(cid=cid),
        {"messages": [{"role": "user", "text": "a", "vector": [0.1] * 16001, "vector_model": "m"}]},
    )
    assert huge.status_code == 422
    assert not Message.objects.filter(context_id=cid).exists()


def test_vectors_default_to_the_configured_model_and_only_the_rest_is_queued(api, settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "openai"
    settings.AGENTMEMORY_EMBEDDING_MODEL = "conf-model"
    # Never contacted: the vectors come with the messages, the rest waits for a worker.
    settings.AGENTMEMORY_OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    cid = new_context(api, {"test": "inline-default"})
    response = api.post(
        BATCH.format(cid=cid),
        {
            "messages": [
                {"role": "user", "text": "with its vector", "vector": unit(1, 2, 3)},
                {"role": "user", "text": "left to the worker"},
                {
                    "role": "user",
                    "text": "another model",
                    "vector": [1, 0, 0],
                    "vector_model": "inline-3",
                },
            ]
        },
    )
    assert response.status_code == 201, response.content
    a, b, c = (m["id"] for m in response.json()["messages"])
    conf = {row.message_id: row for row in Embedding.objects.filter(model="conf-model")}
    assert conf[a].vector is not None and conf[a].dimensions == 3
    assert conf[b].vector is None  # pending for the worker
    assert conf[c].vector is None  # the configured model still needs its own vector
    assert Embedding.objects.get(message_id=c, model="inline-3").vector is not None
    assert queue.pending_count(model="conf-model", context_id=cid) == 2


def test_a_repeated_batch_stores_no_second_vector(api):
    cid = new_context(api, {"test": "inline-repeat"})
    body = {
        "messages": [
            {
                "client_id": "r1",
                "role": "user",
                "text": "once",
                "vector": [0, 1, 0],
                "vector_model": "inline-3",
            }
        ]
    }
    assert api.post(BATCH.format(cid=cid), body).status_code == 201
    again = api.post(BATCH.format(cid=cid), body)
    assert again.status_code == 200 and again.json()["created"] == [False]
    mid = again.json()["messages"][0]["id"]
    assert Embedding.objects.filter(message_id=mid).count() == 1


def test_single_append_takes_a_vector_too(api):
    cid = new_context(api, {"test": "inline-single"})
    response = api.post(
        f"/api/v1/contexts/{cid}/messages",
        {"role": "user", "text": "hello", "vector": [0, 0, 1], "vector_model": "inline-3"},
    )
    assert response.status_code == 201
    assert _stored("inline-3")[response.json()["id"]] == [0.0, 0.0, 1.0]


def test_memories_record_vectors_inline_and_name_a_wrong_item(api):
    cid = new_context(api, {"test": "inline-memories"})
    ok = api.post(
        "/api/v1/memories",
        {
            "context_id": cid,
            "items": [
                {"content": "Ada drinks tea", "vector": [1, 0, 0], "vector_model": "inline-3"},
                {"content": "Ada plays chess", "vector": [0, 1, 0], "vector_model": "inline-3"},
            ],
        },
    )
    assert ok.status_code == 201, ok.content
    ids = [i["memory"]["id"] for i in ok.json()["items"]]
    rows = MemoryEmbedding.objects.filter(memory_record_id__in=ids, model="inline-3")
    assert rows.count() == 2 and not rows.filter(vector__isnull=True).exists()
    assert set(rows.values_list("memory_record__context_id", flat=True)) == {cid}
    assert not Embedding.objects.filter(model="inline-3", message__isnull=True).exists()
    before = (MemoryRecord.objects.count(), MemoryEmbedding.objects.count())
    bad = api.post(
        "/api/v1/memories",
        {
            "context_id": cid,
            "items": [
                {"content": "fine", "vector": [1, 0, 0], "vector_model": "inline-3"},
                {"content": "wrong", "vector": [1, 0], "vector_model": "inline-3"},
            ],
        },
    )
    assert bad.status_code == 422 and "items[1]" in bad.json()["detail"]
    single = api.post(
        "/api/v1/memories",
        {"context_id": cid, "content": "also wrong", "vector": [1.0], "vector_model": "inline-3"},
    )
    assert single.status_code == 422 and "content" in single.json()["detail"]
    assert (MemoryRecord.objects.count(), MemoryEmbedding.objects.count()) == before


def test_domain_append_with_vectors_writes_no_pending_rows(api):
    context, _ = context_get_or_create(keys={"test": "inline-domain"})
    result = messages_append(
        context=context,
        items=[
            {"role": "user", "text": f"t{i}", "vector": angle(i), "vector_model": "inline-3"}
            for i in range(120)
        ],
    )
    ids = [m.pk for m in result.messages]
    # Every vector written (in its HNSW graph or, a batch this large, waiting for it), none
    # pending for a provider.
    assert not Embedding.objects.filter(message_id__in=ids, vector__isnull=True).exists()
    stored = [table.objects.filter(message_id__in=ids) for table in (Embedding, EmbeddingWaiting)]
    assert sum(rows.count() for rows in stored) == 120
    hits, path = semantic_ranking(
        context_id=context.pk, model="inline-3", vector=angle(77), limit=3
    )
    found = [mid for mid, _ in hits]
    assert found[0] == ids[77] and set(found[1:]) == {ids[76], ids[78]}


def test_a_value_beyond_half_precision_is_422_on_every_vector_path(api):
    """The HNSW index holds vectors at half precision: a value beyond ±65,504 cannot go in, so it
    is refused before anything is written instead of failing inside the database."""
    cid = new_context(api, {"test": "inline-halfvec"})
    items = [
        {"role": "user", "text": "fine", "vector": [0.5, 0.5, 0.5], "vector_model": "inline-3"},
        {"role": "user", "text": "big", "vector": [70000.0, 0, 1], "vector_model": "inline-3"},
    ]
    bad = api.post(BATCH.format(cid=cid), {"messages": items})
    assert bad.status_code == 422, bad.content
    assert "messages[1]" in bad.json()["detail"] and "65,504" in bad.json()["detail"]
    assert not Message.objects.filter(context_id=cid).exists()
    assert not Embedding.objects.filter(model="inline-3").exists()
    [message] = api.post(BATCH.format(cid=cid), {"messages": items[:1]}).json()["messages"]
    search_body = {"selector": "search", "mode": "semantic", "model": "inline-3", "k": 1}
    query = api.post(
        f"/api/v1/contexts/{cid}/select", search_body | {"query_vector": [-70000.0, 0, 0]}
    )
    assert query.status_code == 422 and "65,504" in query.json()["detail"]
    edge = api.post(
        f"/api/v1/contexts/{cid}/select", search_body | {"query_vector": [65504.0, 0, 0]}
    )
    assert edge.status_code == 200 and edge.json()["items"][0]["message"]["id"] == message["id"]


def _inline_indexes() -> dict[str, str]:
    """The HNSW indexes of model inline-3: name → definition."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE indexname LIKE 'embedding%%hnsw%%'"
            " AND indexdef LIKE '%%inline-3%%'"
        )
        return dict(cur.fetchall())


def test_the_halfvec_migration_replaces_a_full_precision_index(api):
    """Migration 0010 drops the pre-0010 `vector` HNSW indexes and builds each model's halfvec
    index, which semantic search then walks."""
    if _index_waits_for_the_transaction():
        pytest.skip("the model's index is built outside the test's transaction on Citus")
    from importlib import import_module
    from types import SimpleNamespace

    migration = import_module("memory_app.migrations.0010_halfvec_hnsw")
    cid = new_context(api, {"test": "inline-migrate"})
    api.post(
        BATCH.format(cid=cid),
        {
            "messages": [
                {"role": "user", "text": f"m{i}", "vector": angle(i), "vector_model": "inline-3"}
                for i in range(5)
            ]
        },
    )
    new = indexer.index_name("inline-3", 3, prefix="embedding_hnswh_")
    old = indexer.index_name("inline-3", 3, prefix="embedding_hnsw_")
    with connection.cursor() as cur:
        cur.execute(f'DROP INDEX "{indexer.index_name("inline-3", 3)}"')
        cur.execute(
            f'CREATE INDEX "{old}" ON memory_app_embedding USING hnsw '
            "((vector::vector(3)) vector_cosine_ops) WHERE model = 'inline-3' AND dimensions = 3"
        )
    migration.to_halfvec(None, SimpleNamespace(connection=connection))
    indexes = _inline_indexes()
    assert list(indexes) == [new] and "halfvec_cosine_ops" in indexes[new]
    # Migration 0011 then builds the index of indexed rows only and drops 0010's; no row is lost
    # and the deferred ones are still found.
    later = import_module("memory_app.migrations.0011_deferred_hnsw")
    count = Embedding.objects.filter(model="inline-3").count()
    later.rebuild_with_predicate(None, SimpleNamespace(connection=connection))
    indexes = _inline_indexes()
    current = indexer.index_name("inline-3", 3)
    assert list(indexes) == [current] and indexes[current].endswith("AND indexed)")
    assert Embedding.objects.filter(model="inline-3").count() == count


def test_a_models_store_size_counts_its_own_vectors_not_every_models(api, settings):
    """The HNSW search's ef_search grows with the store: a second model's vectors (a re-embed
    keeps the old ones) must not make every search of the first walk further."""
    if _index_waits_for_the_transaction():
        pytest.skip("the model's index is built outside the test's transaction on Citus")
    from memory_app.search import semantic as message_search

    settings.AGENTMEMORY_INDEX_DEFER_MIN = 10_000  # every vector straight into its index
    context, _ = context_get_or_create(keys={"test": "store-size"})
    for model, dims, n in (("inline-3", 3, 300), ("inline-4", 4, 100)):
        items = [
            {"role": "user", "text": f"{model} {i}", "vector_model": model}
            | {"vector": unit(1.0, i / n, *[0.1] * (dims - 2))}
            for i in range(n)
        ]
        messages_append(context=context, items=items)
    analyse("embedding")
    message_search._store_sizes.clear()
    assert message_search.store_size("inline-3", 3) == 300
    assert message_search.store_size("inline-4", 4) == 100
