"""Viewers read long-term memories (README's role table): give the role groups their new permissions.

The permissions are the ones memory_app/roles.py gives each role as this migration is written,
kept here so that a later change to the roles never changes what this step does."""

from django.db import migrations

_VIEW = (
    "memory_app.view_context",
    "memory_app.view_message",
    "memory_app.view_run",
    "memory_app.view_step",
    "memory_app.view_toolcall",
)
_READ_MEMORIES = ("memory_app.view_memoryrecord",)
_CURATE = ("memory_app.change_message", "memory_app.change_step", "memory_app.change_context")
_MEMORIES = (
    "memory_app.add_memoryrecord",
    "memory_app.change_memoryrecord",
    "memory_app.view_memoryrecord",
)
_AUDIT = ("memory_app.view_auditevent",)
_KEYS = ("memory_app.add_apikey", "memory_app.change_apikey", "memory_app.view_apikey")
_PURGE = ("memory_app.delete_message", "memory_app.delete_context", "memory_app.delete_run")
_USERS = ("auth.add_user", "auth.change_user", "auth.view_user")

ROLE_PERMISSIONS = {
    "viewer": _VIEW + _READ_MEMORIES,
    "curator": _VIEW + _READ_MEMORIES + _CURATE + _MEMORIES + _AUDIT,
    "admin": _VIEW + _READ_MEMORIES + _CURATE + _MEMORIES + _AUDIT + _KEYS + _PURGE + _USERS,
}


def sync_roles(apps, schema_editor):
    """Create or update each group with exactly its permissions ("app_label.codename")."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for role, wanted in ROLE_PERMISSIONS.items():
        perms = []
        for full in sorted(set(wanted)):
            app_label, codename = full.split(".", 1)
            perms.append(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(perms)


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0003_message_token_indexes")]

    operations = [migrations.RunPython(sync_roles, migrations.RunPython.noop)]
