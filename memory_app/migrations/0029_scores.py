"""Scores, labels and comments on runs, steps and messages, and the review queues.

Born ready for Citus (docs/scale-out.md): each table's primary key is `(id, context_id)` and its
foreign keys to runs, steps and messages are composite, `(run_id, context_id) REFERENCES run (id,
context_id)`, so a row points only at a target of its own context; they cascade, so a target
deleted outside Django takes its scores along. Django keeps `id` as the key it follows (its
foreign keys have `db_constraint=False`), as migration 0020 does for steps. Review queues belong
to no context.

Frozen: the SQL is written out here.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


TABLES = ("score", "label", "comment")
TARGETS = (("run", "run"), ("step", "step"), ("message", "message"))


def _keys_sql() -> str:
    parts = []
    for table in TABLES:
        parts.append(
            f"ALTER TABLE memory_app_{table} DROP CONSTRAINT memory_app_{table}_pkey,"
            f" ADD CONSTRAINT memory_app_{table}_pkey PRIMARY KEY (id, context_id);"
        )
        for column, target in TARGETS:
            parts.append(
                f"ALTER TABLE memory_app_{table} ADD CONSTRAINT {table}_{column}_fk"
                f" FOREIGN KEY ({column}_id, context_id)"
                f" REFERENCES memory_app_{target} (id, context_id) ON DELETE CASCADE"
                " DEFERRABLE INITIALLY DEFERRED;"
            )
    return "\n".join(parts)


def _keys_reverse_sql() -> str:
    parts = []
    for table in TABLES:
        for column, _ in TARGETS:
            parts.append(f"ALTER TABLE memory_app_{table} DROP CONSTRAINT {table}_{column}_fk;")
        parts.append(
            f"ALTER TABLE memory_app_{table} DROP CONSTRAINT memory_app_{table}_pkey,"
            f" ADD CONSTRAINT memory_app_{table}_pkey PRIMARY KEY (id);"
        )
    return "\n".join(parts)


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0028_ordered_json_columns"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Comment",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("author", models.CharField(max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("text", models.TextField()),
                (
                    "context",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.context",
                    ),
                ),
                (
                    "message",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.message",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.run",
                    ),
                ),
                (
                    "step",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.step",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["context", "run"], name="comment_run_idx")],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("run__isnull", False), ("message__isnull", False), _connector="OR"
                        ),
                        name="comment_has_target",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("step__isnull", True),
                            models.Q(("message__isnull", True), ("run__isnull", False)),
                            _connector="OR",
                        ),
                        name="comment_step_of_run",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="Label",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("author", models.CharField(max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("name", models.CharField(max_length=100)),
                (
                    "context",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.context",
                    ),
                ),
                (
                    "message",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.message",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.run",
                    ),
                ),
                (
                    "step",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.step",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["context", "name", "run"], name="label_name_run_idx")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("context", "run", "step", "message", "name"),
                        name="label_target_name_unique",
                        nulls_distinct=False,
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("run__isnull", False), ("message__isnull", False), _connector="OR"
                        ),
                        name="label_has_target",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("step__isnull", True),
                            models.Q(("message__isnull", True), ("run__isnull", False)),
                            _connector="OR",
                        ),
                        name="label_step_of_run",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="ReviewQueue",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200, unique=True)),
                (
                    "filters",
                    models.TextField(
                        blank=True, default="", help_text="the runs table's query string"
                    ),
                ),
                ("score_name", models.CharField(max_length=100)),
                (
                    "score_kind",
                    models.CharField(
                        choices=[
                            ("numeric", "Numeric"),
                            ("boolean", "Boolean"),
                            ("categorical", "Categorical"),
                        ],
                        max_length=20,
                    ),
                ),
                (
                    "categories",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.CharField(max_length=200),
                        blank=True,
                        default=list,
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("score_kind__in", ["numeric", "boolean", "categorical"])
                        ),
                        name="reviewqueue_kind_valid",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Score",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("author", models.CharField(max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("name", models.CharField(max_length=100)),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("numeric", "Numeric"),
                            ("boolean", "Boolean"),
                            ("categorical", "Categorical"),
                        ],
                        max_length=20,
                    ),
                ),
                ("number", models.FloatField(blank=True, null=True)),
                ("category", models.CharField(blank=True, max_length=200, null=True)),
                ("comment", models.TextField(blank=True, default="")),
                ("client_id", models.CharField(blank=True, max_length=200, null=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "context",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.context",
                    ),
                ),
                (
                    "message",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.message",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.run",
                    ),
                ),
                (
                    "step",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.step",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["context", "run", "name"], name="score_run_name_idx"),
                    models.Index(
                        condition=models.Q(("message__isnull", False)),
                        fields=["context", "message"],
                        name="score_message_idx",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("client_id__isnull", False)),
                        fields=("context", "author", "client_id"),
                        name="score_client_id_unique",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("kind__in", ["numeric", "boolean", "categorical"])),
                        name="score_kind_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(
                                ("category__isnull", True),
                                ("kind", "numeric"),
                                ("number__isnull", False),
                            ),
                            models.Q(
                                ("category__isnull", True),
                                ("kind", "boolean"),
                                ("number__in", [0.0, 1.0]),
                            ),
                            models.Q(
                                ("category__isnull", False),
                                ("kind", "categorical"),
                                ("number__isnull", True),
                            ),
                            _connector="OR",
                        ),
                        name="score_value_of_kind",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("run__isnull", False), ("message__isnull", False), _connector="OR"
                        ),
                        name="score_has_target",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("step__isnull", True),
                            models.Q(("message__isnull", True), ("run__isnull", False)),
                            _connector="OR",
                        ),
                        name="score_step_of_run",
                    ),
                ],
            },
        ),
        migrations.RunSQL(_keys_sql(), _keys_reverse_sql()),
    ]
