"""Dashboard users, managed by admins on the dashboard: create with a role, change the role,
deactivate or reactivate, set a new password. Roles are the groups of `memory_app.roles`; a user
holds at most one of them. Every change is audited (never the password), and no change may leave
the dashboard without an active admin."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from memory_app.audit import Actor, audit_record
from memory_app.errors import Conflict, Invalid
from memory_app.roles import ADMIN, ROLE_CAPABILITIES, sync_role_groups

ROLES = tuple(ROLE_CAPABILITIES)  # viewer, curator, admin


def user_role(user) -> str:
    """The highest role a user holds ("" when none)."""
    names = {g.name for g in user.groups.all()}
    return next((role for role in reversed(ROLES) if role in names), "")


def _groups() -> dict[str, Group]:
    groups = {g.name: g for g in Group.objects.filter(name__in=ROLES)}
    if len(groups) < len(ROLES):
        # A database restored from an older backup, or flushed: the groups come back as defined.
        sync_role_groups()
        groups = {g.name: g for g in Group.objects.filter(name__in=ROLES)}
    return groups


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise Invalid(f"role must be one of {', '.join(ROLES)}")


def _check_password(password: str, user=None) -> None:
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise Invalid(" ".join(exc.messages)) from None


def _lock_admins() -> list[int]:
    """The active admins' ids, their rows locked so two changes cannot both remove the last."""
    User = get_user_model()
    return list(
        User.objects.select_for_update(of=("self",))
        .filter(is_active=True, groups__name=ADMIN)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _keep_an_admin(user, *, stays_admin: bool) -> None:
    admins = _lock_admins()
    if not stays_admin and admins == [user.pk]:
        raise Conflict(
            f"{user.get_username()} is the last active admin: make another user admin first"
        )


def user_create(*, username: str, password: str, role: str, actor: Actor):
    _check_role(role)
    User = get_user_model()
    username = username.strip()
    if not username:
        raise Invalid("a username is needed")
    candidate = User(username=username)
    _check_password(password, candidate)
    with transaction.atomic():
        if User.objects.filter(username__iexact=username).exists():
            raise Conflict(f"a user named {username} exists already")
        user = User.objects.create_user(username=username, password=password)
        user.groups.add(_groups()[role])
        audit_record(
            actor=actor,
            action="user_create",
            target_type="user",
            target_ids=[user.pk],
            after={"username": username, "role": role, "active": True},
        )
    return user


def user_set_role(*, user, role: str, actor: Actor):
    _check_role(role)
    with transaction.atomic():
        before = user_role(user)
        if before == role:
            return user
        if before == ADMIN and user.is_active:
            _keep_an_admin(user, stays_admin=False)
        groups = _groups()
        user.groups.remove(*groups.values())
        user.groups.add(groups[role])
        audit_record(
            actor=actor,
            action="user_role",
            target_type="user",
            target_ids=[user.pk],
            before={"username": user.get_username(), "role": before},
            after={"username": user.get_username(), "role": role},
        )
    return user


def user_set_active(*, user, active: bool, actor: Actor):
    """Deactivate (the user can no longer log in; their sessions stop working) or reactivate."""
    with transaction.atomic():
        if user.is_active == active:
            return user
        if not active and user_role(user) == ADMIN:
            _keep_an_admin(user, stays_admin=False)
        user.is_active = active
        user.save(update_fields=["is_active"])
        audit_record(
            actor=actor,
            action="user_activate" if active else "user_deactivate",
            target_type="user",
            target_ids=[user.pk],
            before={"username": user.get_username(), "active": not active},
            after={"username": user.get_username(), "active": active},
        )
    return user


def user_set_password(*, user, password: str, actor: Actor):
    """A new password (the user's other sessions end: Django ties them to the password hash)."""
    _check_password(password, user)
    with transaction.atomic():
        user.set_password(password)
        user.save(update_fields=["password"])
        audit_record(
            actor=actor,
            action="user_password",
            target_type="user",
            target_ids=[user.pk],
            note=f"password of {user.get_username()} set",
        )
    return user
