"""Changing AGENTMEMORY_HNSW_M / _EF_CONSTRUCTION reaches existing indexes: a system check names
the stale ones and `manage.py hnsw_rebuild` rebuilds them CONCURRENTLY, searches going on."""

from __future__ import annotations

import math

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from memory_app.checks import check_hnsw_parameters
from memory_app.embeddings import indexer
from memory_app.search.semantic import semantic_ranking, vector_literal
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from tests.builders import register_models

MODEL = "rebuild-4"
MESSAGE = indexer.MESSAGE_VECTORS


def vector(i: int) -> list[float]:
    a = i / 40
    return [math.cos(a), math.sin(a), 0.5 * math.cos(3 * a), 0.25]


def index_options() -> dict[str, str]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname, c.reloptions FROM pg_class c"
            " WHERE c.relname LIKE 'embedding\\_hnswi\\_%%'"
            " AND c.relname IN (%s, %s)",
            [indexer.index_name(MODEL, 4), indexer.index_name(MODEL, 4) + "_rebuild"],
        )
        return {name: sorted(options or []) for name, options in cur.fetchall()}


@pytest.fixture
def stored(settings):
    settings.AGENTMEMORY_HNSW_M, settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION = 8, 24
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 50
    indexer._ensured.discard((MODEL, 4))
    register_models(**{MODEL: 4})
    context, _ = context_get_or_create(keys={"test": "hnsw-rebuild"})
    result = messages_append(
        context=context,
        items=[
            {"role": "user", "text": f"t{i}", "vector": vector(i), "vector_model": MODEL}
            for i in range(200)
        ],
    )
    indexer.index_pending()  # a batch this size is deferred: the graph is what is tested here
    yield context, [m.pk for m in result.messages]
    indexer._ensured.discard((MODEL, 4))
    context.delete()
    with connection.cursor() as cur:
        for prefix in indexer.VECTOR_TABLES.values():
            cur.execute(f'DROP INDEX IF EXISTS "{prefix}{indexer.index_name(MODEL, 4)}"')


@pytest.mark.django_db(transaction=True)
def test_a_parameter_change_is_reported_then_rebuilt_concurrently(stored, settings, capsys):
    context, ids = stored
    name = indexer.index_name(MODEL, 4)
    assert index_options() == {name: ["ef_construction=24", "m=8"]}
    # One index per table of vectors: the messages' and the memories'.
    assert sorted(i.table for i in indexer.built_indexes() if i.model == MODEL) == [
        indexer.MESSAGE_VECTORS,
        indexer.MEMORY_VECTORS,
    ]
    [built] = [i for i in indexer.built_indexes() if i.model == MODEL and i.table == MESSAGE]
    assert (built.dimensions, built.m, built.ef_construction, built.stale) == (4, 8, 24, False)
    assert not [w for w in check_hnsw_parameters(None, databases=["default"]) if MODEL in w.msg]

    settings.AGENTMEMORY_HNSW_M, settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION = 12, 40
    warning, of_memories = [
        w for w in check_hnsw_parameters(None, databases=["default"]) if MODEL in w.msg
    ]
    assert "memory vectors" in of_memories.msg and "memory vectors" not in warning.msg
    assert warning.level == checks.WARNING and warning.id == "memory_app.W001"
    assert "m=8, ef_construction=24" in warning.msg and "m=12, ef_construction=40" in warning.msg
    assert "hnsw_rebuild" in warning.hint
    with pytest.raises(CommandError):
        call_command("hnsw_rebuild", "--check", "--model", MODEL)

    call_command("hnsw_rebuild", "--model", MODEL)
    out = capsys.readouterr().out
    assert "to rebuild" in out and "now model 'rebuild-4' (4-d): m=12, ef_construction=40" in out
    assert "now model 'rebuild-4' (4-d, memory vectors): m=12, ef_construction=40" in out
    # The new graph carries the model's own index name; no leftover.
    assert index_options() == {name: ["ef_construction=40", "m=12"]}
    assert not [w for w in check_hnsw_parameters(None, databases=["default"]) if MODEL in w.msg]
    call_command("hnsw_rebuild", "--check", "--model", MODEL)

    # Searches walk the rebuilt index and still answer exactly k.
    hits, path = semantic_ranking(
        context_id=context.pk, model=MODEL, vector=vector(77), limit=3, context_size=200
    )
    assert path == "hnsw" and hits[0][0] == ids[77] and len(hits) == 3
    with transaction.atomic(), connection.cursor() as cur:
        literal = vector_literal(vector(77))
        cur.execute("SET LOCAL enable_seqscan = off")  # a 200-row table: the index if usable
        cur.execute("SET LOCAL enable_sort = off")  # as searches do: the walk, not a sort
        cur.execute(
            "EXPLAIN SELECT id FROM memory_app_embedding e"
            " WHERE e.model = %s AND e.dimensions = 4 AND e.indexed"
            " ORDER BY e.vector::halfvec(4) <=> %s::halfvec(4) LIMIT 3",
            [MODEL, literal],
        )
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert name in plan


@pytest.mark.django_db(transaction=True)
def test_an_interrupted_rebuild_is_cleaned_up_and_a_busy_one_refused(stored, settings):
    name = indexer.index_name(MODEL, 4)
    [built] = [i for i in indexer.built_indexes() if i.model == MODEL and i.table == MESSAGE]
    # What a rebuild killed after its build leaves: a second index under the temporary name.
    with connection.cursor() as cur:
        cur.execute(
            f'CREATE INDEX "{name}_rebuild" ON memory_app_embedding USING hnsw '
            f"((vector::halfvec(4)) halfvec_cosine_ops) WHERE model = '{MODEL}' AND dimensions = 4"
        )
    assert [i.name for i in indexer.built_indexes() if i.model == MODEL] == [name, f"memory{name}"]
    settings.AGENTMEMORY_HNSW_M = 10
    rebuilt = indexer.rebuild_model_index(built)
    assert (rebuilt.name, rebuilt.m) == (name, 10)
    assert list(index_options()) == [name]

    # Another session holding the model's build lock: the rebuild is refused, nothing dropped.
    from django.db import connections

    other = connections.create_connection("default")
    try:
        with other.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(hashtext(%s))", [name])
        with pytest.raises(CommandError, match="being built by another session"):
            call_command("hnsw_rebuild", "--all", "--model", MODEL)
        assert list(index_options()) == [name]
    finally:
        other.close()
