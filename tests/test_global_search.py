"""Search everything: messages, step outputs, errors and tool calls of every visible context,
through the query, the Agent API, the MCP tool and the dashboard page."""

from __future__ import annotations

import itertools

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from memory_app import scale_out
from memory_app.bench.fleet import QUERIES
from memory_app.models import Context, RunSearch, Step, ToolCall
from memory_app.queries import search_all as sa
from memory_app.queries.search_all import SearchFilters, search_all
from tests.api_helpers import make_key
from tests.builders import (
    add_messages,
    load_fleet,
    make_context,
    make_run,
    make_user,
    plan_nodes,
)

pytestmark = pytest.mark.django_db


def _search(q: str, **kw):
    return search_all(filters=SearchFilters(q=q, **{k: v for k, v in kw.items() if k != "ctx"}))


@pytest.fixture
def store():
    """Two tenants; each has a message and a run whose step output, error and tool call hold
    its own word."""
    out = {}
    for tenant, word in (("acme", "zanzibar"), ("globex", "quokka")):
        context = make_context(keys={"tenant": tenant, "chat": "1"}, title=f"{tenant} chat")
        add_messages(context=context, count=1, text=f"the user asked about {word} today")
        run = make_run(
            context=context,
            steps=3,
            error_at=(3,),
            task=f"research {word}",
        )
        Step.objects.filter(run=run, position=3, context_id=run.context_id).update(
            error_message=f"{word} service unavailable"
        )
        # Step 2's output and tool call carry the word too.
        step = Step.objects.get(run=run, position=2)
        Step.objects.filter(pk=step.pk, context_id=run.context_id).update(
            observations=f"found three {word} facts"
        )
        ToolCall.objects.filter(step=step, context_id=run.context_id).update(
            arguments={"query": f"{word} <b>bold</b>"}
        )
        out[tenant] = (context, run, word)
    return out


def test_every_kind_is_found_grouped_by_context_and_run(store):
    context, run, word = store["acme"]
    page = _search(word)
    kinds = sorted(h.kind for h in page.hits)
    assert kinds == ["error", "message", "output", "tool"]
    assert {h.context_id for h in page.hits} == {context.pk}
    (group,) = page.groups
    assert group.context.pk == context.pk
    # Messages of no run come first, then the run's hits.
    assert [g.run.pk if g.run else None for g in group.runs] == [None, run.pk]
    by_kind = {h.kind: h for h in page.hits}
    assert by_kind["output"].step_position == 2
    assert by_kind["error"].step_position == 3
    assert by_kind["tool"].tool_name == "get_weather"
    assert by_kind["message"].message_seq == 1
    for hit in page.hits:
        assert any(marked and text.lower().startswith(word) for text, marked in hit.parts)
        start, end = hit.highlights[0]
        assert hit.snippet[start:end].lower().startswith(word)


def test_kinds_filter_and_keys_filter(store):
    _, _, word = store["acme"]
    assert {h.kind for h in _search(word, kinds=["error"]).hits} == {"error"}
    assert _search(word, keys=[("tenant", "globex")]).hits == []
    assert len(_search(word, keys=[("tenant", "acme")]).hits) == 4


def test_a_pruned_step_is_left_out_and_a_restored_one_found_again(store):
    _, run, word = store["acme"]
    step = Step.objects.get(run=run, position=3)
    Step.objects.filter(pk=step.pk, context_id=run.context_id).update(pruned_at=timezone.now())
    assert "error" not in {h.kind for h in _search(word).hits}
    Step.objects.filter(pk=step.pk, context_id=run.context_id).update(pruned_at=None)
    assert "error" in {h.kind for h in _search(word).hits}


def test_the_triggers_keep_vectors_in_step_with_edits_and_deletes(store):
    _, run, word = store["acme"]
    step = Step.objects.get(run=run, position=2)
    Step.objects.filter(pk=step.pk, context_id=run.context_id).update(observations="nothing")
    kinds = {h.kind for h in _search(word).hits}
    # The step's output no longer holds the word (its model output still says "tool").
    assert "output" not in kinds and "tool" in kinds
    tool = ToolCall.objects.get(step=step, context_id=run.context_id)
    tool.delete()
    assert "tool" not in {h.kind for h in _search(word).hits}
    assert not RunSearch.objects.filter(context_id=run.context_id, kind="tool", ref_id=tool.pk)
    run.delete()
    assert not RunSearch.objects.filter(context_id=run.context_id).exists()


