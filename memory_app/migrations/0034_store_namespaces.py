"""The namespaces of LangGraph's store that agents have touched, per key subset: they stay listed
after their items are deleted and order a search's namespaces, as `InMemoryStore`'s do. Filled
from the items recorded so far (deleted ones too), in the order each namespace was first
written; a local table on Citus, like the memories. The index that found a namespace's first
item is dropped: the namespaces' own ids order them now."""

import django.contrib.postgres.fields
import django.contrib.postgres.indexes
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0033_span_queue'),
    ]

    operations = [
        migrations.CreateModel(
            name='StoreNamespace',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('scope_digest', models.CharField(max_length=64)),
                ('scope_keys', models.JSONField(default=dict)),
                ('namespace', django.contrib.postgres.fields.ArrayField(base_field=models.TextField(), size=None)),
                ('touched_at', models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.RemoveIndex(
            model_name='memoryrecord',
            name='memory_store_ns_first_idx',
        ),
        migrations.AddIndex(
            model_name='storenamespace',
            index=django.contrib.postgres.indexes.GinIndex(fields=['scope_keys'], name='store_namespace_keys_gin', opclasses=['jsonb_path_ops']),
        ),
        migrations.AddConstraint(
            model_name='storenamespace',
            constraint=models.UniqueConstraint(fields=('scope_digest', 'namespace'), name='store_namespace_unique'),
        ),
        migrations.RunSQL(
            sql="""
                INSERT INTO memory_app_storenamespace (scope_digest, scope_keys, namespace, touched_at)
                SELECT scope_digest, scope_keys, namespace, created_at
                FROM (
                    SELECT scope_digest, namespace,
                        min(id) OVER (PARTITION BY scope_digest, namespace) AS min_id,
                        id, scope_keys, created_at
                    FROM memory_app_memoryrecord
                    WHERE namespace IS NOT NULL
                ) AS firsts
                WHERE id = min_id
                ORDER BY min_id
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
