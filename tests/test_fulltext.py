"""Full-text vectors off the write path: a large batch is stored without parsing its
text, the indexer writes the vectors afterwards, and keyword search finds every message at every
moment: from its stored vector up to the context's search_seq, from its text after it."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection, connections
from django.test import Client
from django.urls import reverse

from memory_app import backlog, scale_out
from memory_app.backlog import run_worker
from memory_app.backup.export import export_lines
from memory_app.backup.restore import import_lines
from memory_app.embeddings import providers
from memory_app.models import Context, Message, MessageSearch
from memory_app.queries.dashboard import HistoryFilters, _history_qs
from memory_app.search import fulltext
from memory_app.search import keyword as message_search
from memory_app.search.keyword import keyword_ranking
from memory_app.services import curation
from memory_app.services.curation import messages_set_pruned
from memory_app.services.messages import COPY_THRESHOLD, message_edit, messages_append
from tests.bm25_truth import bm25_truth, split
from tests.builders import make_context, make_user

pytestmark = pytest.mark.django_db


def batch(context, texts):
    assert len(texts) >= COPY_THRESHOLD
    return messages_append(
        context=context, items=[{"role": "user", "text": t} for t in texts]
    ).messages


def texts(n, special=None):
    special = special or {}
    return [special.get(i, f"ordinary note number {i}") for i in range(n)]


def truth(context, query, match="any"):
    """Every live message of the context ranked on its text, row by row, by BM25."""
    strict = query if match == "all" else None
    return [mid for mid, _ in bm25_truth(context, **split(query), strict=strict)]


def found(context, query, limit=10, match="any"):
    return [
        mid
        for mid, _ in keyword_ranking(context_id=context.pk, query=query, limit=limit, match=match)
    ]


def stored_vectors(context) -> dict[int, str]:
    """seq → stored vector of the context's messages."""
    return dict(
        MessageSearch.objects.filter(context_id=context.pk).values_list("seq", "search_vector")
    )


def has_vector(message, word) -> bool:
    return MessageSearch.objects.filter(
        context_id=message.context_id, seq=message.seq, search_vector=word
    ).exists()


def test_a_small_append_to_a_caught_up_context_writes_its_vectors_at_once():
    context = make_context(messages=3)
    context.refresh_from_db()
    assert context.search_seq == context.last_seq == 3
    [m] = messages_append(
        context=context, items=[{"role": "user", "text": "Kyoto temples"}]
    ).messages
    context.refresh_from_db()
    assert context.search_seq == 4
    assert has_vector(m, "temple")


def test_a_large_batch_is_searchable_at_once_then_from_its_stored_vectors(settings):
    context = make_context(messages=2)
    stored = batch(context, texts(120, {5: "the Kyoto trip", 90: "Kyoto weather again"}))
    context.refresh_from_db()
    # Stored without its vectors: the context's search_seq stays where it was.
    assert context.search_seq == 2 and context.last_seq == 122
    assert set(stored_vectors(context)) == {1, 2}
    before = found(context, "kyoto")
    assert before == truth(context, "kyoto") and set(before) == {stored[90].pk, stored[5].pk}
    any_word = found(context, "kyoto ordinary", match="any")
    assert any_word == truth(context, "kyoto ordinary", match="any")[:10]
    # The indexer writes them and moves search_seq on; the answers do not change.
    assert fulltext.pending_count() == 120
    assert fulltext.index_pending(batch_size=50) == 120
    context.refresh_from_db()
    assert context.search_seq == 122 and fulltext.pending_count() == 0
    assert len(stored_vectors(context)) == 122
    assert found(context, "kyoto") == before
    assert found(context, "kyoto ordinary", match="any") == any_word


def test_a_backlog_older_than_the_recent_window_is_read_exactly(monkeypatch):
    """Pass 2: a rare word in a batch the indexer has not reached, behind the recent window."""
    monkeypatch.setattr(message_search, "KEYWORD_RECENT_SEQS", 10)
    context = make_context(messages=5)
    first = batch(context, texts(100, {3: "a lone zebra"}))
    messages_append(context=context, items=[{"role": "user", "text": "recent"}] * 1)
    batch(context, texts(60))
    context.refresh_from_db()
    assert context.search_seq == 5
    assert found(context, "zebra") == [first[3].pk]
    fulltext.index_pending()
    context.refresh_from_db()
    assert found(context, "zebra") == [first[3].pk]


def test_appends_behind_a_backlog_are_left_to_the_indexer():
    context = make_context()
    batch(context, texts(60))
    [m] = messages_append(
        context=context, items=[{"role": "user", "text": "zebra crossing"}]
    ).messages
    context.refresh_from_db()
    assert context.search_seq == 0 and not stored_vectors(context)
    assert found(context, "zebra") == [m.pk]
    fulltext.index_pending()
    assert has_vector(m, "zebra")


