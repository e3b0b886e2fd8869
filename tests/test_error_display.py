"""Errors reach the screen: forms come back with their error (htmx swaps 4xx answers), other
errors go to the page's #flash region under htmx, and full pages are styled (400/403/404/500)."""

from __future__ import annotations

import pytest
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from memory_app.audit import Actor
from memory_app.models import ApiKey, AuditEvent, Message
from memory_app.services import curation
from memory_app.services.curation import messages_set_pruned
from memory_app.views import errors
from tests.builders import make_context, make_user

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def client_for(role: str | None, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(make_user(role=role))
    return client


def assert_flash(response, status: int, text: str) -> None:
    html = response.content.decode()
    assert response.status_code == status
    assert response["HX-Retarget"] == "#flash" and response["HX-Reswap"] == "innerHTML"
    assert html.startswith('<div class="flash-message error" role="alert">') and text in html
    assert "<html" not in html


def test_a_key_with_invalid_json_comes_back_in_its_form_with_the_error():
    client = client_for("admin")
    response = client.post(
        reverse("keys"),
        {"name": "bot", "scopes": ["read"], "context_keys": '{"tenant": '},
        **HTMX,
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert html.lstrip().startswith('<section id="keys-panel">')
    assert "must be a JSON object like" in html and 'role="alert"' in html
    assert 'value="bot"' in html and 'value="{&quot;tenant&quot;: "' in html  # kept as typed
    assert not ApiKey.objects.exists()


def test_a_key_without_a_scope_is_refused_with_the_reason():
    response = client_for("admin").post(reverse("keys"), {"name": "bot"}, **HTMX)
    assert response.status_code == 400
    assert "scopes must be a non-empty subset" in response.content.decode()
    assert not ApiKey.objects.exists()


def test_a_wrong_purge_confirmation_comes_back_in_the_purge_panel():
    context = make_context(messages=2)
    ids = list(Message.objects.filter(context=context).values_list("pk", flat=True))
    messages_set_pruned(context=context, ids=ids, pruned=True, actor=Actor.system("t"))
    later = (timezone.now() + timezone.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M")
    response = client_for("admin").post(
        reverse("purge"), {"older_than": later, "confirmation": "purge"}, **HTMX
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert html.lstrip().startswith('<section id="purge-panel"') and 'role="alert"' in html
    assert curation.PURGE_CONFIRMATION in html
    assert Message.objects.filter(pk__in=ids).count() == 2


def test_prune_selected_with_nothing_ticked_answers_in_the_flash_region():
    context = make_context(messages=2)
    response = client_for("curator").post(
        reverse("curate-prune", args=[context.pk]), {"pruned": "1"}, **HTMX
    )
    assert_flash(response, 400, "select at least one message")
    assert not AuditEvent.objects.exists()


def test_prune_selected_with_nothing_ticked_without_javascript_is_a_styled_page():
    context = make_context(messages=2)
    response = client_for("curator").post(
        reverse("curate-prune", args=[context.pk]), {"pruned": "1"}
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert "That request cannot be answered" in html and "select at least one message" in html
    assert 'class="topbar"' in html


def test_an_edit_to_empty_text_is_refused_in_the_row_and_nothing_changes():
    context = make_context(messages=1)
    message = Message.objects.get(context=context)
    url = reverse("curate-message-edit", args=[context.pk, message.pk])
    client = client_for("curator")
    for blank in ("", "  \n "):
        response = client.post(url, {"text": blank, "tags": "kept, typed"}, **HTMX)
        html = response.content.decode()
        assert response.status_code == 400
        assert html.lstrip().startswith(f'<article id="cm-{message.pk}"')
        assert "the text cannot be empty" in html and 'value="kept, typed"' in html
    assert client.post(url, {"text": ""}).status_code == 400
    message.refresh_from_db()
    assert message.text == "message 1" and not AuditEvent.objects.exists()
    # Text blocks are only the text again: a message made of them cannot be emptied either.
    Message.objects.filter(pk=message.pk).update(content=[{"type": "text", "text": "message 1"}])
    assert client.post(url, {"text": " "}, **HTMX).status_code == 400


def test_a_message_with_structured_content_may_have_empty_text():
    context = make_context(messages=0)
    from memory_app.services.messages import messages_append

    [message] = messages_append(
        context=context,
        items=[
            {
                "role": "assistant",
                "text": "x",
                "content": [{"type": "tool_use", "id": "1", "name": "search", "input": {}}],
            }
        ],
    ).messages
    response = client_for("curator").post(
        reverse("curate-message-edit", args=[context.pk, message.pk]), {"text": ""}, **HTMX
    )
    assert response.status_code == 200
    message.refresh_from_db()
    assert message.text == ""


def test_404_and_403_under_htmx_go_to_the_flash_region():
    assert_flash(client_for("curator").get("/contexts/987654/curate/", **HTMX), 404, "Not found")
    context = make_context(messages=1)
    response = client_for("viewer").get(reverse("curate-history", args=[context.pk]), **HTMX)
    assert_flash(response, 403, "needs the &#x27;curate&#x27; capability")


def test_403_404_pages_are_styled_and_keep_the_navigation():
    viewer = client_for("viewer")
    for url, status, title in (
        ("/keys/", 403, "Not allowed"),
        ("/contexts/987654/", 404, "Not found"),
        ("/no/such/page/", 404, "Not found"),
    ):
        response = viewer.get(url)
        html = response.content.decode()
        assert response.status_code == status, url
        assert f"<h1>{title}</h1>" in html and 'class="topbar"' in html and "/static/" in html
        assert "<script>" not in html  # the CSP forbids inline script: only script files


def test_a_refused_csrf_check_is_a_styled_403():
    client = client_for("curator", enforce_csrf_checks=True)
    context = make_context(messages=1)
    response = client.post(reverse("curate-prune", args=[context.pk]), {"ids": [1]})
    assert response.status_code == 403
    assert "The form expired or came from another site" in response.content.decode()


def test_the_500_page_needs_no_database(django_assert_num_queries):
    request = RequestFactory().get("/contexts/")
    with django_assert_num_queries(0):
        response = errors.server_error(request)
    html = response.content.decode()
    assert response.status_code == 500 and "Something went wrong on the server" in html
    assert "<script" not in html and "/static/memory_app/app.css" in html
    htmx = errors.server_error(RequestFactory().get("/contexts/", **HTMX))
    assert htmx.status_code == 500 and htmx["HX-Retarget"] == "#flash"


def test_unknown_api_urls_answer_json():
    response = Client().get("/api/v1/no-such-thing")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json") and "detail" in response.json()
