"""Keyword search ranks a bounded set of candidates, and the big-context reads go through indexes.

An any-word query can match a fifth of a million-message context, and ranking every
match read every matching row; composite's system-message lookup walked the context back to its
first message. Here the reads are checked on their plans (EXPLAIN ANALYZE on a context of a few
thousand rows): no sequential scan, and the rows they touch do not grow with the context.
A natural-language query in `auto` mode ranks any-word matches (the dashboard's
playground found nothing for "weather in Kyoto" when no message held both words).
"""

from __future__ import annotations

import json
import math

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from memory_app import pipelines, selectors
from memory_app.models import Message
from memory_app.models.shared import PENDING_LIST_KB
from memory_app.search import bm25, fulltext
from memory_app.search import keyword as message_search
from memory_app.search.keyword import keyword_ranking
from memory_app.search.messages import search_messages
from memory_app.services.messages import messages_append
from tests.bm25_truth import bm25_truth, split
from tests.builders import analyse, make_context, make_user, prepared_plans

pytestmark = pytest.mark.django_db

KYOTO = [
    ("user", "Lunch plans for the team"),
    ("assistant", "Kyoto temples are quiet at dawn"),
    ("user", "The weather in Kyoto is mild today, and the weather will hold"),
    ("assistant", "Severe weather alerts for the coast"),
    ("user", "Nothing to add"),
]


@pytest.fixture
def kyoto(settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    context = make_context()
    result = messages_append(context=context, items=[{"role": r, "text": t} for r, t in KYOTO])
    context.refresh_from_db()
    return context, [m.pk for m in result.messages]


def test_auto_without_vectors_ranks_any_word_matches(kyoto):
    context, ids = kyoto
    result = search_messages(context=context, query="weather in Kyoto", k=5, mode="auto")
    assert result.mode == "keyword"
    # Both words first; then the one-word matches, the two-"weather" message above "Kyoto" once.
    assert [h.message.pk for h in result.hits] == [ids[2], ids[3], ids[1]]
    # Keyword mode ranks the same way (BM25: equal IDFs here, equal lengths, newest first).
    keyword = search_messages(context=context, query="weather in Kyoto", k=5, mode="keyword")
    assert [h.message.pk for h in keyword.hits] == [ids[2], ids[3], ids[1]]
    truth = bm25_truth(context, **split("weather Kyoto"))
    assert [h.score for h in keyword.hits] == pytest.approx([score for _, score in truth])
    # Every word asked for, the query reads as a web search.
    strict = search_messages(
        context=context, query="weather in Kyoto", k=5, mode="keyword", match="all"
    )
    assert [h.message.pk for h in strict.hits] == [ids[2]]
    # "Phrases" and -exclusions as websearch syntax writes them, any word matching.
    phrase = search_messages(context=context, query='"kyoto temples" coast', k=5, mode="keyword")
    assert [h.message.pk for h in phrase.hits] == [ids[3], ids[1]]
    excluded = search_messages(context=context, query="weather kyoto -mild", k=5, mode="keyword")
    assert [h.message.pk for h in excluded.hits] == [ids[3], ids[1]]


def test_playground_search_for_weather_in_kyoto_ranks_any_word_matches(kyoto):
    context, ids = kyoto
    client = Client()
    client.force_login(make_user(role="viewer"))
    response = client.get(
        reverse("playground", args=[context.pk]),
        {"selector": "search", "query": "weather in Kyoto", "k": "5", "mode": "auto"},
    )
    assert response.status_code == 200
    [side] = response.context["sides"]
    assert not side.error
    items = side.selection.items
    assert sorted(i.message.pk for i in items) == sorted([ids[1], ids[2], ids[3]])
    assert next(i for i in items if i.message.pk == ids[2]).reason.startswith("search: rank 1 ")
    assert "Kyoto temples" in response.content.decode()
    # The same body through the API gives the same messages (the playground's "Copy curl").
    body = json.loads(side.snippets["curl"].split("-d ", 1)[1].strip("'"))
    spec = selectors.SearchSpec(query=body["query"], k=body["k"], mode=body["mode"])
    assert selectors.select(context=context, spec=spec).ids == side.selection.ids


# --- the bounded candidate set -----------------------------------------------------------------


def test_keyword_ranks_the_newest_matches_when_more_match_than_the_candidates(
    settings, monkeypatch
):
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 20
    monkeypatch.setattr(message_search, "KEYWORD_RECENT_SEQS", 8)
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)  # ranked as a large one
    context = make_context()
    # The oldest message is the best match (four times "alpha"); 60 newer ones hold it once or
    # twice, every third not at all.
    items = [{"role": "user", "text": "alpha alpha alpha alpha"}]
    for i in range(90):
        items.append(
            {"role": "user", "text": "filler words" if i % 3 == 2 else "alpha " * (1 + i % 2) + "x"}
        )
    messages = messages_append(context=context, items=items).messages
    context.refresh_from_db()
    matching = [m for m in messages if "alpha" in m.text]
    hits = keyword_ranking(
        context_id=context.pk, query="alpha", limit=10, last_seq=context.last_seq
    )
    # "alpha" is in 5 of the newest 8 messages: a common word, whose candidates are fewer than
    # the cap (its weight is low), read by walking back.
    plan = bm25.plan_term(
        window_matches=5,
        window=8,
        n=len(messages),
        last_seq=context.last_seq,
        cap=20,
        limit=10,
        budget=message_search.KEYWORD_TERM_ROWS,
    )
    assert plan == bm25.TermPlan(10, False)
    # The newest matches, by term frequency (their lengths are equal), newest first.
    newest = sorted(matching[-plan.need :], key=lambda m: (-m.text.count("alpha"), -m.seq))
    assert [h for h, _ in hits] == [m.pk for m in newest[:10]]
    assert messages[0].pk not in [h for h, _ in hits]
    # With room for every match the oldest (and best) one leads: small contexts rank exactly.
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 1000
    hits = keyword_ranking(context_id=context.pk, query="alpha", limit=10)
    assert hits[0][0] == messages[0].pk
    expected = bm25_truth(context, words=["alpha"])[:10]
    assert [h for h, _ in hits] == [mid for mid, _ in expected]
    assert [s for _, s in hits] == pytest.approx([s for _, s in expected])


