"""Namespace items (LangGraph's store): a memory record addressed by a namespace path and a key
in its key-subset scope, with an optional time to live. Existing records get NULLs (no rewrite);
the partial indexes hold the items only."""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0023_shard_safe_search_triggers'),
    ]

    operations = [
        migrations.AddField(
            model_name='memoryrecord',
            name='item_expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='memoryrecord',
            name='item_key',
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='memoryrecord',
            name='item_ttl',
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='memoryrecord',
            name='namespace',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.TextField(), blank=True, null=True, size=None),
        ),
        migrations.AddConstraint(
            model_name='memoryrecord',
            constraint=models.UniqueConstraint(condition=models.Q(('namespace__isnull', False)), fields=('scope_digest', 'namespace', 'item_key'), name='memory_store_item_unique'),
        ),
        migrations.AddIndex(
            model_name='memoryrecord',
            index=models.Index(condition=models.Q(('namespace__isnull', False)), fields=['scope_digest', 'namespace', 'id'], name='memory_store_ns_first_idx'),
        ),
        migrations.AddConstraint(
            model_name='memoryrecord',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('item_key__isnull', True), ('namespace__isnull', True)), models.Q(('context__isnull', True), ('item_key__isnull', False), ('namespace__isnull', False)), _connector='OR'), name='memory_store_item_shape'),
        ),
    ]