def test_pages_cut_the_ranked_merge_without_repeats(store):
    context, _, _ = store["acme"]
    make_run(context=context, steps=30, task="many", observations="the lemur sleeps")
    first = search_all(filters=SearchFilters(q="lemur"), limit=10)
    assert len(first.hits) == 10 and first.next_cursor
    second = search_all(filters=SearchFilters(q="lemur"), limit=10, cursor=first.next_cursor)
    third = search_all(filters=SearchFilters(q="lemur"), limit=10, cursor=second.next_cursor)
    ids = [h.ref_id for p in (first, second, third) for h in p.hits]
    assert len(ids) == len(set(ids)) == 29
    assert third.next_cursor is None
    ranks = [h.rank for p in (first, second, third) for h in p.hits]
    assert ranks == sorted(ranks, reverse=True)


def test_the_bound_per_kind_is_said(store, monkeypatch):
    context, _, _ = store["acme"]
    make_run(context=context, steps=8, task="many", observations="the lemur sleeps")
    monkeypatch.setattr(sa, "CANDIDATES", 5)
    page = _search("lemur")
    assert page.capped == ["output"]
    assert sum(h.kind == "output" for h in page.hits) == 5


@pytest.mark.parametrize("q", ["", "   ", "x" * 501])
def test_a_bad_query_is_refused(q):
    with pytest.raises(sa.BadQuery):
        SearchFilters(q=q)


def test_stop_words_alone_find_nothing(store):
    page = _search("the and of")
    assert page.hits == [] and page.next_cursor is None


def test_highlight_marks_in_agent_text_do_not_fake_a_highlight(store):
    context, _, _ = store["acme"]
    add_messages(context=context, count=1, text="\x02fake\x03 wombat")
    (hit,) = _search("wombat").hits
    assert [text for text, marked in hit.parts if marked] == ["wombat"]
    assert hit.snippet == "\x02fake\x03 wombat"


def test_existing_steps_are_backfilled_by_the_migration_sql(store):
    """The migration's backfill gives the rows the triggers give."""
    import importlib

    migration = importlib.import_module("memory_app.migrations.0035_run_search_table")
    before = set(RunSearch.objects.values_list("context_id", "kind", "ref_id", "run_id", "step_id"))
    # The last INSERT of the migration is the backfill.
    sql = (
        "INSERT INTO memory_app_runsearch"
        + migration.FORWARD_SQL.rsplit("INSERT INTO memory_app_runsearch", 1)[1]
    )
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM memory_app_runsearch")
        cursor.execute(sql)
    after = set(RunSearch.objects.values_list("context_id", "kind", "ref_id", "run_id", "step_id"))
    assert after == before and len(before) > 4


# --- the Agent API ------------------------------------------------------------------------------


def test_the_api_finds_every_kind_with_links_and_offsets(store):
    context, run, word = store["acme"]
    api = make_key(scopes=["read"])
    response = api.get("/api/v1/search", {"q": word})
    assert response.status_code == 200, response.content
    body = response.json()
    items = body["items"]
    assert sorted(i["kind"] for i in items) == ["error", "message", "output", "tool"]
    assert body["has_more"] is False and body["capped"] == []
    for item in items:
        start, end = item["highlights"][0]
        assert item["snippet"][start:end].lower() == word
        assert item["context_keys"] == {"tenant": "acme", "chat": "1"}
        # The path answers, with the hit's message or step.
        got = api.get(item["path"])
        assert got.status_code == 200, item["path"]
        assert got.json()["id"] == (item["message_id"] or item["step_id"])
    tool = next(i for i in items if i["kind"] == "tool")
    assert tool["tool_name"] == "get_weather" and tool["run_id"] == run.pk
    # The arguments come back as the agent wrote them: text, not markup.
    assert "<b>bold</b>" in tool["snippet"]
    assert tool["dashboard_path"] == f"/runs/{run.pk}/steps/2/#step-2"


def test_a_confined_key_never_sees_another_tenants_hits(store):
    _, _, acme_word = store["acme"]
    _, _, globex_word = store["globex"]
    acme = make_key(scopes=["read"], context_keys={"tenant": "acme"})
    assert acme.get("/api/v1/search", {"q": globex_word}).json()["items"] == []
    assert acme.get("/api/v1/search", {"q": f"{acme_word} or {globex_word}"}).json()["items"]
    found = acme.get("/api/v1/search", {"q": f"{acme_word} or {globex_word}"}).json()["items"]
    assert {i["context_keys"]["tenant"] for i in found} == {"acme"}
    # A keys filter cannot widen the confinement.
    wide = acme.get("/api/v1/search", {"q": globex_word, "keys": '{"tenant": "globex"}'})
    assert wide.status_code == 200 and wide.json()["items"] == []
    everyone = make_key(scopes=["read"])
    found = everyone.get("/api/v1/search", {"q": f"{acme_word} or {globex_word}"}).json()
    assert {i["context_keys"]["tenant"] for i in found["items"]} == {"acme", "globex"}


