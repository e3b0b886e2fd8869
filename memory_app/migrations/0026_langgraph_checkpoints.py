"""LangGraph checkpoints, the channel values they hold by version, and their pending writes:
three tables keyed by context first (Citus-ready), written by AgentMemorySaver through
/api/v1/checkpoints."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0025_expiry_retention'),
    ]

    operations = [
        migrations.CreateModel(
            name='Checkpoint',
            fields=[
                ('pk', models.CompositePrimaryKey('context_id', 'checkpoint_ns', 'checkpoint_id', blank=True, editable=False, primary_key=True, serialize=False)),
                ('checkpoint_ns', models.CharField(blank=True, max_length=500)),
                ('checkpoint_id', models.CharField(max_length=200)),
                ('parent_checkpoint_id', models.CharField(blank=True, max_length=200, null=True)),
                ('checkpoint_type', models.CharField(max_length=100)),
                ('checkpoint_data', models.BinaryField()),
                ('channel_versions', models.JSONField(default=dict)),
                ('metadata', models.JSONField(default=dict)),
                ('metadata_type', models.CharField(max_length=100)),
                ('metadata_data', models.BinaryField()),
                ('run_id', models.BigIntegerField(blank=True, null=True)),
                ('ts', models.FloatField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('context', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='memory_app.context')),
            ],
        ),
        migrations.CreateModel(
            name='CheckpointBlob',
            fields=[
                ('pk', models.CompositePrimaryKey('context_id', 'checkpoint_ns', 'channel', 'version', blank=True, editable=False, primary_key=True, serialize=False)),
                ('checkpoint_ns', models.CharField(blank=True, max_length=500)),
                ('channel', models.CharField(max_length=500)),
                ('version', models.CharField(max_length=200)),
                ('blob_type', models.CharField(max_length=100)),
                ('blob_data', models.BinaryField()),
                ('context', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='memory_app.context')),
            ],
        ),
        migrations.CreateModel(
            name='CheckpointWrite',
            fields=[
                ('pk', models.CompositePrimaryKey('context_id', 'checkpoint_ns', 'checkpoint_id', 'task_id', 'idx', blank=True, editable=False, primary_key=True, serialize=False)),
                ('checkpoint_ns', models.CharField(blank=True, max_length=500)),
                ('checkpoint_id', models.CharField(max_length=200)),
                ('task_id', models.CharField(max_length=200)),
                ('idx', models.IntegerField()),
                ('task_path', models.CharField(blank=True, default='', max_length=1000)),
                ('channel', models.CharField(max_length=500)),
                ('value_type', models.CharField(max_length=100)),
                ('value_data', models.BinaryField()),
                ('summary', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('context', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='memory_app.context')),
            ],
        ),
    ]