def test_an_edited_text_is_parsed_again_and_a_deleted_message_takes_its_vector(system_actor):
    context = make_context()
    [m, other] = messages_append(
        context=context,
        items=[{"role": "user", "text": "about zebras"}, {"role": "user", "text": "x"}],
    ).messages
    message_edit(message=m, actor=system_actor, text="about giraffes")
    assert found(context, "zebra") == [] and found(context, "giraffe") == [m.pk]
    assert has_vector(m, "giraffe")
    # Any writer, not only the domain's: the trigger is the database's.
    with connection.cursor() as cur:
        cur.execute("UPDATE memory_app_message SET text = 'about okapis' WHERE id = %s", [m.pk])
    assert found(context, "okapi") == [m.pk] and found(context, "giraffe") == []
    Message.objects.filter(pk=m.pk).delete()
    assert set(stored_vectors(context)) == {other.seq}
    context.delete()
    assert not MessageSearch.objects.filter(context_id=other.context_id).exists()


def test_pruned_messages_are_not_found_either_way_and_come_back_restored(system_actor):
    context = make_context()
    stored = batch(context, texts(60, {7: "zebra one", 8: "zebra two"}))
    messages_set_pruned(context=context, ids=[stored[7].pk], pruned=True, actor=system_actor)
    assert found(context, "zebra") == [stored[8].pk]
    fulltext.index_pending()
    # The indexer writes no vector for a pruned message; pruning takes a stored one away.
    assert not has_vector(stored[7], "zebra") and has_vector(stored[8], "zebra")
    assert found(context, "zebra") == [stored[8].pk]
    messages_set_pruned(context=context, ids=[stored[8].pk], pruned=True, actor=system_actor)
    assert not has_vector(stored[8], "zebra") and found(context, "zebra") == []
    messages_set_pruned(
        context=context, ids=[stored[7].pk, stored[8].pk], pruned=False, actor=system_actor
    )
    assert has_vector(stored[7], "zebra") and has_vector(stored[8], "zebra")
    assert found(context, "zebra") == truth(context, "zebra") == [stored[8].pk, stored[7].pk]


def test_the_dashboard_history_filter_finds_unparsed_and_parsed_messages():
    context = make_context()
    stored = batch(context, texts(60, {4: "zebra crossing"}))
    context.refresh_from_db()
    filters = HistoryFilters(text="zebra")
    assert [m.pk for m in _history_qs(context, filters)] == [stored[4].pk]
    fulltext.index_pending()
    context.refresh_from_db()
    assert [m.pk for m in _history_qs(context, filters)] == [stored[4].pk]
    client = Client()
    client.force_login(make_user(role="viewer"))
    page = client.get(reverse("context", args=[context.pk]), {"q": "zebra"})
    assert page.status_code == 200 and "zebra crossing" in page.content.decode()


def test_an_import_leaves_its_messages_to_the_indexer_and_finds_them_meanwhile():
    source = make_context(keys={"test": "fulltext-import"})
    batch(source, texts(60, {9: "a zebra in the export"}))
    fulltext.index_pending()
    lines = list(export_lines())
    Context.objects.filter(pk=source.pk).delete()
    assert not MessageSearch.objects.exists()
    import_lines(lines)
    imported = Context.objects.get(keys={"test": "fulltext-import"})
    assert imported.search_seq == 0 and imported.last_seq == 60
    [hit] = found(imported, "zebra")
    assert Message.objects.get(pk=hit).seq == 10
    fulltext.index_pending()
    imported.refresh_from_db()
    assert imported.search_seq == 60 and len(stored_vectors(imported)) == 60


def test_healthz_and_the_command_show_the_backlog(client):
    from io import StringIO

    from django.core.management import call_command

    context = make_context()
    batch(context, texts(70))
    assert client.get("/healthz").json()["fulltext_pending"] == 70
    out = StringIO()
    call_command("index_pending", "--batch-size", "30", stdout=out)
    assert "70 messages waiting for their full-text vector" in out.getvalue()
    assert "done: 70 written, 0 waiting" in out.getvalue()
    assert client.get("/healthz").json()["fulltext_pending"] == 0


@pytest.mark.django_db(transaction=True)
def test_the_indexer_skips_a_context_being_written_to_and_comes_back_for_it(settings):
    settings.AGENTMEMORY_INDEXER_THREAD = False
    busy = make_context()
    idle = make_context()
    batch(busy, texts(60))
    batch(idle, texts(60))
    try:
        # Another connection holds the busy context's row, as an appender does until it commits.
        with psycopg.connect(**_conninfo()) as other:
            other.execute("SELECT 1 FROM memory_app_context WHERE id = %s FOR UPDATE", [busy.pk])
            assert fulltext.index_pending() == 60
            busy.refresh_from_db()
            idle.refresh_from_db()
            assert busy.search_seq == 0 and idle.search_seq == 60
            # The thread, woken now (as a batch's commit wakes it), finds the context still held.
            settings.AGENTMEMORY_INDEXER_THREAD = True
            backlog.wake_indexer()
            assert not backlog.indexer.wait_idle(1.5)
        # Released (by a writer that wakes nobody): the thread looks again and drains it.
        assert backlog.indexer.wait_idle(30)
        busy.refresh_from_db()
        assert busy.search_seq == busy.last_seq == 60 and fulltext.pending_count() == 0
    finally:
        busy.delete()
        idle.delete()


