"""Dashboard access: roles as groups, login required everywhere, permissions checked on the
server."""

from __future__ import annotations

import importlib
import re

import pytest
from django.apps import apps as django_apps
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern, RoutePattern

from memory_app.models import AuditEvent, Message
from memory_app.roles import ROLE_CAPABILITIES, role_permissions, sync_role_groups
from tests.builders import make_context, make_run, make_user

pytestmark = pytest.mark.django_db

SAMPLES = {
    "int": "1",
    "str": "x",
    "slug": "x",
    "path": "x/y",
    "uuid": "00000000-0000-0000-0000-000000000000",
}
# Not dashboard pages: the probe, the agent API and the OTLP receivers at their standard paths
# (bearer keys), static files (and /favicon.ico, a redirect to one) and the login pages.
EXCLUDED = re.compile(
    r"^/(healthz|favicon\.ico$|api/|v1/(traces|logs)$|static/|accounts/login/|admin/login/)"
)


def _sample_route(pattern) -> str:
    if isinstance(pattern, RoutePattern):
        return re.sub(r"<(?:(\w+):)?\w+>", lambda m: SAMPLES[m.group(1) or "str"], str(pattern))
    assert isinstance(pattern, RegexPattern)
    regex = str(pattern).lstrip("^").rstrip("$").replace("\\Z", "")
    # A named group of literal alternatives (admin's app_label) takes its first alternative.
    regex = re.sub(r"\(\?P<\w+>([\w-]+)(?:\|[\w|-]+)?\)", r"\1", regex)
    regex = re.sub(r"\(\?P<\w+>[^)]*\)", "1", regex)
    return regex.replace("\\", "")


def walk(patterns=None, prefix="/"):
    """(url, callback) for every URL pattern of the site, with sample values for parameters."""
    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        route = prefix + _sample_route(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from walk(entry.url_patterns, route)
        elif isinstance(entry, URLPattern):
            yield route, entry.callback


def dashboard_urls():
    return [(url, cb) for url, cb in walk() if not EXCLUDED.match(url)]


def test_url_walk_covers_dashboard_and_admin():
    urls = [u for u, _ in dashboard_urls()]
    assert "/" in urls and "/runs/1/steps/1/" in urls and "/contexts/1/messages/1/prune/" in urls
    assert any(u.startswith("/admin/memory_app/") for u in urls)
    assert not any(u.startswith(("/healthz", "/api/", "/v1/")) for u in urls)


def test_anonymous_is_sent_to_login_from_every_dashboard_url():
    client = Client()
    failures = []
    for url, _ in dashboard_urls():
        for method in ("get", "post"):
            response = getattr(client, method)(url, follow=True)
            hops = [location for location, _ in response.redirect_chain]
            # Admin's logout goes to the admin index first, which then asks for a login.
            if not hops or not re.match(r"^/(accounts|admin)/login/\?next=", hops[-1]):
                failures.append(f"{method.upper()} {url} -> {response.status_code} {hops}")
    assert not failures, "\n".join(failures)


def test_every_dashboard_view_declares_the_capability_it_needs():
    unguarded = [
        url
        for url, cb in dashboard_urls()
        if not url.startswith(("/admin/", "/accounts/")) and not hasattr(cb, "dashboard_capability")
    ]
    assert not unguarded


def test_viewer_gets_403_from_every_editing_url():
    viewer = make_user(role="viewer")
    context = make_context(messages=2)
    run = make_run(context=context, steps=2)
    message = Message.objects.filter(context=context).first()
    client = Client()
    client.force_login(viewer)
    editing = [
        (u, cb)
        for u, cb in dashboard_urls()
        if getattr(cb, "dashboard_capability", "view") not in ("view", "read_memories")
    ]
    assert len(editing) >= 2
    for url, _ in editing:
        # Real ids so that the 403 comes from the permission check, not from a missing row.
        real = url.replace("/contexts/1/", f"/contexts/{context.pk}/").replace(
            "/messages/1/", f"/messages/{message.pk}/"
        )
        real = real.replace("/runs/1/", f"/runs/{run.pk}/")
        for method in ("get", "post"):
            response = getattr(client, method)(real, {"pruned": "1"}, HTTP_HX_REQUEST="true")
            assert response.status_code == 403, f"{method} {real}: {response.status_code}"
    assert not Message.objects.filter(context=context, pruned_at__isnull=False).exists()
    assert not AuditEvent.objects.exists()


def test_user_without_a_role_gets_403_from_reading_pages():
    client = Client()
    client.force_login(make_user(role=None))
    assert client.get("/").status_code == 403


def test_role_migration_creates_the_groups():
    migration = importlib.import_module("memory_app.migrations.0002_dashboard_roles")
    Group.objects.filter(name__in=list(ROLE_CAPABILITIES)).delete()
    migration.create_roles(django_apps, None)
    migration.create_roles(django_apps, None)  # idempotent
    assert set(Group.objects.values_list("name", flat=True)) >= set(ROLE_CAPABILITIES)


def test_roles_are_groups_with_cumulative_permissions():
    sync_role_groups()  # a transactional test elsewhere may have flushed the migration's rows
    held = {}
    for role in ROLE_CAPABILITIES:
        group = Group.objects.get(name=role)
        held[role] = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all()}
        assert held[role] == role_permissions(role)
    assert held["viewer"] < held["curator"] < held["admin"]
    assert "memory_app.change_message" not in held["viewer"]
    assert "memory_app.delete_message" not in held["curator"]
    assert {"memory_app.change_apikey", "auth.change_user", "memory_app.delete_context"} <= held[
        "admin"
    ]


def test_prune_buttons_are_shown_to_curators_only():
    context = make_context(messages=3)
    run = make_run(context=context, steps=2)
    pages = [f"/contexts/{context.pk}/", f"/runs/{run.pk}/steps/1/"]
    for role, shown in (("viewer", False), ("curator", True), ("admin", True)):
        client = Client()
        client.force_login(make_user(role=role))
        for page in pages:
            html = client.get(page).content.decode()
            assert ("/prune/" in html) is shown, (role, page)


def test_curator_prunes_and_restores_a_message_with_an_audit_trail():
    curator = make_user(role="curator")
    context = make_context(messages=3)
    message = Message.objects.get(context=context, seq=2)
    client = Client()
    client.force_login(curator)
    url = f"/contexts/{context.pk}/messages/{message.pk}/prune/"
    response = client.post(url, {"pruned": "1"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="m-2")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.strip().startswith('<article id="m-2"') and "pruned" in html and "Restore" in html
    message.refresh_from_db()
    assert message.pruned_by == f"user:{curator.username}"
    response = client.post(url, {"pruned": "0"})  # without JavaScript: back to the page
    assert response.status_code == 302
    message.refresh_from_db()
    assert message.pruned_at is None
    assert list(AuditEvent.objects.order_by("id").values_list("action", flat=True)) == [
        "prune",
        "restore",
    ]


def test_pruning_a_message_of_another_context_is_404():
    client = Client()
    client.force_login(make_user(role="curator"))
    one, other = make_context(messages=1), make_context(messages=1)
    foreign = Message.objects.get(context=other)
    assert client.post(f"/contexts/{one.pk}/messages/{foreign.pk}/prune/").status_code == 404
