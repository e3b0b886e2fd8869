"""Memory expiry (`expires_at`, `pinned`, `legal_hold` on memory records) and the operator's
retention policies.

The new columns take constant defaults (no table rewrite); the partial index holds only records
with an expiry date, the expiry's worklist. Retention policies are global configuration (a
reference table on Citus), not a context's rows."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0024_store_items'),
    ]

    operations = [
        migrations.CreateModel(
            name='RetentionPolicy',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200)),
                ('scope_keys', models.JSONField(blank=True, default=dict, help_text='contexts whose keys contain these; {} is every context')),
                ('kind', models.CharField(choices=[('messages', 'Messages'), ('runs', 'Runs'), ('spans', 'Spans')], max_length=20)),
                ('max_age_days', models.PositiveIntegerField(help_text='older than this many days is removed')),
                ('enabled', models.BooleanField(default=True)),
                ('progress', models.JSONField(blank=True, default=dict, editable=False)),
                ('last_applied_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('last_summary', models.JSONField(blank=True, editable=False, null=True)),
                ('created_by', models.CharField(blank=True, default='', editable=False, max_length=200)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'verbose_name_plural': 'retention policies',
                'ordering': ['pk'],
            },
        ),
        migrations.AddField(
            model_name='memoryrecord',
            name='expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='memoryrecord',
            name='legal_hold',
            field=models.TextField(blank=True, db_default='', default='', help_text='why the record is held (empty: none)'),
        ),
        migrations.AddField(
            model_name='memoryrecord',
            name='pinned',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddIndex(
            model_name='memoryrecord',
            index=models.Index(condition=models.Q(('expires_at__isnull', False)), fields=['expires_at', 'id'], name='memory_expires_idx'),
        ),
        migrations.AddConstraint(
            model_name='retentionpolicy',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['messages', 'runs', 'spans'])), name='retention_kind_valid'),
        ),
        migrations.AddConstraint(
            model_name='retentionpolicy',
            constraint=models.CheckConstraint(condition=models.Q(('max_age_days__gte', 1)), name='retention_max_age_positive'),
        ),
    ]