def test_the_api_pages_with_its_cursor(store):
    context, _, _ = store["acme"]
    make_run(context=context, steps=6, task="many", observations="the lemur sleeps")
    api = make_key(scopes=["read"])
    first = api.get("/api/v1/search", {"q": "lemur", "limit": 3}).json()
    assert len(first["items"]) == 3 and first["has_more"]
    rest = api.get(
        "/api/v1/search", {"q": "lemur", "limit": 3, "cursor": first["next_cursor"]}
    ).json()
    assert len(rest["items"]) == 2 and not rest["has_more"]
    seen = {i["step_id"] for i in first["items"] + rest["items"]}
    assert len(seen) == 5


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"q": ""},
        {"q": "x" * 501},
        {"q": "a", "kind": "nope"},
        {"q": "a", "keys": "[1]"},
        {"q": "a", "cursor": "!!"},
        {"q": "a", "limit": 0},
    ],
)
def test_the_api_refuses_bad_parameters(params):
    api = make_key(scopes=["read"])
    assert api.get("/api/v1/search", params).status_code == 422


def test_the_api_needs_the_read_scope(store):
    writer = make_key(scopes=["write"])
    assert writer.get("/api/v1/search", {"q": "zanzibar"}).status_code == 403


# --- the dashboard ------------------------------------------------------------------------------


def _viewer() -> Client:
    client = Client()
    client.force_login(make_user(role="viewer"))
    return client


def test_the_page_groups_hits_and_escapes_agent_text(store):
    context, run, word = store["acme"]
    web = _viewer()
    html = web.get(reverse("search"), {"q": word}).content.decode()
    assert f'href="/runs/{run.pk}/steps/2/#step-2"' in html
    assert f'href="/contexts/{context.pk}/?seq=1#m-1"' in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html
    assert f"<mark>{word}</mark>" in html.lower()
    assert html.count('class="search-group"') == 1
    assert "acme chat" in html and "globex chat" not in html


def test_the_page_keeps_its_filters_in_the_url_and_has_an_empty_state(store):
    _, _, word = store["acme"]
    web = _viewer()
    empty = web.get(reverse("search")).content.decode()
    assert "Search the messages, step outputs" in empty
    none = web.get(reverse("search"), {"q": "nonexistentword"}).content.decode()
    assert "Nothing matches" in none
    only = web.get(reverse("search"), {"q": word, "kind": "error", "key": "tenant=acme"})
    html = only.content.decode()
    assert html.count('class="hit ') == 1 and "kind-error" in html
    assert 'value="error" checked' in html
    response = web.get(reverse("search"), {"q": word, "add": "tenant=acme"}, HTTP_HX_REQUEST="true")
    assert response["HX-Push-Url"].endswith(f"?q={word}&key=tenant%3Dacme")
    assert web.get(reverse("search"), {"q": word, "cursor": "!!"}).status_code == 400
    assert web.get(reverse("search"), {"q": word, "kind": "nope"}).status_code == 400


def test_the_page_needs_the_view_role(store):
    client = Client()
    client.force_login(make_user(role=None))
    assert client.get(reverse("search"), {"q": "zanzibar"}).status_code == 403


# --- MCP -----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_mcp_tool_searches_within_the_keys_confinement(asgi_live_server):
    from tests.test_mcp import Session, _secret

    for tenant in ("acme", "globex"):
        context = make_context(keys={"tenant": tenant})
        make_run(context=context, steps=2, task="t", observations=f"{tenant} narwhal sighting")
    acme = Session(asgi_live_server, _secret(scopes=["read"], context_keys={"tenant": "acme"}))
    found = acme.ok("search_everything", query="narwhal")
    assert [i["context_keys"] for i in found["items"]] == [{"tenant": "acme"}]
    assert found["items"][0]["kind"] == "output"
    both = Session(asgi_live_server, _secret(scopes=["read"]))
    assert len(both.ok("search_everything", query="narwhal", kinds=["output"])["items"]) == 2
    assert both.ok("search_everything", query="narwhal", kinds=["error"])["items"] == []
    assert "'read' scope" in Session(asgi_live_server, _secret(scopes=["write"])).error(
        "search_everything", query="narwhal"
    )
    assert "cursor" in both.error("search_everything", query="narwhal", cursor="!!")


# The tables whose reads must stay on an index at any size (a scan of one is seconds at a
# million rows: the benchmark's fleet area measures that size).
SCANNED = {
    "memory_app_message",
    "memory_app_messagesearch",
    "memory_app_runsearch",
    "memory_app_step",
    "memory_app_toolcall",
}


