"""Large text never breaks search: a message of any size the body limit allows is stored, alone
or in a batch, over REST and MCP, and found by keyword search by the words of its first part
(`memory_app_search_chars()` characters, migration 0019), with a note saying so; and a message
whose full-text vector cannot be written is marked, never holding up the indexer for the
messages and contexts after it."""

from __future__ import annotations

import json
import random
import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.urls import reverse

from memory_app.audit import Actor
from memory_app.backup.export import contexts_matching, export_lines
from memory_app.backup.lines import Summary
from memory_app.backup.restore import import_lines
from memory_app.errors import BackupFormatError
from memory_app.memories import Scope
from memory_app.models import Context, MemoryRecord, Message, MessageSearch
from memory_app.queries.dashboard import HistoryFilters, _history_qs
from memory_app.search import fulltext
from memory_app.services.curation import messages_set_pruned
from memory_app.services.memories import memories_record
from memory_app.services.messages import COPY_THRESHOLD, message_edit, messages_append
from tests.api_helpers import make_key, new_context
from tests.builders import make_context, make_user
from tests.test_mcp import Session, _secret

MB = 1024 * 1024
# The first part's word and the last line's: only the first is within the indexed part.
HEAD, TAIL = "zebracorn", "quokkamatic"
SIZES = [
    pytest.param(MB, id="1MB"),
    pytest.param(10 * MB, id="10MB", marks=pytest.mark.slow),
]


def log_text(size: int, seed: int = 0) -> str:
    """`size` characters of log lines whose request ids are all distinct: hyphenated hex, each
    one a lexeme whole and one per part, so that the lexemes of 1 MB are more than a tsvector
    holds. HEAD is in the first line, TAIL is the last word."""
    rnd = random.Random(seed)
    lines = [f"2025-06-01T00:00:00.000Z boot {HEAD} service started"]
    total = len(lines[0])
    n = 0
    while total < size:
        rid = uuid.UUID(int=rnd.getrandbits(128))
        line = (
            f"2025-06-01T12:{n // 60 % 60:02d}:{n % 60:02d}.{n % 1000:03d}Z req {rid}"
            f" span {rnd.getrandbits(64):x}-{rnd.getrandbits(48):x} GET /api/items/{n} ok"
        )
        lines.append(line)
        total += len(line) + 1
        n += 1
    body = "\n".join(lines)[: size - len(TAIL) - 1]
    return body + " " + TAIL


def keyword_search(api, context_id: int, query: str) -> dict:
    response = api.post(
        f"/api/v1/contexts/{context_id}/select",
        {"selector": "search", "query": query, "mode": "keyword", "k": 5},
    )
    assert response.status_code == 200, response.content[:500]
    return response.json()


def found_ids(result: dict) -> list[int]:
    return [item["message"]["id"] for item in result["items"]]


def assert_found_by_its_first_part(api, context_id: int, message_id: int) -> None:
    result = keyword_search(api, context_id, HEAD)
    assert found_ids(result) == [message_id]
    limit = fulltext.indexed_chars()
    assert any(f"keyword search reads its first {limit} only" in n for n in result["notes"])
    assert found_ids(keyword_search(api, context_id, TAIL)) == []


def caught_up(context_id: int) -> bool:
    context = Context.objects.get(pk=context_id)
    return context.search_seq == context.last_seq


@pytest.mark.django_db
def test_the_bound_keeps_adversarial_text_under_the_tsvector_limit():
    """Distinct words of 4-byte characters, hyphenated (each lexeme counted whole and in parts):
    the most lexeme bytes a character can give. Parsed whole, PostgreSQL refuses it."""
    limit = fulltext.indexed_chars()
    rnd = random.Random(1)
    # U+10400.. (Deseret capitals) lower-case to other 4-byte letters.
    letters = [chr(0x10400 + i) for i in range(40)]
    words = []
    while len(words) * 123 < 2 * limit:
        words.append("-".join("".join(rnd.choices(letters, k=40)) for _ in range(3)))
    text = " ".join(words)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(octet_length(lexeme)) FROM unnest(memory_app_search_vector('english', %s))",
            [text],
        )
        assert 900_000 < cursor.fetchone()[0] < 1_048_576
        cursor.execute("SAVEPOINT whole")
        with pytest.raises(Exception, match="string is too long for tsvector"):
            cursor.execute("SELECT to_tsvector('english', %s)", [text])
        cursor.execute("ROLLBACK TO SAVEPOINT whole")