def test_a_frequent_term_s_document_frequency_is_estimated_from_its_newest_matches(
    settings, monkeypatch
):
    """Above the cap a term's df is its newest matches' density over the context: 5 matches
    reaching back over seqs 84..100 of 100 messages make about 29.4 (every fourth holds it)."""
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 5
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)  # ranked as a large one
    context = make_context()
    items = [
        {"role": "user", "text": f"alpha {i}" if i % 4 == 0 else f"filler {i}"}
        for i in range(1, 101)
    ]
    messages = messages_append(context=context, items=items).messages
    context.refresh_from_db()
    hits = search_messages(context=context, query="alpha", k=5, mode="keyword").hits
    assert [h.message.pk for h in hits] == [messages[i - 1].pk for i in (100, 96, 92, 88, 84)]
    df = 5 * 100 / 17
    # Every candidate holds it once and has the same length: its score is the term's IDF.
    idf = math.log(1 + (100 - df + 0.5) / (df + 0.5))
    assert [h.score for h in hits] == pytest.approx([idf] * 5)
    # With room for every match the count is exact, as the truth counts it.
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 100
    hits = keyword_ranking(context_id=context.pk, query="alpha", limit=5)
    assert [s for _, s in hits] == pytest.approx(
        [s for _, s in bm25_truth(context, words=["alpha"])[:5]]
    )
    assert hits[0][1] == pytest.approx(math.log(1 + (100 - 25 + 0.5) / 25.5))


@pytest.mark.django_db
def test_term_parts_equal_rank_bm25_on_the_same_counts(settings):
    """Okapi BM25 with Lucene's IDF: rank-bm25 differs in its IDF and in a document's length
    (its tokens; ours its distinct lexemes), so the term part is compared with it on texts
    whose words are all distinct, where both terms have the same IDF."""
    from rank_bm25 import BM25Okapi

    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 100
    corpus = [
        ["alpha", "bravo"],
        ["alpha", "charli", "delta"],
        ["bravo", "charli", "echo", "golf", "hotel"],
    ]
    context = make_context()
    messages = messages_append(
        context=context, items=[{"role": "user", "text": " ".join(doc)} for doc in corpus]
    ).messages
    hits = dict(keyword_ranking(context_id=context.pk, query="bravo charli", limit=5))
    okapi = BM25Okapi(corpus, k1=bm25.K1, b=bm25.B)
    # The candidates are the messages holding a term: every one here, so the lengths agree.
    idf = math.log(1 + (3 - 2 + 0.5) / 2.5)
    expected = okapi.get_scores(["bravo", "charli"]) / okapi.idf["bravo"] * idf
    assert [hits[m.pk] for m in messages] == pytest.approx(list(expected))


