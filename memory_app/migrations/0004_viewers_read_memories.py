"""Viewers read long-term memories (README's role table): give the role groups their new permissions."""

from django.db import migrations


def sync_roles(apps, schema_editor):
    from memory_app.roles import sync_role_groups

    sync_role_groups(apps)


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0003_message_token_indexes")]

    operations = [migrations.RunPython(sync_roles, migrations.RunPython.noop)]