@pytest.mark.django_db
@pytest.mark.parametrize("size", SIZES)
def test_a_large_message_alone_is_stored_and_found_by_its_first_part(size):
    api = make_key()
    cid = new_context(api)
    text = log_text(size)
    response = api.post(f"/api/v1/contexts/{cid}/messages", {"role": "tool", "text": text})
    assert response.status_code == 201, response.content[:500]
    stored = Message.objects.get(pk=response.json()["id"])
    assert stored.text == text
    # Written with its append, in its transaction: the context is caught up.
    assert caught_up(cid)
    assert MessageSearch.objects.get(context_id=cid, seq=stored.seq).error is None
    assert_found_by_its_first_part(api, cid, stored.pk)


@pytest.mark.django_db
@pytest.mark.slow
def test_a_message_as_large_as_the_body_limit_allows_is_stored_and_found():
    api = make_key()
    cid = new_context(api)
    limit = settings.MAX_REQUEST_BODY_BYTES
    envelope = len(json.dumps({"role": "tool", "text": ""}))
    # One line: a newline would take two bytes of JSON.
    text = log_text(limit - envelope).replace("\n", " ")
    body = json.dumps({"role": "tool", "text": text})
    assert len(body) == limit
    response = api.send("POST", f"/api/v1/contexts/{cid}/messages", raw=body)
    assert response.status_code == 201, response.content[:500]
    assert_found_by_its_first_part(api, cid, response.json()["id"])
    over = json.dumps({"role": "tool", "text": text + "x"})
    assert api.send("POST", f"/api/v1/contexts/{cid}/messages", raw=over).status_code == 413


@pytest.mark.django_db
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", [3, COPY_THRESHOLD], ids=["small-batch", "deferred-batch"])
def test_a_large_message_in_a_batch_is_stored_found_and_indexed(size, count):
    """A small batch writes its vectors with it; a large one leaves them to the indexer, and is
    found from its text meanwhile. Either way the indexer then goes on to later contexts."""
    api = make_key()
    cid = new_context(api, {"big": "batch"})
    text = log_text(size)
    items = [{"role": "user", "text": f"ordinary line {i}"} for i in range(count)]
    items[1] = {"role": "tool", "text": text}
    response = api.post(f"/api/v1/contexts/{cid}/messages/batch", {"messages": items})
    assert response.status_code == 201, response.content[:500]
    big_id = response.json()["messages"][1]["id"]
    assert Message.objects.get(pk=big_id).text == text
    assert caught_up(cid) == (count < COPY_THRESHOLD)
    assert_found_by_its_first_part(api, cid, big_id)

    later = new_context(api, {"big": "later"})
    later_items = [{"role": "user", "text": f"walrus note {i}"} for i in range(COPY_THRESHOLD)]
    assert api.post(f"/api/v1/contexts/{later}/messages/batch", {"messages": later_items})
    assert not caught_up(later)

    fulltext.index_pending()
    assert caught_up(cid) and caught_up(later)
    assert not MessageSearch.objects.filter(error__isnull=False).exists()
    assert_found_by_its_first_part(api, cid, big_id)
    assert len(found_ids(keyword_search(api, later, "walrus"))) == 5


@pytest.mark.django_db
def test_the_dashboard_history_filter_reads_a_large_message_by_its_first_part():
    """Parsed from its text before the indexer has been, and when pruned (no stored vector)."""
    context = make_context()
    items = [{"role": "user", "text": f"ordinary line {i}"} for i in range(COPY_THRESHOLD)]
    items[2] = {"role": "tool", "text": log_text(MB)}
    big = messages_append(context=context, items=items).messages[2]
    context.refresh_from_db()
    assert [m.pk for m in _history_qs(context, HistoryFilters(text=HEAD))] == [big.pk]
    client = Client()
    client.force_login(make_user(role="viewer"))
    page = client.get(reverse("context", args=[context.pk]), {"q": HEAD})
    assert page.status_code == 200 and HEAD in page.content.decode()
    messages_set_pruned(context=context, ids=[big.pk], pruned=True, actor=Actor.system("test"))
    fulltext.index_pending()
    context.refresh_from_db()
    filters = HistoryFilters(text=HEAD, show_pruned=True)
    assert [m.pk for m in _history_qs(context, filters)] == [big.pk]


# --- one bad row ------------------------------------------------------------------------------