def test_a_term_rare_in_the_latest_seqs_is_read_whole_through_the_gin_index(settings, monkeypatch):
    """Two "kyoto" among the latest 50 seqs of 300 messages: reading its few matches through
    the GIN index costs less than walking back for them, so every match is read and the ranking
    is BM25's over the whole context."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 100
    monkeypatch.setattr(message_search, "KEYWORD_RECENT_SEQS", 50)
    context = make_context()
    items = [
        {"role": "user", "text": f"kyoto trip day {i}" if i % 30 == 0 else f"note {i}"}
        for i in range(1, 301)
    ]
    messages_append(context=context, items=items)
    fulltext.index_pending()
    with connection.cursor() as cur:
        cur.execute("SELECT gin_clean_pending_list('message_search_gin'::regclass)")
    analyse("message", "messagesearch")
    context.refresh_from_db()
    plan = bm25.plan_term(
        window_matches=2, window=50, n=300, last_seq=300, cap=100, limit=10, budget=10_000
    )
    assert plan.gin
    hits = keyword_ranking(context_id=context.pk, query="kyoto", limit=10)
    truth = bm25_truth(context, words=["kyoto"])
    assert len(truth) == 10
    assert [h for h, _ in hits] == [mid for mid, _ in truth]
    assert [s for _, s in hits] == pytest.approx([s for _, s in truth])


def test_a_rare_old_match_is_found_by_widening_the_window(settings, monkeypatch):
    monkeypatch.setattr(message_search, "KEYWORD_RECENT_SEQS", 4)
    context = make_context()
    items = [{"role": "user", "text": "the one about Kyoto"}] + [
        {"role": "assistant", "text": f"reply number {i}"} for i in range(200)
    ]
    first = messages_append(context=context, items=items).messages[0]
    context.refresh_from_db()
    result = search_messages(context=context, query="Kyoto trip", k=3, mode="auto")
    assert [h.message.pk for h in result.hits] == [first.pk]


def test_a_context_grown_past_the_size_known_is_ranked_the_bounded_way(kyoto, monkeypatch):
    """A request sizes the keyword search from the context's size as it last saw it; when the
    context has since outgrown the exact ranking, its statement reads nothing and says so, and
    the search ranks the bounded way, from the counters read then."""
    context, _ = kyoto
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", len(KYOTO) - 1)
    bounded = keyword_ranking(context_id=context.pk, query="weather in Kyoto", limit=5)
    with CaptureQueriesContext(connection) as queries:
        stale = keyword_ranking(
            context_id=context.pk, query="weather in Kyoto", limit=5, message_count=2
        )
    assert stale == bounded and len(stale) == 3
    statements = [q["sql"] for q in queries.captured_queries]
    exact = [s for s in statements if "AS fits" in s]
    assert len(exact) == 1 and statements.index(exact[0]) == 0, statements
    # Its hits read nothing: the exact statement's plan touched no message or vector row.
    params = dict(
        message_search.query_parts("weather in Kyoto"),
        context=context.pk,
        exclude=[],
        limit=5,
        strict=False,
        exact=len(KYOTO) - 1,
        scan=True,
        max_terms=12,
    )
    scans = _message_scans(exact[0], params)
    assert sum(_touched(n) for n in scans) == 0, [
        (n["Node Type"], n.get("Relation Name"), _touched(n)) for n in scans
    ]
    # Still small: the same statement ranks it.
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", len(KYOTO))
    with CaptureQueriesContext(connection) as queries:
        small = keyword_ranking(
            context_id=context.pk, query="weather in Kyoto", limit=5, message_count=2
        )
    assert small == bounded and len(queries.captured_queries) == 1


def test_a_phrase_beside_a_word_is_ranked_the_bounded_way_as_exactly(kyoto, monkeypatch):
    """A query holding a phrase of several words and a single word: its terms' lexemes are
    lists of different lengths (the parse once failed to gather them into one array). With
    room for every match, the bounded ranking counts what the exact one counts."""
    context, ids = kyoto
    query = '"weather in Kyoto" temples'
    exact = keyword_ranking(context_id=context.pk, query=query, limit=5)
    assert [mid for mid, _ in exact] == [ids[1], ids[2]]
    terms = message_search.parse_query(query).terms
    assert [t.lexemes for t in terms] == [("templ",), ("weather", "kyoto")]
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)  # ranked as a large one
    bounded = keyword_ranking(context_id=context.pk, query=query, limit=5)
    assert [mid for mid, _ in bounded] == [mid for mid, _ in exact]
    assert [s for _, s in bounded] == pytest.approx([s for _, s in exact])


def test_a_query_of_stop_words_only_matches_nothing_without_reading(kyoto):
    context, _ = kyoto
    for query in ("in the of", "- ! ,", '"the of" -in'):
        reads = _reads_of(lambda q=query: keyword_ranking(context_id=context.pk, query=q, limit=5))
        for statement in reads:
            assert sum(_touched(n) for n in _message_scans(*statement)) == 0, statement
    # Nothing to match at all: no statement.
    assert _reads_of(lambda: keyword_ranking(context_id=context.pk, query="-x", limit=5)) == []
    assert keyword_ranking(context_id=context.pk, query="in the of", limit=5) == []


# --- plans on a context of a few thousand rows ------------------------------------------------


def _plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def _analysed_nodes(sql: str, params=None, *, buffers: bool = False) -> list[dict]:
    """Every node of EXPLAIN ANALYZE (with BUFFERS: the pages each read) for `sql` and its
    `params` (a statement as executed)."""
    options = "ANALYZE, BUFFERS, FORMAT JSON" if buffers else "ANALYZE, FORMAT JSON"
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN ({options}) " + sql, params)
        plan = cur.fetchone()[0]
    plan = plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"]
    return list(_plan_nodes(plan))


def _message_scans(sql: str, params=None) -> list[dict]:
    """The nodes of EXPLAIN ANALYZE reading memory_app_message, or the full-text vectors beside
    it (memory_app_messagesearch), for `sql` and its `params` (a statement as executed)."""
    tables = ("memory_app_message", "memory_app_messagesearch")
    return [n for n in _analysed_nodes(sql, params) if n.get("Relation Name") in tables]


def _touched(node: dict) -> int:
    """Heap rows a scan node read: those it returned and those its filters threw away."""
    return (
        node.get("Actual Rows", 0)
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
    )


@pytest.fixture
def big_context(settings):
    """One context of 4,000 messages (a system prompt first, user / assistant after it) among
    smaller ones, analysed: every third message holds "alpha", every 40th "kyoto"."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    for _ in range(8):
        other = make_context()
        messages_append(
            context=other,
            items=[{"role": "user", "text": f"alpha other {i}"} for i in range(250)],
        )
    context = make_context()
    items = [{"role": "system", "text": "You are a helpful assistant."}]
    for i in range(1, 4000):
        words = ["note", str(i)]
        if i % 3 == 0:
            words.append("alpha")
        if i % 40 == 0:
            words.append("kyoto")
        items.append({"role": "user" if i % 2 else "assistant", "text": " ".join(words)})
    for start in range(0, len(items), 1000):
        messages_append(context=context, items=items[start : start + 1000])
    # The last user message: a long natural-language prompt whose words match most messages.
    messages_append(
        context=context,
        items=[{"role": "user", "text": "any note about alpha or kyoto, please"}],
    )
    # As the indexer would have by now: the batches' full-text vectors written.
    fulltext.index_pending()
    with connection.cursor() as cur:
        # As autovacuum would have by now: new entries merged from the GIN pending list (the
        # planner prices a long pending list, which holds the whole table here).
        cur.execute("SELECT gin_clean_pending_list('message_search_gin'::regclass)")
    analyse("message", "messagesearch")
    context.refresh_from_db()
    return context


