"""Search everything: messages, step outputs, errors and tool calls of every visible context,
through the query, the Agent API, the MCP tool and the dashboard page."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from memory_app.models import RunSearch, Step, ToolCall
from memory_app.queries import search_all as sa
from memory_app.queries.search_all import SearchFilters, search_all
from tests.api_helpers import make_key
from tests.builders import TEST_PASSWORD, action_step, make_context, make_run, make_user

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
        from tests.builders import add_messages

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
    from tests.builders import add_messages

    add_messages(context=context, count=1, text="\x02fake\x03 wombat")
    (hit,) = _search("wombat").hits
    assert [text for text, marked in hit.parts if marked] == ["wombat"]
    assert "\x02" not in hit.snippet


def test_existing_steps_are_backfilled_by_the_migration_sql(store):
    """The migration's backfill gives the rows the triggers give."""
    import importlib

    migration = importlib.import_module("memory_app.migrations.0033_run_search_table")
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


def _unused():  # keep imports referenced while the file grows
    return (Client, reverse, make_key, make_user, TEST_PASSWORD, action_step)
