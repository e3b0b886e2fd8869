"""The site's binding cursors take psycopg's placeholders, send PostgreSQL's, and convert each
statement's text once per process, however long: psycopg re-splits a text over 4 KB on every
call (the keyword ranking's statements are)."""

import psycopg
import psycopg._queries
import pytest
from psycopg import sql

from memory_app import db, numbered_placeholders
from memory_app.search.keyword import keyword_ranking
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("prepared", [False, True])
def test_named_positional_and_percent_signs_read_as_psycopg_reads_them(prepared):
    with db.binding_cursor(prepared=prepared) as cursor:
        cursor.execute(
            "SELECT %(a)s::int + %(a)s::int, '100%%', %(b)s::text, %(c)s::bytea",
            {"c": b"\x00\x01", "b": "x%(a)s", "a": 1},
        )
        assert cursor.fetchone() == (2, "100%", "x%(a)s", b"\x00\x01")
        cursor.execute("SELECT %s::int, %s::text, '%%'", [7, "%s"])
        assert cursor.fetchone() == (7, "%s", "%")
        cursor.execute("SELECT '%%' || 'a'")  # no parameters: the text goes as written
        assert cursor.fetchone() == ("%%a",)


def test_many_rows_of_named_parameters_go_in_their_numbers_order():
    with db.binding_cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE numbered (a int, b text)")
        cursor.executemany(
            "INSERT INTO numbered (b, a) VALUES (%(b)s, %(a)s)",
            [{"a": 1, "b": "one"}, {"b": "two", "a": 2}],
        )
        cursor.execute("SELECT a, b FROM numbered ORDER BY a")
        assert cursor.fetchall() == [(1, "one"), (2, "two")]


@pytest.mark.parametrize(
    "text",
    ["SELECT %(a)s, %s", "SELECT %t", "SELECT %b", "SELECT %(a)b", "SELECT 5 %% 2, %x"],
)
def test_placeholders_psycopg_refuses_or_the_cursors_do_not_take_are_refused(text):
    with pytest.raises(psycopg.ProgrammingError):
        numbered_placeholders._numbered_text(text)


@pytest.mark.parametrize(
    ("text", "params", "error"),
    [
        ("SELECT %s::int", [1, 2], psycopg.ProgrammingError),
        ("SELECT %s::int, %s::int", [1], psycopg.ProgrammingError),
        ("SELECT %(a)s::int", {"b": 1}, psycopg.ProgrammingError),
        ("SELECT %(a)s::int", [1], TypeError),
        ("SELECT %s::int", {"a": 1}, TypeError),
    ],
)
def test_parameters_that_do_not_fit_the_placeholders_are_refused_before_sending(
    text, params, error
):
    """As psycopg refuses them: a count that differs would shift values onto the wrong
    placeholders, or reach the server as a protocol error read as the database's fault."""
    with db.binding_cursor() as cursor, pytest.raises(error):
        cursor.cursor.execute(text, params)


def test_a_composed_or_bytes_statement_takes_parameters_too():
    with db.binding_cursor() as cursor:
        cursor.execute(sql.SQL("SELECT {}::int + %s").format(sql.Literal(1)), [2])
        assert cursor.fetchone() == (3,)
        cursor.execute(b"SELECT %(a)s::text", {"a": "x"})
        assert cursor.fetchone() == ("x",)


def test_a_long_statement_is_converted_once_not_on_every_call(monkeypatch):
    """The keyword ranking of a context (a statement over 4 KB) twice: psycopg's own conversion,
    which keeps nothing for such a text, is never asked; ours converts the text once."""
    context, _ = context_get_or_create(keys={"numbered": "long"})
    messages_append(
        context=context, items=[{"role": "user", "text": f"alpha beta {i}"} for i in range(5)]
    )
    parsed = []
    convert = psycopg._queries._query2pg_nocache

    def counted(query, encoding):
        parsed.append(len(query))
        return convert(query, encoding)

    monkeypatch.setattr(psycopg._queries, "_query2pg_nocache", counted)
    kept = numbered_placeholders._numbered_kept
    kept.cache_clear()
    assert len(keyword_ranking(context_id=context.pk, query="alpha", limit=3)) == 3
    first = kept.cache_info()
    assert len(keyword_ranking(context_id=context.pk, query="alpha", limit=3)) == 3
    again = kept.cache_info()
    assert [n for n in parsed if n > psycopg._queries.MAX_CACHED_STATEMENT_LENGTH] == []
    assert first.misses >= 1
    assert again.misses == first.misses  # the second search converted nothing
    assert again.hits > first.hits