def _reads_of(fn) -> list[tuple[str, object]]:
    """The statements `fn` executed that read messages, each (sql, params) as executed."""
    executed = []

    def record(execute, sql, params, many, context):
        executed.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        fn()
    return [(sql, params) for sql, params in executed if "memory_app_message" in sql]


@pytest.mark.parametrize(
    ("query", "mode"), [("alpha", "keyword"), ("note alpha", "keyword"), ("kyoto weather", "auto")]
)
def test_keyword_reads_use_indexes_and_touch_only_the_candidates(
    big_context, settings, monkeypatch, query, mode
):
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 100
    monkeypatch.setattr(message_search, "KEYWORD_RECENT_SEQS", 400)
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)
    reads = _reads_of(lambda: search_messages(context=big_context, query=query, k=10, mode=mode))
    assert reads
    for sql, params in reads:
        scans = _message_scans(sql, params)
        assert scans and not [n for n in scans if n["Node Type"] == "Seq Scan"], sql
        # Ranking every match read 1,333 rows for "alpha", 4,000 for "note". Now: at most a
        # window's rows (the first window of 400 seqs holds 133 "alpha"), or the few matches
        # of a rare word once the window covers the whole context.
        assert sum(_touched(n) for n in scans) <= 1000, sql


def test_composite_reads_use_indexes_and_do_not_walk_the_context(
    big_context, settings, monkeypatch
):
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 100
    # A tenth of the context, as in a big one (half of it is rightly read in sequence).
    monkeypatch.setattr(message_search, "KEYWORD_RECENT_SEQS", 400)
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)
    spec = selectors.CompositeSpec(search_k=3, search_mode="keyword")
    selection = selectors.select(context=big_context, spec=spec)
    system = Message.objects.get(context=big_context, seq=1)
    assert selection.items[0].message.pk == system.pk
    assert selection.items[-1].message.text.startswith("any note about")
    reads = _reads_of(lambda: selectors.select(context=big_context, spec=spec))
    for sql, params in reads:
        scans = _message_scans(sql, params)
        assert not [n for n in scans if n["Node Type"] == "Seq Scan"], sql
        if "system" in [*(params or ())]:
            # The system message is 4,000 messages back: one index entry, not a walk back to it.
            assert sum(_touched(n) for n in scans) <= 2, sql


