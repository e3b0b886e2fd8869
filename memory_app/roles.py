"""Dashboard roles as Django groups, and the one check every dashboard view makes.

Roles are cumulative: a curator can do what a viewer can, an admin what a curator can. They are
plain Django groups holding model permissions (created by migration `0002_dashboard_roles`), so
an operator can also grant a single permission to a single user in the Django admin.

Views name a *capability* (`view`, `read_memories`, `curate`, `memories`, `approve`, `keys`,
`purge`, `users`) rather than a permission codename, so templates and views agree on what a
button needs.
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied

VIEWER, CURATOR, ADMIN = "viewer", "curator", "admin"

# Permission codenames ("app_label.codename") each capability needs; all of them must be held.
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "view": (
        "memory_app.view_context",
        "memory_app.view_message",
        "memory_app.view_run",
        "memory_app.view_step",
        "memory_app.view_toolcall",
    ),
    # Edit, prune and restore messages and steps (pruning is a reversible soft delete).
    "curate": ("memory_app.change_message", "memory_app.change_step", "memory_app.change_context"),
    # Read long-term memories (list, search, open one).
    "read_memories": ("memory_app.view_memoryrecord",),
    # Record, edit, archive, merge and promote long-term memories.
    "memories": (
        "memory_app.add_memoryrecord",
        "memory_app.change_memoryrecord",
        "memory_app.view_memoryrecord",
    ),
    # Approve, reject or merge what agents propose (no API key scope grants it).
    "approve": ("memory_app.approve_memoryrecord", "memory_app.view_memoryrecord"),
    "audit": ("memory_app.view_auditevent",),
    "keys": ("memory_app.add_apikey", "memory_app.change_apikey", "memory_app.view_apikey"),
    # Irreversible deletion.
    "purge": ("memory_app.delete_message", "memory_app.delete_context", "memory_app.delete_run"),
    "users": ("auth.add_user", "auth.change_user", "auth.view_user"),
}

ROLE_CAPABILITIES: dict[str, tuple[str, ...]] = {
    VIEWER: ("view", "read_memories"),
    CURATOR: ("view", "read_memories", "curate", "memories", "approve", "audit"),
    ADMIN: (
        "view",
        "read_memories",
        "curate",
        "memories",
        "approve",
        "audit",
        "keys",
        "purge",
        "users",
    ),
}


def role_permissions(role: str) -> set[str]:
    """Every "app_label.codename" the group for `role` holds."""
    return {perm for cap in ROLE_CAPABILITIES[role] for perm in CAPABILITIES[cap]}


def user_can(user, capability: str) -> bool:
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}")
    return bool(
        user
        and user.is_authenticated
        and user.is_active
        and user.has_perms(CAPABILITIES[capability])
    )


def require(capability: str):
    """View decorator: anonymous users go to the login page, users without the capability get 403.

    The capability is kept on the view (`view.dashboard_capability`) so tests can walk the URL
    configuration and prove every dashboard view is guarded.
    """
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}")

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not user_can(request.user, capability):
                raise PermissionDenied(f"needs the {capability!r} capability")
            return view(request, *args, **kwargs)

        wrapped.dashboard_capability = capability
        return wrapped

    return decorator


def sync_role_groups(apps=None) -> None:
    """Create or update the three groups with exactly their permissions (idempotent)."""
    if apps is None:
        from django.apps import apps as global_apps

        apps = global_apps
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for role in ROLE_CAPABILITIES:
        wanted = role_permissions(role)
        perms = []
        for full in sorted(wanted):
            app_label, codename = full.split(".", 1)
            perms.append(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(perms)
