"""A read of one context's rows sent as a call of `memory_app_on_shard` (the ranking statements of
keyword search, on a distributed store) answers what the statement answers as written: its values
written in as literals, its tables filled in by the function. Here on one node, where the
function runs the statement over the tables themselves (as on a coordinator when Citus does not
delegate the call); on a cluster `tests/test_citus_cluster.py` sees it run on the context's
worker, over its shards."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory_app import pipelines, shard_reads
from memory_app.search import keyword as message_search
from memory_app.search.keyword import keyword_ranking
from memory_app.services.messages import messages_append
from tests.api_helpers import append, make_key, new_context
from tests.builders import make_context

pytestmark = pytest.mark.django_db


def send_through_the_function(monkeypatch, through: bool = True) -> None:
    """Reads go as on a distributed store outside a transaction block (`through`: the
    function), or as they go on one node: each test runs in a transaction of its own."""
    monkeypatch.setattr(shard_reads, "_on_shards", lambda: through)


@pytest.fixture
def distributed(monkeypatch):
    send_through_the_function(monkeypatch)


# Values a statement's literals must carry unchanged: quotes, backslashes, `%` and what
# `format()` would read as a placeholder, a table's name, a NUL-free mix of scripts, arrays
# (empty too), NULL, a float whose text needs every digit.
AWKWARD = {
    "text": "it's 100% \\ %1$s %s memory_app_message\n\t« 東京 » ''",
    "ids": [3, 2**40, -7],
    "none_of_them": [],
    "words": ["a,b", 'say "hi"', "{x}", "back\\slash", ""],
    "nothing": None,
    "flag": True,
    "ratio": 0.1 + 0.2,
}
STATEMENT = """
SELECT %(text)s::text, %(ids)s::bigint[], %(none_of_them)s::bigint[], %(words)s::text[],
       %(nothing)s::text, %(flag)s::boolean, %(ratio)s::float8,
       (SELECT count(*) FROM memory_app_message m WHERE m.context_id = %(context)s),
       (SELECT string_agg(m.text, '|' ORDER BY m.seq) FROM memory_app_message m
        WHERE m.context_id = %(context)s AND m.text LIKE '%%e%%')
"""
TYPES = ["text", "bigint[]", "bigint[]", "text[]", "text", "boolean", "double precision"]
TYPES += ["bigint", "text"]


def test_a_statement_through_the_function_answers_as_written(distributed):
    context = make_context(messages=4)
    params = AWKWARD | {"context": context.id}
    with CaptureQueriesContext(connection) as sent:
        rows = shard_reads.read_rows(
            STATEMENT,
            params,
            context_id=context.id,
            tables=["memory_app_message"],
            types=lambda: TYPES,
        )
    assert "memory_app_on_shard" in sent.captured_queries[-1]["sql"]
    assert rows == pipelines.read_rows(STATEMENT, params)
    (row,) = rows
    assert list(row[:7]) == list(AWKWARD.values())
    assert row[7] == 4


def test_only_the_statements_own_text_names_tables():
    text = shard_reads.format_string(
        "SELECT %(name)s FROM memory_app_message m JOIN memory_app_messagesearch s"
        " ON s.seq = m.seq WHERE m.text LIKE 'a%%'",
        {"name": "memory_app_message 50%"},
        ["memory_app_message", "memory_app_messagesearch"],
    )
    assert text == (
        "SELECT 'memory_app_message 50%%' FROM %1$s m JOIN %2$s s"
        " ON s.seq = m.seq WHERE m.text LIKE 'a%%'"
    )
    with pytest.raises(ValueError, match="names its placeholders"):
        shard_reads.format_string("SELECT %s", {}, ["memory_app_message"])
    with pytest.raises(ValueError, match="at least one table"):
        shard_reads.format_string("SELECT 1", {}, [])


TEXTS = [
    "Kyoto temples are quiet at dawn",
    "The weather in Kyoto is mild today, and the weather will hold",
    "Severe weather alerts for the coast",
    "It's 100% certain: weather \\ Kyoto's 'old' temples",
    "Nothing to add",
    "temples and weather, weather and temples",
]
QUERIES = [
    ("weather in Kyoto", "any"),
    ('"quiet at dawn" temples', "any"),
    ("weather -coast", "any"),
    ("Kyoto weather", "all"),
    ("100% 'old'", "any"),
]


@pytest.mark.parametrize("exact", [True, False], ids=["small context", "large context"])
def test_keyword_ranking_through_the_function_is_the_direct_ranking(settings, monkeypatch, exact):
    """Both ways of ranking (one exact statement; the counts and the ranking of a large
    context), every kind of query, hits with their columns and with ids excluded: the same
    hits, scores and rows through the function as sent directly."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    if not exact:
        monkeypatch.setattr(message_search, "KEYWORD_EXACT_MESSAGES", 0)
        monkeypatch.setattr(message_search, "KEYWORD_RECENT_SEQS", 3)
    context = make_context()
    items = [{"role": "user", "text": t} for t in TEXTS * 3]
    ids = [m.pk for m in messages_append(context=context, items=items).messages]

    def rank(query, match, exclude):
        rows: dict = {}
        hits = keyword_ranking(
            context_id=context.pk,
            query=query,
            limit=5,
            match=match,
            exclude_ids=exclude,
            rows=rows,
        )
        return hits, rows

    send_through_the_function(monkeypatch, False)
    direct = {(q, m, bool(x)): rank(q, m, x) for q, m in QUERIES for x in ([], ids[:2])}
    assert all(hits for hits, _ in direct.values())
    send_through_the_function(monkeypatch)
    with CaptureQueriesContext(connection) as sent:
        through = {(q, m, bool(x)): rank(q, m, x) for q, m in QUERIES for x in ([], ids[:2])}
    assert through == direct
    calls = [q for q in sent.captured_queries if "memory_app_on_shard" in q["sql"]]
    # The exact statement for each search; else the counts and the ranking.
    assert len(calls) == len(direct) * (1 if exact else 2)


def test_the_call_goes_ahead_of_a_deferred_read_and_waits_for_its_check(distributed):
    """A request's key read deferred into the call's round trip goes behind it (Citus
    delegates a call only as the first statement of its transaction); the rows still wait for
    the check, and a refusal hands none back."""
    context = make_context(messages=2)
    statement = "SELECT count(*) FROM memory_app_message m WHERE m.context_id = %(c)s"

    def read():
        return shard_reads.read_rows(
            statement,
            {"c": context.id},
            context_id=context.id,
            tables=["memory_app_message"],
            types=lambda: ["bigint"],
        )

    checked = []
    with (
        pipelines.deferred_read([("SELECT 'key'", [])], checked.append),
        CaptureQueriesContext(connection) as sent,
    ):
        assert read() == [(2,)]
    assert checked == [[("key",)]]
    order = [q["sql"] for q in sent.captured_queries]
    assert "memory_app_on_shard" in order[0] and "'key'" in order[1], order

    def refuse(rows):
        raise PermissionError("revoked")

    with pipelines.deferred_read([("SELECT 'key'", [])], refuse), pytest.raises(PermissionError):
        read()


def test_a_query_holding_a_nul_is_refused_as_bad_input(distributed):
    """A NUL, which no PostgreSQL text holds, cannot be written as a literal: the search is
    refused as a server-bound parameter holding it is (422), not failed."""
    api = make_key()
    cid = new_context(api)
    append(api, cid, text="apples")
    body = {"selector": "search", "query": "apples\u0000", "k": 2, "mode": "keyword"}
    response = api.post(f"/api/v1/contexts/{cid}/select", body)
    assert response.status_code == 422, response.content