def test_a_context_smaller_than_another_reads_only_its_window(big_context, settings, monkeypatch):
    """The planner's statistics on seqs span every context: past the end of a context smaller
    than another, `seq > n` looks like thousands of rows, and the unindexed tail (messages past
    the indexer's mark, none here) was read through a scan of the whole context."""
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 100
    monkeypatch.setattr(message_search, "KEYWORD_RECENT_SEQS", 400)
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)
    small = make_context()
    items = [
        {"role": "user", "text": f"note {i} alpha" if i % 3 else f"note {i}"} for i in range(3000)
    ]
    for start in range(0, len(items), 1000):
        messages_append(context=small, items=items[start : start + 1000])
    fulltext.index_pending()
    analyse("message", "messagesearch")
    small.refresh_from_db()
    assert small.search_seq == small.last_seq == 3000
    # As a store whose larger contexts run to a million seqs: nearly every seq is past 3,000.
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_restore_attribute_stats('schemaname', 'public',"
            " 'relname', 'memory_app_message', 'attname', 'seq', 'inherited', false,"
            " 'histogram_bounds', %s::text)",
            ["{" + ",".join(str(x) for x in [1, *range(10_000, 1_000_001, 10_000)]) + "}"],
        )
    reads = _reads_of(
        lambda: search_messages(context=small, query="kyoto alpha", k=10, mode="keyword")
    )
    assert reads
    for sql, params in reads:
        scans = _message_scans(sql, params)
        assert sum(_touched(n) for n in scans) <= 1000, sql


def test_a_small_context_is_parsed_and_ranked_exactly_in_one_statement(settings):
    """In a context no larger than one term's pass may read, every match is scored with exact
    counts, whatever the candidates' cap: the oldest message, the best match, leads."""
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 5
    context = make_context()
    items = [{"role": "user", "text": "alpha alpha alpha alpha beta"}]
    items += [{"role": "user", "text": f"alpha {i}" if i % 3 else f"beta {i}"} for i in range(300)]
    messages = messages_append(context=context, items=items).messages
    fulltext.index_pending()
    # A batch after the indexer's mark (deferred: its vectors wait), parsed from its text.
    messages += messages_append(
        context=context, items=[{"role": "user", "text": "alpha beta gamma"}] * 70
    ).messages
    context.refresh_from_db()
    with CaptureQueriesContext(connection) as queries:
        hits = keyword_ranking(
            context_id=context.pk,
            query="alpha beta -gamma",
            limit=10,
            last_seq=context.last_seq,
            search_seq=context.search_seq,
            message_count=context.message_count,
        )
    truth = bm25_truth(context, **split("alpha beta -gamma"))[:10]
    assert hits[0][0] == messages[0].pk
    assert [h for h, _ in hits] == [mid for mid, _ in truth]
    assert [s for _, s in hits] == pytest.approx([s for _, s in truth])
    assert context.search_seq < context.last_seq
    # The query parsed and ranked in one statement: no count of the latest seqs to plan passes
    # from, no passes per term.
    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
    assert [
        h
        for h, _ in keyword_ranking(context_id=context.pk, query="alpha beta", limit=2, match="all")
    ] == [messages[0].pk, messages[-1].pk]


