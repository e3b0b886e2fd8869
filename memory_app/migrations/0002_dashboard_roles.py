"""Create the dashboard roles (viewer, curator, admin) as groups with their permissions."""

from django.contrib.auth.management import create_permissions
from django.db import migrations


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
    from memory_app.roles import sync_role_groups

    sync_role_groups(apps)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["viewer", "curator", "admin"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
