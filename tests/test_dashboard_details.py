"""Details an operator reads on the dashboard: key values as the filter accepts them, live and
pruned message counts, selector notes by #seq, messages that only call a tool."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client
from django.urls import reverse

from memory_app import selectors, tokens
from memory_app.audit import Actor
from memory_app.models import Context, Message
from memory_app.selectors import TokenWindowSpec
from memory_app.services.contexts import context_get_or_create
from memory_app.services.curation import messages_set_pruned
from memory_app.services.messages import message_edit, messages_append
from tests.builders import make_context, make_user

pytestmark = pytest.mark.django_db

TOOL_CALL = {
    "type": "tool_use",
    "id": "call_1",
    "name": "get_weather",
    "input": {"city": "Kyoto", "unit": "<b>celsius</b>"},
}


@pytest.fixture
def viewer() -> Client:
    client = Client()
    client.force_login(make_user(role="viewer"))
    return client


def test_key_values_are_shown_as_json_and_the_shown_text_filters(viewer):
    make_context(keys={"demo": "True"})  # a string that reads like Python's True: not a match
    keys = {"demo": True, "n": 42, "gone": None, "tenant": "acme", "tags": ["a", "b"]}
    context, _ = context_get_or_create(keys=keys)
    html = viewer.get(reverse("context", args=[context.pk])).content.decode()
    shown = dict(re.findall(r'<a class="kv" href="[^"]*"><b>([^<]+)</b>=([^<]+)</a>', html))
    assert {k: unescape(v) for k, v in shown.items()} == {
        "demo": "true",
        "n": "42",
        "gone": "null",
        "tenant": "acme",
        "tags": '["a", "b"]',
    }
    links = re.findall(r'<a class="kv" href="([^"]+)">', html)
    assert len(links) == 5
    for link in links:
        listing = viewer.get(unescape(link)).content.decode()
        found = set(map(int, re.findall(r'href="/contexts/(\d+)/"', listing)))
        assert found == {context.pk}, link
    # What a chip shows, typed into the key filter, finds the same context.
    for typed in ("demo=true", "n=42", "gone=null", "tenant=acme"):
        listing = viewer.get(reverse("contexts"), {"add": typed}).content.decode()
        assert set(map(int, re.findall(r'href="/contexts/(\d+)/"', listing))) == {context.pk}, typed


def test_message_counts_are_live_with_pruned_shown_apart(viewer):
    context = make_context(messages=5)
    ids = list(Message.objects.filter(context=context).order_by("seq").values_list("pk", flat=True))
    messages_set_pruned(context=context, ids=ids[:2], pruned=True, actor=Actor.system("t"))
    page = viewer.get(reverse("context", args=[context.pk])).content.decode()
    assert re.search(r'data-testid="live-count">3<', page)
    assert re.search(r'data-testid="pruned-count"[^>]*>2<', page)
    listing = viewer.get(reverse("contexts")).content.decode()
    assert re.search(
        r'data-label="Messages">3 <span class="muted pruned-count"[^>]*>\+2 pruned<', listing
    )
    # Token totals leave the pruned messages out too, on the page and in the list.
    live_tokens = sum(
        Message.objects.filter(context=context, pruned_at__isnull=True).values_list(
            "token_count", flat=True
        )
    )
    assert live_tokens < Context.objects.get(pk=context.pk).token_count
    assert re.search(rf'data-testid="live-tokens" title="{live_tokens}"', page)
    assert re.search(rf'data-label="Tokens" title="{live_tokens}"', listing)
    messages_set_pruned(context=context, ids=ids[:2], pruned=False, actor=Actor.system("t"))
    page = viewer.get(reverse("context", args=[context.pk])).content.decode()
    assert re.search(r'data-testid="live-count">5<', page) and "pruned-count" not in page


def test_selector_notes_name_messages_by_seq():
    make_context(messages=7)  # ids of the next context's messages no longer equal their seqs
    context = make_context(messages=0)
    messages_append(
        context=context,
        items=[
            {"role": "user", "text": "word " * 50},
            {"role": "assistant", "text": "ok"},
        ],
    )
    first = Message.objects.get(context=context, seq=1)
    assert first.pk != first.seq
    selection = selectors.select(context=context, spec=TokenWindowSpec(max_tokens=10))
    assert selection.notes == [
        f"stopped at message #1 ({first.token_count} tokens would reach {first.token_count + 1}/10)"
    ]
    skip = selectors.select(context=context, spec=TokenWindowSpec(max_tokens=10, policy="skip"))
    assert skip.notes[0].startswith("skipped message #1:")


def test_a_message_that_only_calls_a_tool_counts_its_call_and_shows_it(viewer):
    context = make_context(messages=0)
    [call, answer] = messages_append(
        context=context,
        items=[
            {"role": "assistant", "text": "", "content": [TOOL_CALL]},
            {
                "role": "assistant",
                "text": "It is sunny",
                "content": [{"type": "text", "text": "It is sunny"}],
            },
        ],
    ).messages
    expected = tokens.count_tokens([tokens.token_text("", [TOOL_CALL])])[0]
    assert call.token_count == expected > 10
    # Text blocks are the message's text already: not counted twice.
    assert answer.token_count == tokens.count_tokens(["It is sunny"])[0]
    assert Context.objects.get(pk=context.pk).token_count == call.token_count + answer.token_count
    # The selectors count what was stored.
    selection = selectors.select(context=context, spec=TokenWindowSpec(max_tokens=1000))
    assert [(i.message.pk, i.tokens) for i in selection.items] == [
        (call.pk, call.token_count),
        (answer.pk, answer.token_count),
    ]
    html = viewer.get(reverse("context", args=[context.pk])).content.decode()
    block = html[html.index(f'id="m-{call.seq}"') : html.index(f'id="m-{answer.seq}"')]
    assert "calls get_weather" in block and "Kyoto" in block
    assert "<b>celsius" not in block and "&lt;b&gt;celsius" in block
    assert 'class="msg-body text"' not in block  # no empty text box


def test_editing_the_text_of_a_tool_call_message_keeps_the_call_counted():
    context = make_context(messages=0)
    [call] = messages_append(
        context=context, items=[{"role": "assistant", "text": "", "content": [TOOL_CALL]}]
    ).messages
    edited = message_edit(message=call, actor=Actor.system("t"), text="checking the weather")
    assert (
        edited.token_count
        == tokens.count_tokens([tokens.token_text("checking the weather", [TOOL_CALL])])[0]
    )
    assert Context.objects.get(pk=context.pk).token_count == edited.token_count
