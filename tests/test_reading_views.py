"""Context page on the server: where it opens, folded long texts, step links."""

from __future__ import annotations

import pytest
from django.test import Client

from memory_app.services.messages import messages_append
from tests.builders import make_context, make_run, make_user

pytestmark = pytest.mark.django_db

LONG = "\n".join(f"<b>row {i}</b>" for i in range(1, 401))


@pytest.fixture
def client():
    c = Client()
    c.force_login(make_user(role="viewer"))
    return c


def test_the_latest_page_opens_at_its_end_and_a_jump_does_not(client):
    ctx = make_context(messages=80)
    assert 'data-open-at="latest"' in client.get(f"/contexts/{ctx.pk}/").content.decode()
    html = client.get(f"/contexts/{ctx.pk}/", {"seq": 10}).content.decode()
    assert (
        'data-open-at="latest"' not in html
        and 'id="m-10" class="msg role-assistant is-target"' in html
    )


def test_a_message_links_to_its_run_and_its_step(client):
    ctx = make_context()
    run = make_run(context=ctx, steps=3)
    step = run.steps.get(position=3)
    messages_append(
        context=ctx,
        items=[{"role": "assistant", "text": "done", "run_id": run.pk, "step_id": step.pk}],
    )
    html = client.get(f"/contexts/{ctx.pk}/").content.decode()
    assert f'href="/runs/{run.pk}/"' in html
    assert f'<a class="runref stepref" href="/runs/{run.pk}/steps/3/">step 3</a>' in html
    # The row answered after a prune keeps the link.
    curator = Client()
    curator.force_login(make_user(role="curator"))
    message = ctx.messages.get(seq=1)
    row = curator.post(
        f"/contexts/{ctx.pk}/messages/{message.pk}/prune/", {"pruned": "1"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert f'href="/runs/{run.pk}/steps/3/"' in row and "Restore" in row


def test_long_texts_fold_to_an_escaped_preview_and_short_ones_do_not(client):
    ctx = make_context()
    messages_append(
        context=ctx,
        items=[
            {"role": "tool", "text": LONG},
            {"role": "tool", "text": "short\noutput"},
            {
                "role": "assistant",
                "content": [{"type": "tool_result", "id": "1", "name": "scan", "output": LONG}],
            },
        ],
    )
    html = client.get(f"/contexts/{ctx.pk}/").content.decode()
    assert html.count('<details class="fold">') == 2
    assert html.count("Show all 400 lines") == 2
    assert "<b>row 1</b>" not in html and "&lt;b&gt;row 400&lt;/b&gt;" in html
    short = html[html.index('id="m-2"') : html.index('id="m-3"')]
    assert "fold" not in short and "short\noutput" in short


def test_every_page_has_the_shortcut_help_and_the_loading_bar(client):
    html = client.get("/contexts/").content.decode()
    assert '<dialog id="shortcuts"' in html and 'hx-indicator="#loading"' in html
    assert 'id="loading" class="loading-bar htmx-indicator"' in html
    assert "<script>" not in html
