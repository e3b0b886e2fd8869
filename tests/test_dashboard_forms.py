"""Dashboard input goes through forms: every view declares its methods (a wrong one is 405), bad
filter values come back as the form's errors in a 400, and NUL in a filter is a 400, never a 500."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from memory_app.audit import Actor
from memory_app.models import ApiKey, AuditEvent, Message, ReviewQueue, Step
from memory_app.services.memories import memory_promote
from memory_app.urls import urlpatterns
from memory_app.views.forms import MomentField
from tests.builders import make_context, make_run, make_user

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}

# Views that only read: a POST is refused before anything is looked at.
GET_ONLY = {
    "home",
    "contexts",
    "runs",
    "run-compare",
    "search",
    "context",
    "context-runs",
    "run",
    "run-live",
    "run-step",
    "step-model-input",
    "step-transcript",
    "step-outputs",
    "curate-history",
    "curate-message-row",
    "curate-bulk",
    "playground",
    "curate-run",
    "memories",
    "memory-inbox",
    "memory-history",
    "audit",
    "audit-entry",
    "scores-export",
}
POST_ONLY = {
    "logout",
    "message-prune",
    "step-prune",
    "curate-prune",
    "curate-bulk-apply",
    "curate-steps-prune",
    "memory-merge",
    "memory-archive",
    "memory-purge",
    "memory-expiry",
    "memory-legal-hold",
    "memory-restore",
    "memory-undo",
    "memory-inbox-decide",
    "memory-inbox-merge",
    "memory-inbox-edit",
    "key-review",
    "memory-promote-message",
    "memory-promote-step",
    "audit-undo",
    "key-revoke",
    "embedding-model-add",
    "run-review",
    "user-role",
    "user-active",
    "user-password",
}


@pytest.fixture
def admin() -> Client:
    client = Client()
    client.force_login(make_user(role="admin"))
    return client


@pytest.fixture
def urls() -> dict[str, str]:
    """Every dashboard URL by name, with real ids."""
    context = make_context(messages=3)
    run = make_run(context=context, steps=2)
    message = Message.objects.filter(context=context).order_by("seq").first()
    step = Step.objects.filter(run=run).order_by("position").first()
    event = AuditEvent.objects.create(
        actor="x", action="prune", target_type="message", target_ids=[message.pk], context=context
    )
    memory, _ = memory_promote(actor=Actor.system("t"), message=message)
    key = ApiKey.objects.create(
        name="k", prefix="abcdefabcdef", secret_hash="0" * 64, scopes=["read"]
    )
    ids = {
        "context_id": context.pk,
        "message_id": message.pk,
        "run_id": run.pk,
        "position": 1,
        "memory_id": memory.pk,
        "step_id": step.pk,
        "event_id": event.pk,
        "key_id": key.pk,
        "user_id": make_user(role="viewer").pk,
        "queue_id": ReviewQueue.objects.create(
            name="q", score_name="correct", score_kind="boolean"
        ).pk,
    }
    return {
        p.name: reverse(p.name, kwargs={n: ids[n] for n in p.pattern.converters})
        for p in urlpatterns
    }


def test_the_method_lists_cover_every_dashboard_url(urls):
    both = {"login", "curate-message-edit", "memory-edit", "keys", "purge", "retention", "erasure"}
    both |= {"queues", "queue", "users"}
    assert set(urls) == GET_ONLY | POST_ONLY | both


def test_a_post_to_a_view_that_only_reads_is_405(admin, urls):
    for name in GET_ONLY:
        response = admin.post(urls[name], {"pruned": "1"})
        assert response.status_code == 405, name
        assert response["Allow"] == "GET", name
    assert not AuditEvent.objects.exclude(action__in=["prune", "memory_promote"]).exists()


def test_a_get_of_a_view_that_only_writes_is_405(admin, urls):
    for name in POST_ONLY - {"logout"}:
        response = admin.get(urls[name])
        assert response.status_code == 405, name
        assert response["Allow"] == "POST", name


def test_no_dashboard_view_answers_put_or_delete(admin, urls):
    for name, url in urls.items():
        # A signed-in visitor is sent on from the login page whatever the method.
        client = Client() if name == "login" else admin
        for method in ("PUT", "DELETE", "PATCH"):
            assert client.generic(method, url).status_code == 405, f"{method} {name}"


def test_a_bad_filter_comes_back_as_the_forms_error_on_the_400_page(admin):
    context = make_context(messages=2)
    response = admin.get(reverse("context", args=[context.pk]), {"seq": "abc"})
    html = response.content.decode()
    assert response.status_code == 400
    assert "That request cannot be answered" in html and 'class="topbar"' in html
    assert (
        '<span class="form-error">seq: must be a whole number, got &#x27;abc&#x27;</span>' in html
    )
    response = admin.get(reverse("audit"), {"since": "never", "context": "0"})
    html = response.content.decode()
    assert response.status_code == 400
    assert "since: must be a date and time like 2025-01-31T14:00" in html
    assert "context: must be at least 1" in html


def test_a_bad_filter_under_htmx_is_the_forms_error_in_the_flash_region(admin):
    context = make_context(messages=2)
    response = admin.get(
        reverse("curate-bulk", args=[context.pk]), {"role": "robot", "after_seq": "x"}, **HTMX
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert response["HX-Retarget"] == "#flash"
    assert html.startswith('<div class="flash-message error" role="alert">') and "<html" not in html
    assert "role: must be one of" in html and "after seq: must be a whole number" in html


def test_one_date_field_reads_the_browsers_datetime_local_in_the_server_time_zone(admin):
    context = make_context(messages=2)
    url = reverse("curate-bulk", args=[context.pk])
    response = admin.get(url, {"before_time": "2025-01-31T14:00"})
    assert response.status_code == 200
    assert response.context["params"]["before_time"] == "2025-01-31T14:00"
    assert response.context["describe"] and "preview" in response.context
    assert MomentField().clean("2025-01-31T14:00") == timezone.make_aware(
        datetime(2025, 1, 31, 14, 0)
    )
    assert MomentField().clean("2025-01-31T14:00+02:00") == datetime(2025, 1, 31, 12, 0, tzinfo=UTC)
    for bad in ("yesterday", "2025-13-01T00:00"):
        assert admin.get(url, {"after_time": bad}).status_code == 400
        assert admin.get(reverse("audit"), {"until": bad}).status_code == 400
        assert admin.get(reverse("purge"), {"older_than": bad}).status_code == 400


@pytest.mark.parametrize(
    "name, params",
    [
        ("contexts", {"q": "a\x00b"}),
        ("contexts", {"key": "user=a\x00"}),
        ("runs", {"error": "a\x00"}),
        ("runs", {"key": "user=a\x00"}),
        ("context", {"q": "\x00"}),
        ("context", {"tag": "t\x00"}),
        ("memories", {"q": "\x00"}),
        ("memories", {"scope": "user=\x00"}),
        ("audit", {"actor": "a\x00"}),
        ("curate-bulk", {"text": "a\x00"}),
        ("purge", {"older_than": "2025-01-31\x00"}),
    ],
)
def test_nul_in_a_filter_is_a_clear_400(admin, name, params):
    context = make_context(messages=2)
    url = reverse(name, args=[context.pk]) if name in ("context", "curate-bulk") else reverse(name)
    response = admin.get(url, params)
    assert response.status_code == 400
    assert "That request cannot be answered" in response.content.decode()
    flash = admin.get(url, params, **HTMX)
    assert flash.status_code == 400 and flash["HX-Retarget"] == "#flash"


def test_nul_in_a_posted_field_is_a_400_and_nothing_changes(admin):
    context = make_context(messages=1)
    message = Message.objects.get(context=context)
    url = reverse("curate-message-edit", args=[context.pk, message.pk])
    response = admin.post(url, {"text": "fine", "tags": "a\x00b"})
    assert response.status_code == 400
    assert "Null characters are not allowed" in response.content.decode()
    message.refresh_from_db()
    assert message.text == "message 1" and not AuditEvent.objects.exists()


def test_a_history_restore_gets_the_whole_page_where_htmx_gets_the_declared_partial(admin):
    context = make_context(messages=2)
    url = reverse("context", args=[context.pk])
    fragment = admin.get(url, **HTMX).content.decode()
    assert fragment.lstrip().startswith('<section id="history"') and "<html" not in fragment
    whole = admin.get(url, HTTP_HX_HISTORY_RESTORE_REQUEST="true", **HTMX).content.decode()
    assert "<html" in whole


def test_dashboard_views_do_not_import_the_api():
    views = Path(__file__).resolve().parent.parent / "memory_app" / "views"
    for module in views.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                assert not name.startswith("memory_app.api"), f"{module.name} imports {name}"