def test_a_word_s_term_frequency_is_counted_exactly_up_to_the_positions_a_vector_keeps(settings):
    """A word's tf in a small context's exact ranking is read back from ts_rank: each count of
    1 to 300 occurrences (a vector keeps 256 positions) scores as BM25 over the counted positions
    does, in stored vectors and in messages the indexer has not reached."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    context = make_context()
    texts = [" ".join(["kappa"] * n + [f"w{n}"]) for n in range(1, 301)]
    messages = messages_append(
        context=context, items=[{"role": "user", "text": t} for t in texts[:150]]
    ).messages
    fulltext.index_pending()
    messages += messages_append(
        context=context, items=[{"role": "user", "text": t} for t in texts[150:]]
    ).messages
    context.refresh_from_db()
    assert 0 < context.search_seq < context.last_seq
    hits = dict(keyword_ranking(context_id=context.pk, query="kappa", limit=400))
    truth = dict(bm25_truth(context, words=["kappa"]))
    assert set(hits) == set(truth) == {m.pk for m in messages}
    for message in messages:
        assert hits[message.pk] == pytest.approx(truth[message.pk], rel=1e-12), message.seq


@pytest.mark.django_db(transaction=True)
def test_a_small_context_s_statement_runs_on_one_plan_for_every_call(kyoto):
    """The exact ranking's prepared statement is planned once for any values (its generic
    plan), not again for each call's; the setting that asks for it ends with its round trip.
    (Outside a transaction block: inside one it would last to the block's end, so it is not
    asked for there.)"""
    context, ids = kyoto
    for query in ["weather", "kyoto temples", "weather -coast", "dawn", "lunch team"]:
        keyword_ranking(context_id=context.pk, query=query, limit=5)
    plans = [(generic, custom) for _, generic, custom in prepared_plans("%held AS MATERIALIZED%")]
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('plan_cache_mode')")
        assert cursor.fetchone()[0] == "auto"
    assert plans == [(5, 0)]
    # A read deferred into the same round trip (a request's key read) keeps the server's own
    # choice, and a refusal by its check leaves the setting behind no more than an answer does.
    key_read = ("SELECT id FROM memory_app_context WHERE id = %s", [context.pk])
    for _ in range(6):
        with pipelines.deferred_read([key_read], lambda rows: None):
            keyword_ranking(context_id=context.pk, query="weather", limit=5)

    def refuse(rows):
        raise PermissionError("refused")

    with pytest.raises(PermissionError), pipelines.deferred_read([key_read], refuse):
        keyword_ranking(context_id=context.pk, query="weather", limit=5)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            ["SELECT id FROM memory_app_context WHERE id = $1%"],
        )
        assert cursor.fetchone()[0] >= 5
        cursor.execute("SELECT current_setting('plan_cache_mode')")
        assert cursor.fetchone()[0] == "auto"
    assert [h for h, _ in keyword_ranking(context_id=context.pk, query="weather", limit=5)] == [
        ids[2],
        ids[3],
    ]


def test_a_long_query_in_a_small_context_is_ranked_on_every_term_from_its_own_rows(kyoto):
    """A small context's stored vectors are read through its own rows, not the GIN index,
    whose posting lists span every context: on a fresh store's statistics (a full benchmark
    run's) the exact statement's one plan read a long query's lists and kept the context's rows
    from them, far more entries than the context holds (the benchmark's composite rows measure
    it; the test store's statistics do not lead the planner there). Every term of a long query
    is still ranked there, exactly."""
    context, ids = kyoto
    long_query = " ".join(["weather kyoto temples dawn coast lunch team"] * 3)
    hits = keyword_ranking(context_id=context.pk, query=long_query, limit=5)
    truth = bm25_truth(context, words=long_query.split())[:5]
    assert [h for h, _ in hits] == [mid for mid, _ in truth]
    assert [s for _, s in hits] == pytest.approx([s for _, s in truth])
    left = keyword_ranking(context_id=context.pk, query=long_query, limit=5, exclude_ids=[ids[2]])
    assert [h for h, _ in left] == [mid for mid, _ in truth if mid != ids[2]]
    plans = [statement for statement, *_ in prepared_plans("%held AS MATERIALIZED%")]
    assert len(plans) == 2 and all("ts_match_vq(s.search_vector" in p for p in plans)


def _gin_pages_read(sql: str, params, index: str) -> int:
    """Pages of the GIN index `index` the statement reads (shared buffers hit or read)."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
    nodes = _analysed_nodes(sql, params, buffers=True)
    scans = [n for n in nodes if n.get("Index Name") == index]
    assert scans, nodes
    return sum(n["Shared Hit Blocks"] + n["Shared Read Blocks"] for n in scans)


def _index_pages_read(query: str) -> int:
    """Pages of the full-text GIN index a search for `query` reads (`_gin_pages_read`)."""
    sql = "SELECT count(*) FROM memory_app_messagesearch WHERE search_vector @@ %s::tsquery"
    return _gin_pages_read(sql, [query], "message_search_gin")


def test_a_keyword_search_reads_a_bounded_part_of_the_index_however_much_was_written(settings):
    """The entries written since the index last merged its pending list are read by every
    search: kept to 1 MB (128 pages), a search for a word no message holds reads no more than
    that after thousands of messages' vectors were written (at PostgreSQL's 4 MB, nearly 300)."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    context = make_context()
    for batch in range(4):
        items = [
            {"role": "user", "text": " ".join(f"word{batch}x{i}x{j}" for j in range(40))}
            for i in range(500)
        ]
        messages_append(context=context, items=items)
        fulltext.index_pending()
    context.refresh_from_db()
    assert context.search_seq == context.last_seq == 2000
    assert _index_pages_read("nosuchword") <= 140
    assert (
        keyword_ranking(context_id=context.pk, query="word3x499x39", limit=5)[0][0]
        == Message.objects.get(context=context, seq=2000).pk
    )


def test_a_tag_filter_reads_a_bounded_part_of_its_index_however_much_was_written():
    """Every GIN index keeps a pending list of 1 MB (128 pages), which every search reads
    whole: a filter on a tag no message holds reads no more than that after thousands of tags
    were written (at PostgreSQL's 4 MB, several hundred pages)."""
    context = make_context()
    for batch in range(4):
        items = [
            {"role": "user", "text": "x", "tags": [f"t{batch}x{i}x{j}" for j in range(40)]}
            for i in range(500)
        ]
        messages_append(context=context, items=items)
    sql = "SELECT count(*) FROM memory_app_message WHERE tags @> %s::varchar[]"
    assert _gin_pages_read(sql, [["nosuchtag"]], "message_tags_gin") <= 140
    assert Message.objects.filter(context=context, tags__contains=["t3x499x39"]).get().seq == 2000


def test_every_gin_index_keeps_a_small_pending_list():
    """Each GIN index of the schema, those added later included, is made with the 1 MB
    pending list (`models.shared.PENDING_LIST_KB`), not PostgreSQL's 4 MB."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_am a ON a.oid = c.relam"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE a.amname = 'gin' AND n.nspname = current_schema() ORDER BY 1"
        )
        indexes = cursor.fetchall()
    assert len(indexes) >= 13, indexes
    small = f"gin_pending_list_limit={PENDING_LIST_KB}"
    assert [name for name, options in indexes if small not in (options or [])] == []


def test_a_large_context_parses_its_unindexed_messages_once_for_every_term(settings, monkeypatch):
    """Messages past the indexer's mark are parsed in one read that every term's passes share
    (`_NEWEST`), not once per term: each term still finds them, an excluded id is left out,
    and with room for every match the ranking is BM25's."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 1000
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)  # ranked as a large one
    assert message_search.KEYWORD_RECENT_SEQS >= 60  # every message in the latest seqs
    context = make_context()
    items = [
        {"role": "user", "text": f"alpha note {i}" if i % 2 else f"beta gamma beta {i}"}
        for i in range(60)
    ]
    messages = messages_append(context=context, items=items).messages
    context.refresh_from_db()
    assert context.search_seq == 0 < context.last_seq  # a large batch: its vectors wait
    with CaptureQueriesContext(connection) as queries:
        hits = keyword_ranking(context_id=context.pk, query="alpha beta", limit=50)
    ranking = queries.captured_queries[-1]["sql"]
    assert ranking.count("memory_app_search_vector(") == 1, ranking
    truth = bm25_truth(context, words=["alpha", "beta"])[:50]
    assert [h for h, _ in hits] == [mid for mid, _ in truth]
    assert [s for _, s in hits] == pytest.approx([s for _, s in truth])
    excluded = messages[4].pk
    left = keyword_ranking(context_id=context.pk, query="beta", limit=60, exclude_ids=[excluded])
    assert {h for h, _ in left} == {m.pk for m in messages if "beta" in m.text} - {excluded}
    # Exclusions ride in each term's query; `match="all"` reads the strict query's candidates.
    betas = {m.pk for m in messages if "beta" in m.text}
    assert {
        h for h, _ in keyword_ranking(context_id=context.pk, query="beta -note", limit=60)
    } == betas
    assert not keyword_ranking(context_id=context.pk, query="alpha -note", limit=60)
    strict = keyword_ranking(context_id=context.pk, query="gamma beta", limit=60, match="all")
    assert {h for h, _ in strict} == betas


def test_a_long_query_in_a_large_context_is_ranked_on_its_rarest_terms(settings, monkeypatch):
    """A whole message as the query (the composite selector's last user message) holds a
    hundred words, and each term's passes cost the large context's ranking reads of their own
    (the benchmark's composite rows measure it). Past AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS terms it
    is ranked on its phrases and its rarest words among the latest seqs, as BM25 ranks on
    those, the most frequent words (the lowest weighed) left out."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 1000
    settings.AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS = 3
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)  # ranked as a large one
    context = make_context()
    items = []
    for i in range(1, 81):
        words = ["common"] + (["often"] if i % 2 else []) + (["seldom"] if i % 10 == 0 else [])
        words += ["rare"] if i in (7, 33, 64) else []
        words += ["unique thing"] if i == 50 else []
        items.append({"role": "user", "text": " ".join(words + [f"filler{i}"])})
    messages_append(context=context, items=items)
    context.refresh_from_db()

    def ranked(query):
        with CaptureQueriesContext(connection) as queries:
            hits = keyword_ranking(context_id=context.pk, query=query, limit=80)
        ranking = queries.captured_queries[-1]["sql"]
        counted = sum("FILTER (WHERE ts_match_vq" in q["sql"] for q in queries.captured_queries)
        return hits, ranking.count(" AS term, f.* FROM"), counted

    # Four words: the three rarest ranked ("common", in every message, left out), planned on
    # the counts that chose them (no second count of the latest seqs).
    hits, terms, counted = ranked("common often seldom rare")
    truth = bm25_truth(context, words=["often", "seldom", "rare"])
    assert terms == 3 and counted == 0
    assert [h for h, _ in hits] == [mid for mid, _ in truth]
    assert [s for _, s in hits] == pytest.approx([s for _, s in truth])
    # A phrase is kept, and the words share what room is left: the rarest one.
    hits, terms, counted = ranked('often common "unique thing" rare seldom')
    truth = bm25_truth(context, words=["rare", "seldom"], phrases=["unique thing"])
    assert terms == 3 and counted == 1  # a phrase's matches are counted apart
    assert [h for h, _ in hits] == [mid for mid, _ in truth]
    assert [s for _, s in hits] == pytest.approx([s for _, s in truth])
    # No more terms than that: every one ranked, as before.
    hits, terms, counted = ranked("common often rare")
    truth = bm25_truth(context, words=["common", "often", "rare"])
    assert terms == 3 and counted == 1 and [h for h, _ in hits] == [mid for mid, _ in truth]


def test_a_long_query_keeps_room_for_words_the_context_holds(settings, monkeypatch):
    """Words none of the latest messages holds (a name, a typo: perhaps in no message at all)
    take no more than half the room: the rarest words the context does hold fill the rest,
    and the query still finds their messages. An exclusion is honoured, its terms counted
    apart."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    settings.AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = 1000
    settings.AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS = 2
    monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)  # ranked as a large one
    context = make_context()
    items = [
        {"role": "user", "text": f"common {'rare' if i in (3, 9) else 'filler'} {i}"}
        for i in range(1, 41)
    ]
    messages = messages_append(context=context, items=items).messages
    context.refresh_from_db()
    query = "aardvark abacus abalone abandon rare common"
    with CaptureQueriesContext(connection) as queries:
        hits = keyword_ranking(context_id=context.pk, query=query, limit=40)
    ranking = queries.captured_queries[-1]["sql"]
    assert ranking.count(" AS term, f.* FROM") == 2
    assert {h for h, _ in hits} == {messages[2].pk, messages[8].pk}
    # An exclusion rides in each term's query: its counts are read apart.
    with CaptureQueriesContext(connection) as queries:
        hits = keyword_ranking(context_id=context.pk, query=query + " -3", limit=40)
    assert [h for h, _ in hits] == [messages[8].pk]
    assert any("FILTER (WHERE ts_match_vq" in q["sql"] for q in queries.captured_queries)


