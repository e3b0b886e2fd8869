"""Memory provenance and history.

Provenance: a memory names the run it was derived from (beside its message and step), and who
recorded it (`origin`: an API key, a dashboard user, an import, the system) with the key or user.
History: `memoryversion` keeps every version of a memory, keyed by (memory_id, version).

Backfill, from what the database already knows:
- `source_run` from the source step's run, else the source message's run;
- `origin`, `source_api_key`, `source_user` from the audit event that created the memory (a
  record or a promote); a memory without one whose `recorded_by` is the actor of an import is
  `import`; the rest stay `unknown` (nothing else says who wrote them);
- one version per memory: the memory as it stands now (action `migrated`). Changes made before
  this migration are not versions: the audit log keeps them.

Frozen: plain SQL, no application code."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

ORIGINS = ["api_key", "user", "import", "system", "unknown"]

BACKFILL = [
    # The run of the source step, else of the source message.
    """
    UPDATE memory_app_memoryrecord m SET source_run_id = s.run_id
    FROM memory_app_step s WHERE m.source_step_id = s.id
    """,
    """
    UPDATE memory_app_memoryrecord m SET source_run_id = msg.run_id
    FROM memory_app_message msg
    WHERE m.source_run_id IS NULL AND m.source_message_id = msg.id AND msg.run_id IS NOT NULL
    """,
    # Who created it: the first record or promote event that names it.
    """
    UPDATE memory_app_memoryrecord m SET
        origin = CASE WHEN e.api_key_id IS NOT NULL THEN 'api_key'
                      WHEN e.user_id IS NOT NULL THEN 'user'
                      ELSE 'system' END,
        source_api_key_id = e.api_key_id,
        source_user_id = e.user_id
    FROM (
        SELECT DISTINCT ON (t.id) t.id AS memory_id, a.api_key_id, a.user_id
        FROM memory_app_auditevent a CROSS JOIN LATERAL unnest(a.target_ids) AS t(id)
        WHERE a.target_type = 'memoryrecord' AND a.action IN ('record', 'memory_promote')
        ORDER BY t.id, a.id
    ) e
    WHERE e.memory_id = m.id
    """,
    # An import writes no record event: its memories carry the importer's label.
    """
    UPDATE memory_app_memoryrecord m SET
        origin = 'import', source_api_key_id = e.api_key_id, source_user_id = e.user_id
    FROM (
        SELECT DISTINCT ON (actor) actor, api_key_id, user_id
        FROM memory_app_auditevent
        WHERE action = 'import' AND target_type = 'context'
        ORDER BY actor, id DESC
    ) e
    WHERE m.origin = 'unknown' AND m.recorded_by <> '' AND m.recorded_by = e.actor
    """,
    # History starts with the memory as it stands.
    """
    INSERT INTO memory_app_memoryversion (
        memory_id, version, content, kind, thinking, keywords, metadata, status, archived_at,
        action, actor, note, at
    )
    SELECT id, 1, content, kind, thinking, keywords, metadata, status, archived_at,
        'migrated', 'migration',
        'the memory as it stood when its history began; earlier changes are in the audit log',
        updated_at
    FROM memory_app_memoryrecord
    """,
]


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0026_langgraph_checkpoints"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="memoryrecord",
            name="origin",
            field=models.CharField(
                choices=[
                    ("api_key", "Api Key"),
                    ("user", "User"),
                    ("import", "Import"),
                    ("system", "System"),
                    ("unknown", "Unknown"),
                ],
                default="unknown",
                max_length=20,
            ),
        ),
        migrations.AddField(
            model_name="memoryrecord",
            name="source_api_key",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="memory_app.apikey",
            ),
        ),
        migrations.AddField(
            model_name="memoryrecord",
            name="source_run",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="memory_records",
                to="memory_app.run",
            ),
        ),
        migrations.AddField(
            model_name="memoryrecord",
            name="source_user",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddConstraint(
            model_name="memoryrecord",
            constraint=models.CheckConstraint(
                condition=models.Q(("origin__in", ORIGINS)), name="memory_origin_valid"
            ),
        ),
        migrations.CreateModel(
            name="MemoryVersion",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "memory_id",
                        "version",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                (
                    "memory",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="versions",
                        to="memory_app.memoryrecord",
                    ),
                ),
                ("version", models.PositiveIntegerField()),
                ("content", models.TextField()),
                ("kind", models.CharField(max_length=20)),
                ("thinking", models.TextField(blank=True, default="")),
                (
                    "keywords",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.CharField(max_length=200),
                        blank=True,
                        default=list,
                        size=None,
                    ),
                ),
                ("metadata", models.JSONField(blank=True, default=dict)),
                ("status", models.CharField(max_length=20)),
                ("archived_at", models.DateTimeField(blank=True, null=True)),
                ("action", models.CharField(max_length=50)),
                ("actor", models.CharField(max_length=200)),
                (
                    "user",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "api_key",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="memory_app.apikey",
                    ),
                ),
                (
                    "audit_event",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="memory_app.auditevent",
                    ),
                ),
                ("note", models.TextField(blank=True, default="")),
                ("at", models.DateTimeField()),
            ],
            options={"ordering": ["memory_id", "version"]},
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
