"""The queue of OTLP exports acknowledged and not yet mapped into runs and steps.

Born ready for Citus (docs/scale-out.md): rows carry their context, which is part of the
primary key `(id, context_id)`, so the table is distributed by it and co-located with the
contexts; the mapping worker claims one context's rows at a time. Trace spans get an index on
their trace id: the receiver looks up which context a trace went to before it knows it.

Frozen: the SQL is written out here.
"""

import django.contrib.postgres.fields
import django.contrib.postgres.indexes
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0032_local_tables_hold_no_keys_into_shards'),
    ]

    operations = [
        migrations.CreateModel(
            name='SpanQueue',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('trace_ids', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=32), size=None)),
                ('span_count', models.IntegerField()),
                ('payload', models.TextField()),
                ('received_at', models.DateTimeField(auto_now_add=True)),
                ('error', models.TextField(blank=True, default='')),
                ('context', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='memory_app.context')),
            ],
            options={
                'indexes': [django.contrib.postgres.indexes.GinIndex(fields=['trace_ids'], name='spanqueue_trace_ids_gin')],
            },
        ),
        migrations.AddIndex(
            model_name='tracespan',
            index=models.Index(fields=['trace_id'], name='tracespan_trace_idx'),
        ),
        migrations.RunSQL(
            "ALTER TABLE memory_app_spanqueue DROP CONSTRAINT memory_app_spanqueue_pkey,"
            " ADD CONSTRAINT memory_app_spanqueue_pkey PRIMARY KEY (id, context_id);",
            "ALTER TABLE memory_app_spanqueue DROP CONSTRAINT memory_app_spanqueue_pkey,"
            " ADD CONSTRAINT memory_app_spanqueue_pkey PRIMARY KEY (id);",
        ),
    ]