def poison(word: str) -> None:
    """From now on (in this test's transaction) a vector holding `word` cannot be written: no
    text fails the bounded vector itself, so the table refuses it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE memory_app_messagesearch ADD CONSTRAINT poisoned_vector"
            " CHECK (NOT search_vector @@ to_tsquery('english', %s))",
            [word],
        )


def batch(context, texts):
    return messages_append(context=context, items=[{"role": "user", "text": t} for t in texts])


@pytest.mark.django_db
def test_a_row_whose_vector_fails_is_marked_and_the_indexer_goes_on(system_actor):
    api = make_key()
    bad = Context.objects.get(pk=new_context(api, {"poisoned": "1"}))
    later = Context.objects.get(pk=new_context(api, {"poisoned": "later"}))
    poison("nightshade")
    texts = [f"ordinary note {i}" for i in range(COPY_THRESHOLD)]
    texts[3] = "a nightshade note"
    batch(bad, texts)
    batch(later, [f"walrus note {i}" for i in range(COPY_THRESHOLD)])

    assert fulltext.index_pending() == 2 * COPY_THRESHOLD
    assert caught_up(bad.pk) and caught_up(later.pk)
    marked = MessageSearch.objects.get(context_id=bad.pk, seq=4)
    assert marked.search_vector is None
    assert "poisoned_vector" in marked.error
    assert MessageSearch.objects.filter(error__isnull=False).count() == 1
    assert len(found_ids(keyword_search(api, later.pk, "walrus"))) == 5
    # The context of the marked row answers; the row itself is not found by its words.
    assert len(found_ids(keyword_search(api, bad.pk, "ordinary"))) == 5
    assert found_ids(keyword_search(api, bad.pk, "nightshade")) == []

    # A small append writes its vectors with it: the bad one is marked, the message stored.
    response = api.post(
        f"/api/v1/contexts/{later.pk}/messages", {"role": "user", "text": "more nightshade"}
    )
    assert response.status_code == 201
    assert caught_up(later.pk)
    assert "poisoned_vector" in MessageSearch.objects.get(context_id=later.pk, seq=51).error

    # An edit parses the text again and clears the error.
    message = Message.objects.get(context=bad, seq=4)
    message_edit(message=message, text="a belladonna note", actor=system_actor)
    fixed = MessageSearch.objects.get(context_id=bad.pk, seq=4)
    assert fixed.error is None
    assert found_ids(keyword_search(api, bad.pk, "belladonna")) == [message.pk]


# --- MCP --------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("size", SIZES)
def test_a_large_message_appended_over_mcp_is_stored_and_found(asgi_live_server, size):
    mcp = Session(asgi_live_server, _secret())
    cid = mcp.ok("open_context", keys={"big": "mcp"})["context"]["id"]
    text = log_text(size)
    out = mcp.ok("append_message", context_id=cid, role="tool", text=text)
    assert out["created"] is True
    assert Message.objects.get(pk=out["message"]["id"]).text == text
    hits = mcp.ok("search_memory", context_id=cid, query=HEAD, mode="keyword")
    assert [h["message"]["id"] for h in hits["hits"]] == [out["message"]["id"]]
    limit = fulltext.indexed_chars()
    assert any(f"keyword search reads its first {limit} only" in n for n in hits["notes"])
    assert mcp.ok("search_memory", context_id=cid, query=TAIL, mode="keyword")["hits"] == []


# --- backups ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_backup_brings_a_large_message_in_and_refuses_an_oversized_memory(system_actor):
    context = make_context(keys={"big": "backup"})
    text = log_text(MB)
    messages_append(context=context, items=[{"role": "tool", "text": text}])
    memories_record(scope=Scope(context=context), items=[{"content": "tea"}], actor=system_actor)
    lines = list(export_lines(contexts=contexts_matching(context_ids=[context.pk])))
    MemoryRecord.objects.all().delete()
    Context.objects.all().delete()

    result = import_lines(lines, actor=system_actor)
    assert result.created["messages"] == 1
    big = Message.objects.get(context__keys={"big": "backup"}, seq=1)
    assert big.text == text
    api = make_key()
    assert_found_by_its_first_part(api, big.context_id, big.pk)
    fulltext.index_pending()
    assert caught_up(big.context_id)
    assert_found_by_its_first_part(api, big.context_id, big.pk)

    # Memory content is held to MAX_CONTENT_CHARS on every path, a backup's too.
    memory = json.loads(next(line for line in lines if '"type":"memory"' in line))
    memory["content"] = log_text(MB)
    tampered = [*lines[:2], json.dumps(memory) + "\n"]
    summary = Summary()  # a trailer that holds: the refusal is the content's, not the file's
    for line in tampered:
        summary.add(line.encode("utf-8"), json.loads(line)["type"])
    tampered.append(json.dumps(summary.trailer()) + "\n")
    with pytest.raises(BackupFormatError, match="longer than 20000 characters"):
        import_lines(tampered, actor=system_actor)
    assert list(MemoryRecord.objects.values_list("content", flat=True)) == ["tea"]
