"""Users and roles on the dashboard: admins create users with a role, change roles, deactivate
and reactivate, set passwords; audited; never leaving the dashboard without an active admin."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from memory_app.models import AuditEvent
from memory_app.roles import user_can
from memory_app.services.users import user_role
from tests.builders import TEST_PASSWORD, make_user

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "a-long-and-unusual-passphrase-7"
HX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "users-panel"}


@pytest.fixture
def boss():
    return make_user(role="admin", username="boss")


@pytest.fixture
def admin(boss) -> Client:
    client = Client()
    client.force_login(boss)
    return client


def logs_in(username: str, password: str) -> bool:
    """Through the login form (django-axes watches it): a login that works redirects."""
    answer = Client().post("/accounts/login/", {"username": username, "password": password})
    return answer.status_code == 302


def test_an_admin_creates_a_user_with_a_role_who_can_log_in(admin):
    page = admin.get("/users/")
    assert page.status_code == 200 and b"boss" in page.content
    answer = admin.post(
        "/users/", {"username": "nina", "password": NEW_PASSWORD, "role": "curator"}, **HX
    )
    assert answer.status_code == 200 and b"nina can log in now." in answer.content
    nina = get_user_model().objects.get(username="nina")
    assert user_role(nina) == "curator" and user_can(nina, "curate")
    assert not user_can(nina, "keys") and not nina.is_staff
    assert logs_in("nina", NEW_PASSWORD)
    event = AuditEvent.objects.get(action="user_create")
    assert event.actor == "user:boss" and event.target_ids == [nina.pk]
    assert event.after == {"username": "nina", "role": "curator", "active": True}
    assert NEW_PASSWORD not in str(event.after) + str(event.before) + event.note


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"username": "weak", "password": "123", "role": "viewer"}, b"too short"),
        ({"username": "odd", "password": NEW_PASSWORD, "role": "owner"}, b"owner"),
        ({"username": "boss", "password": NEW_PASSWORD, "role": "viewer"}, b"exists already"),
        ({"username": "", "password": NEW_PASSWORD, "role": "viewer"}, b"required"),
    ],
)
def test_a_bad_new_user_is_refused_with_the_reason_and_nothing_written(admin, fields, reason):
    answer = admin.post("/users/", fields, **HX)
    assert answer.status_code == 400 and reason in answer.content
    assert get_user_model().objects.count() == 1
    assert not AuditEvent.objects.exists()
    assert NEW_PASSWORD.encode() not in answer.content


def test_roles_change_and_a_deactivated_user_cannot_log_in(admin):
    vera = make_user(role="viewer", username="vera")
    assert admin.post(f"/users/{vera.pk}/role/", {"role": "admin"}, **HX).status_code == 200
    assert user_role(vera) == "admin" and user_can(vera, "users")
    assert [g.name for g in vera.groups.all()] == ["admin"]
    answer = admin.post(f"/users/{vera.pk}/active/", {"active": "0"}, **HX)
    assert answer.status_code == 200 and b"vera can no longer log in." in answer.content
    assert not logs_in("vera", TEST_PASSWORD)
    admin.post(f"/users/{vera.pk}/active/", {"active": "1"}, **HX)
    assert logs_in("vera", TEST_PASSWORD)
    actions = list(
        AuditEvent.objects.filter(target_type="user").order_by("pk").values_list("action", "after")
    )
    assert actions == [
        ("user_role", {"username": "vera", "role": "admin"}),
        ("user_deactivate", {"username": "vera", "active": False}),
        ("user_activate", {"username": "vera", "active": True}),
    ]


def test_a_new_password_ends_the_users_sessions(admin):
    vera = make_user(role="viewer", username="vera")
    session = Client()
    session.force_login(vera)
    assert session.get("/runs/").status_code == 200
    answer = admin.post(f"/users/{vera.pk}/password/", {"password": NEW_PASSWORD}, **HX)
    assert answer.status_code == 200, answer.content
    assert session.get("/runs/").status_code == 302  # back to the login page
    assert logs_in("vera", NEW_PASSWORD) and not logs_in("vera", TEST_PASSWORD)
    assert AuditEvent.objects.get(action="user_password").target_ids == [vera.pk]
    weak = admin.post(f"/users/{vera.pk}/password/", {"password": "vera"}, **HX)
    assert weak.status_code == 400 and logs_in("vera", NEW_PASSWORD)


def test_the_last_active_admin_cannot_demote_or_deactivate_themselves(admin, boss):
    for path, data in (
        (f"/users/{boss.pk}/role/", {"role": "curator"}),
        (f"/users/{boss.pk}/active/", {"active": "0"}),
    ):
        answer = admin.post(path, data, **HX)
        assert answer.status_code == 409 and b"last active admin" in answer.content
    boss.refresh_from_db()
    assert boss.is_active and user_role(boss) == "admin"
    assert not AuditEvent.objects.exists()
    # With a second admin, stepping down is fine; the other admin is then the last one.
    other = make_user(role="admin", username="other")
    assert admin.post(f"/users/{boss.pk}/role/", {"role": "curator"}, **HX).status_code == 200
    assert user_role(boss) == "curator"
    assert user_role(get_user_model().objects.get(pk=other.pk)) == "admin"


def test_an_inactive_admin_does_not_count_as_the_admin_left(admin, boss):
    make_user(role="admin", username="gone").__class__.objects.filter(username="gone").update(
        is_active=False
    )
    answer = admin.post(f"/users/{boss.pk}/active/", {"active": "0"}, **HX)
    assert answer.status_code == 409


@pytest.mark.parametrize("role", ["viewer", "curator"])
def test_only_admins_manage_users(role):
    client = Client()
    target = make_user(role="viewer", username="target")
    client.force_login(make_user(role=role))
    assert client.get("/users/").status_code == 403
    assert client.post(f"/users/{target.pk}/role/", {"role": "admin"}).status_code == 403
    assert (
        client.post(
            "/users/", {"username": "x", "password": NEW_PASSWORD, "role": "admin"}
        ).status_code
        == 403
    )
    assert user_role(target) == "viewer"
    assert b'href="/users/"' not in client.get("/runs/").content


def test_bad_input_to_a_change_is_a_400(admin):
    vera = make_user(role="viewer", username="vera")
    assert admin.post(f"/users/{vera.pk}/role/", {"role": "root"}, **HX).status_code == 400
    assert admin.post(f"/users/{vera.pk}/active/", {"active": "maybe"}, **HX).status_code == 400
    assert admin.post("/users/999999/role/", {"role": "viewer"}, **HX).status_code == 404
    assert user_role(vera) == "viewer" and not AuditEvent.objects.exists()
