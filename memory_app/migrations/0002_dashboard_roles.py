"""Create the dashboard roles (viewer, curator, admin) as groups with their permissions.

The permissions are the ones memory_app/roles.py gave each role when this migration was written,
kept here so that a later change to the roles never changes what this step does (0004 and later
migrations change them)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

_VIEW = (
    "memory_app.view_context",
    "memory_app.view_message",
    "memory_app.view_run",
    "memory_app.view_step",
    "memory_app.view_toolcall",
)
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
    "viewer": _VIEW,
    "curator": _VIEW + _CURATE + _MEMORIES + _AUDIT,
    "admin": _VIEW + _CURATE + _MEMORIES + _AUDIT + _KEYS + _PURGE + _USERS,
}


def set_role_groups(apps, role_permissions):
    """Create or update each group with exactly its permissions ("app_label.codename")."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for role, wanted in role_permissions.items():
        perms = []
        for full in sorted(set(wanted)):
            app_label, codename = full.split(".", 1)
            perms.append(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(perms)


def create_roles(apps, schema_editor):
    # Permissions are normally created after all migrations ran (post_migrate); on a fresh
    # database they do not exist yet, so create them now for the apps the roles refer to.
    for label in ("auth", "memory_app"):
        app_config = apps.get_app_config(label)
        # create_permissions skips app configs without a models module. Restore the value
        # afterwards: the config object may be the process-wide one (when migrate runs inside
        # a longer-lived process such as the test runner or `serve`), and leaving it None
        # silently disables post_migrate permission creation for the rest of that process.
        had_attr = hasattr(app_config, "models_module")
        original = getattr(app_config, "models_module", None)
        app_config.models_module = original or True
        try:
            create_permissions(app_config, apps=apps, verbosity=0)
        finally:
            if had_attr:
                app_config.models_module = original
            else:
                del app_config.models_module
    set_role_groups(apps, ROLE_PERMISSIONS)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["viewer", "curator", "admin"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