@pytest.mark.django_db(transaction=True)
def test_an_edit_during_indexing_is_not_lost(settings):
    """The indexer holds the context's row while it parses; an edit's trigger waits for it, so
    the stored vector is the edited text's, whichever commits first."""
    settings.AGENTMEMORY_INDEXER_THREAD = False
    context = make_context()
    stored = batch(context, texts(60, {2: "about zebras"}))
    target = stored[2].pk
    try:
        with psycopg.connect(**_conninfo()) as indexer:
            indexer.execute(
                "SELECT 1 FROM memory_app_context WHERE id = %s FOR UPDATE", [context.pk]
            )
            indexer.execute(
                "INSERT INTO memory_app_messagesearch SELECT context_id, seq, "
                "to_tsvector('english', text)"
                " FROM memory_app_message WHERE context_id = %s",
                [context.pk],
            )
            done = threading.Event()

            def edit():
                try:
                    with connections["default"].cursor() as cur:
                        cur.execute(
                            "UPDATE memory_app_message SET text = 'about okapis' WHERE id = %s",
                            [target],
                        )
                finally:
                    connections.close_all()
                    done.set()

            thread = threading.Thread(target=edit)
            thread.start()
            assert not done.wait(0.5)  # waits for the indexer's lock
            indexer.execute(
                "UPDATE memory_app_context SET search_seq = last_seq WHERE id = %s", [context.pk]
            )
            indexer.commit()
            assert done.wait(10)
            thread.join()
        assert has_vector(stored[2], "okapi") and not has_vector(stored[2], "zebra")
        context.refresh_from_db()
        assert found(context, "okapi") == [target] and found(context, "zebra") == []
    finally:
        context.delete()


def _conninfo() -> dict:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def test_the_bulk_prune_preview_and_history_do_not_need_vectors():
    """Reads that never searched text work on a context whose vectors wait."""
    context = make_context()
    batch(context, texts(60))
    preview = curation.bulk_prune_preview(
        context=context, flt=curation.PruneFilter(text="number 1")
    )
    assert preview.count == 11


def test_a_message_moved_by_hand_takes_its_vector_along():
    """No domain path moves a message; an UPDATE by hand (or the admin, before it was read-only)
    must not leave a vector at the old key that names no message."""
    if scale_out.table_is_distributed("memory_app_message"):
        pytest.skip("Citus refuses an UPDATE of the distribution column: no row moves there")
    source, target = make_context(), make_context()
    [m] = messages_append(context=source, items=[{"role": "user", "text": "zebra"}]).messages
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE memory_app_message SET context_id = %s, seq = 7 WHERE id = %s",
            [target.pk, m.pk],
        )
    m.refresh_from_db()
    assert not stored_vectors(source) and has_vector(m, "zebra")
    target.refresh_from_db()
    assert found(target, "zebra") == [m.pk] and found(source, "zebra") == []


def test_the_embed_worker_turn_moves_past_a_range_of_pruned_messages(system_actor):
    class NothingToEmbed(providers.EmbeddingProvider):
        kind, model = "test", "nothing-pending"

    context = make_context()
    stored = batch(context, texts(60))
    messages_set_pruned(
        context=context, ids=[m.pk for m in stored], pruned=True, actor=system_actor
    )
    # A turn that writes nothing (every message of the range is pruned) still moves the context,
    # and `once` goes on while a context is behind.
    totals = run_worker(provider=NothingToEmbed(), once=True)
    context.refresh_from_db()
    assert context.search_seq == 60 and totals.parsed == 0 and fulltext.pending_count() == 0


def test_the_admin_cannot_move_a_message_or_set_search_seq(admin_client):
    context, other = make_context(), make_context()
    [m] = messages_append(context=context, items=[{"role": "user", "text": "zebra"}]).messages
    page = admin_client.get(
        reverse("admin:memory_app_message_change", args=[m.pk])
    ).content.decode()
    assert 'name="context"' not in page
    admin_client.post(
        reverse("admin:memory_app_message_change", args=[m.pk]),
        {
            "context": other.pk,
            "role": "user",
            "name": "",
            "text": "zebra",
            "tags": "",
            "metadata": "{}",
            "source_timestamp": "",
            "client_id": "",
        },
    )
    m.refresh_from_db()
    assert m.context_id == context.pk
    page = admin_client.get(
        reverse("admin:memory_app_context_change", args=[context.pk])
    ).content.decode()
    assert 'name="search_seq"' not in page