def test_a_long_query_in_a_context_read_through_the_index_is_ranked_the_bounded_way(
    kyoto, settings, monkeypatch
):
    """Past KEYWORD_SCAN_MESSAGES an exact ranking reads its matches through the GIN index, for
    a query of up to the cap's terms; the statement finds a longer query too long there (it
    counts the terms it parsed, not the words typed) and it is ranked on its rarest words."""
    context, ids = kyoto
    settings.AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS = 3
    monkeypatch.setattr(message_search, "KEYWORD_SCAN_MESSAGES", len(KYOTO) - 1)

    def statements(query):
        with CaptureQueriesContext(connection) as queries:
            hits = keyword_ranking(context_id=context.pk, query=query, limit=5)
        return hits, [q["sql"] for q in queries.captured_queries]

    # Three terms among stop words: exact, in the one statement, through the index.
    hits, sql = statements("the weather is in Kyoto and the coast")
    assert "s.search_vector @@ (SELECT q FROM matching)" in sql[-1]
    assert not any(" AS term, f.* FROM" in statement for statement in sql)
    truth = bm25_truth(context, words=["weather", "kyoto", "coast"])
    assert [h for h, _ in hits] == [mid for mid, _ in truth]
    # Five terms: the bounded way, on three of them.
    hits, sql = statements("weather kyoto coast lunch temples")
    assert any("AS fits" in statement for statement in sql[:-1])  # found too long there
    assert sql[-1].count(" AS term, f.* FROM") == 3
    assert hits
