"""Users (admins): create one with a role, change a role, deactivate or reactivate, set a new
password, without Django admin groups (memory_app/services/users.py holds the rules)."""

from __future__ import annotations

from django.contrib.auth import get_user_model, update_session_auth_hash
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_http_methods, require_POST

from memory_app.audit import Actor
from memory_app.errors import Conflict, DomainError
from memory_app.roles import require
from memory_app.services import users as users_service
from memory_app.views.common import htmx_partial, page, wants_fragment
from memory_app.views.user_forms import (
    ROLE_CHOICES,
    UserActiveForm,
    UserCreateForm,
    UserPasswordForm,
    UserRoleForm,
)

USERS = "memory_app/curate/users.html"
MAX_USERS = 500


def _page(**extra) -> dict:
    rows = list(
        get_user_model()
        .objects.prefetch_related("groups")
        .order_by("-is_active", "username")[:MAX_USERS]
    )
    for row in rows:
        row.role = users_service.user_role(row)
    return {"users": rows, "roles": [r for r, _ in ROLE_CHOICES], "nav_active": "users", **extra}


def _answer(request, *, status: int = 200, **extra):
    if status == 200 and not wants_fragment(request):
        return redirect("users")
    return page(request, USERS, _page(**extra), status=status)


@require("users")
@require_http_methods(["GET", "POST"])
@htmx_partial("users-panel")
def users(request):
    if request.method == "GET":
        return page(request, USERS, _page())
    form = UserCreateForm(request.POST)
    if form.is_valid():
        try:
            created = users_service.user_create(
                username=form.cleaned_data["username"],
                password=form.cleaned_data["password"],
                role=form.cleaned_data["role"],
                actor=Actor.for_user(request.user),
            )
        except DomainError as exc:
            form.add_error(None, str(exc))
    if form.errors:
        # Back in its panel with the reason and what was typed (never the password).
        return page(request, USERS, _page(form=form), status=400)
    return _answer(request, done=f"{created.get_username()} can log in now.")


def _change(request, user_id: int, form_class, apply):
    user = get_object_or_404(get_user_model(), pk=user_id)
    form = form_class(request.POST)
    if not form.is_valid():
        return _answer(request, status=400, problem=(user.pk, form.errors.as_text()))
    try:
        done = apply(user, form.cleaned_data, Actor.for_user(request.user))
    except DomainError as exc:
        return _answer(request, status=exc_status(exc), problem=(user.pk, str(exc)))
    return _answer(request, done=done)


def exc_status(exc: DomainError) -> int:
    return 409 if isinstance(exc, Conflict) else 400


@require("users")
@require_POST
@htmx_partial("users-panel")
def user_role(request, user_id: int):
    def apply(user, data, actor):
        users_service.user_set_role(user=user, role=data["role"], actor=actor)
        return f"{user.get_username()} is {data['role']} now."

    return _change(request, user_id, UserRoleForm, apply)


@require("users")
@require_POST
@htmx_partial("users-panel")
def user_active(request, user_id: int):
    def apply(user, data, actor):
        users_service.user_set_active(user=user, active=data["active"], actor=actor)
        state = "can log in again" if data["active"] else "can no longer log in"
        return f"{user.get_username()} {state}."

    return _change(request, user_id, UserActiveForm, apply)


@require("users")
@require_POST
@htmx_partial("users-panel")
def user_password(request, user_id: int):
    def apply(user, data, actor):
        users_service.user_set_password(user=user, password=data["password"], actor=actor)
        if user.pk == request.user.pk:
            # An admin setting their own password stays logged in here.
            update_session_auth_hash(request, user)
        return f"{user.get_username()} has a new password; their other sessions have ended."

    return _change(request, user_id, UserPasswordForm, apply)