def _reads(fn) -> tuple[object, list[tuple[str, list[str]]]]:
    """What `fn` returns, and each statement it sent that reads the searched tables, with the
    SET LOCAL settings it ran under."""
    with CaptureQueriesContext(connection) as queries:
        result = fn()
    reads, settings = [], []
    for query in queries.captured_queries:
        sql = query["sql"]
        if sql.startswith("SET LOCAL"):
            settings.append(sql)
        elif sql.startswith(("RELEASE", "COMMIT", "ROLLBACK")):
            settings = []
        elif (
            "pg_class" not in sql
            and not sql.lstrip().startswith("EXPLAIN")
            and any(t in sql for t in SCANNED)
        ):
            reads.append((sql, list(settings)))
    return result, reads


def _single_node() -> None:
    """The plans checked are the single node's: a Citus coordinator plans a distributed scan
    for the shards, and the search walks nothing there (no statistics of the shards' rows)."""
    with connection.cursor() as cursor:
        if scale_out.is_distributed(cursor, "memory_app_messagesearch"):
            pytest.skip("the single node's plans")


@pytest.fixture
def fleet():
    """3,000 messages and 150 runs of 10 steps with a tool call each, over 10 contexts, by the
    benchmark's SQL (`memory_app.bench.fleet_data`): every message says "report", a topic word
    is in 2.5 % of the rows, a code in one message."""
    return load_fleet(runs=150, steps_per_run=10, messages=3000, contexts=10)


# The benchmark's searches (`memory_app.bench.fleet.QUERIES`), with a code of this smaller store.
SHAPES = [q if q != "code4242" else "code42" for q, _ in QUERIES]


def test_every_read_stays_on_an_index(fleet):
    _single_node()
    within = Context.objects.filter(keys__contains={"tenant": "t3"})
    allowed = set(within.values_list("pk", flat=True))
    for q, contexts in itertools.product(SHAPES, (None, within)):
        page, reads = _reads(
            lambda q=q, c=contexts: search_all(filters=SearchFilters(q=q), contexts=c)
        )
        assert reads, q
        for sql, settings in reads:
            scans = [n for n in plan_nodes(sql, settings) if n.get("Relation Name") in SCANNED]
            assert scans, sql
            assert not [n for n in scans if n["Node Type"] == "Seq Scan"], sql
        if contexts is None:
            assert bool(page.hits) == (q != "nothingmatchesthis"), q
        else:
            assert {h.context_id for h in page.hits} <= allowed, q


def test_a_word_in_every_message_is_walked_newest_first_within_the_reader_contexts(fleet):
    _single_node()
    within = Context.objects.filter(keys__contains={"tenant": "t3"})
    allowed = set(within.values_list("pk", flat=True))
    for contexts in (None, within):
        page, reads = _reads(
            lambda c=contexts: search_all(filters=SearchFilters(q="report"), contexts=c)
        )
        # Walked on the vectors' primary key, context by context: no GIN bitmap of every message.
        (walk,) = [sql for sql, _ in reads if "LATERAL" in sql]
        assert "message_search_gin" not in str(plan_nodes(walk, ["SET LOCAL enable_seqscan = off"]))
        assert page.capped == ["message"] and {h.kind for h in page.hits} == {"message"}
        assert len(page.hits) == sa.PAGE_SIZE
        if contexts is not None:
            assert {h.context_id for h in page.hits} <= allowed
        # The newest messages of the contexts walked.
        last = dict(Context.objects.values_list("pk", "last_seq"))
        assert all(h.message_seq > last[h.context_id] - sa.CANDIDATES for h in page.hits)
    # A word of a few rows is read through the index, every match found.
    page, reads = _reads(lambda: search_all(filters=SearchFilters(q="code42")))
    assert not [sql for sql, _ in reads if "LATERAL" in sql]
    assert [h.kind for h in page.hits] == ["message"] and not page.capped


def test_a_walk_that_meets_too_few_matches_reads_the_index(fleet, monkeypatch):
    # Two rows walked per context meet fewer than CANDIDATES matches: the index finds them all.
    monkeypatch.setattr(sa, "WALK_ROWS", 2)
    walked = search_all(filters=SearchFilters(q="report"), limit=50)
    monkeypatch.setattr(sa, "WALK_SHARE", 2.0)  # never walk
    indexed = search_all(filters=SearchFilters(q="report"), limit=50)
    assert [(h.kind, h.ref_id) for h in walked.hits] == [(h.kind, h.ref_id) for h in indexed.hits]
    assert walked.capped == indexed.capped == ["message"]
