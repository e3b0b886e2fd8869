"""Memories agents propose: a record's review `status`, an API key's `memory_review` policy, and
the `approve_memoryrecord` permission curators and admins hold (no API key scope grants it).

Existing records stay `live` and existing keys record live memories: nothing changes until an
admin turns a key's review on. The new column takes a constant default (no table rewrite); the
partial index holds the proposals only, for the review inbox.

Frozen: the permission and the roles that get it are written out here, as memory_app/roles.py
gives them when this migration is written."""

from django.contrib.auth.management import create_permissions
from django.db import migrations, models

APPROVE = "approve_memoryrecord"
ROLES = ("curator", "admin")


def grant_approve(apps, schema_editor):
    # The new permission is normally created after all migrations ran (post_migrate); the groups
    # need it now. See 0002 for why models_module is set and restored around the call.
    app_config = apps.get_app_config("memory_app")
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
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    perm = Permission.objects.get(content_type__app_label="memory_app", codename=APPROVE)
    for group in Group.objects.filter(name__in=ROLES):
        group.permissions.add(perm)


def revoke_approve(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    perm = Permission.objects.filter(
        content_type__app_label="memory_app", codename=APPROVE
    ).first()
    if perm is not None:
        for group in Group.objects.filter(name__in=ROLES):
            group.permissions.remove(perm)


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0020_context_keys")]

    operations = [
        migrations.AlterModelOptions(
            name="memoryrecord",
            options={"permissions": [(APPROVE, "Can approve proposed memories")]},
        ),
        migrations.AddField(
            model_name="apikey",
            name="memory_review",
            field=models.CharField(
                choices=[("live", "Live"), ("proposed", "Proposed")], default="live", max_length=10
            ),
        ),
        migrations.AddField(
            model_name="memoryrecord",
            name="status",
            field=models.CharField(
                choices=[
                    ("proposed", "Proposed"),
                    ("live", "Live"),
                    ("rejected", "Rejected"),
                    ("merged", "Merged"),
                ],
                default="live",
                max_length=20,
            ),
        ),
        migrations.AddIndex(
            model_name="memoryrecord",
            index=models.Index(
                condition=models.Q(("status", "proposed")),
                fields=["created_at", "id"],
                name="memory_proposed_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.CheckConstraint(
                condition=models.Q(("memory_review__in", ["live", "proposed"])),
                name="apikey_memory_review_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="memoryrecord",
            constraint=models.CheckConstraint(
                condition=models.Q(("status__in", ["proposed", "live", "rejected", "merged"])),
                name="memory_status_valid",
            ),
        ),
        migrations.RunPython(grant_approve, revoke_approve),
    ]
