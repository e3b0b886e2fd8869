"""The runs table's columns on the run, and the indexes it sorts and filters by.

`tool_call_count`, `model_names` (the models the steps and the run's `metadata.model` name, sorted)
and `cost` (the steps' reported costs, the rest priced from their tokens) are kept by the write
path from now on, so that a page of the runs table across every context reads runs only, never
their steps. They are filled in here from the stored steps.

The cost backfill prices tokens as `memory_app.pricing` did when this migration was written: the
per-million prices of `settings.AGENTMEMORY_DEFAULT_MODEL_PRICES` overridden by the JSON of
`settings.AGENTMEMORY_MODEL_PRICES`, a model matched by its name after the last `/`, exactly or
as a dated variant (`gpt-4o-2024-08-06`), the longest listed name winning.

Frozen: the SQL and the pricing are written out here.
"""

import json

import django.contrib.postgres.fields
import django.contrib.postgres.indexes
import django.db.models.functions.comparison
from django.conf import settings
from django.db import migrations, models

FILL_COUNTS_SQL = """
UPDATE memory_app_run r SET tool_call_count = t.n
    FROM (SELECT s.run_id, s.context_id, count(*) AS n
          FROM memory_app_toolcall c
          JOIN memory_app_step s ON s.id = c.step_id AND s.context_id = c.context_id
          GROUP BY s.run_id, s.context_id) t
    WHERE r.id = t.run_id AND r.context_id = t.context_id;
UPDATE memory_app_run r SET model_names = m.names
    FROM (SELECT r2.id, r2.context_id, array_agg(DISTINCT x.name ORDER BY x.name) AS names
          FROM memory_app_run r2
          CROSS JOIN LATERAL (
              SELECT left(s.model, 200) AS name FROM memory_app_step s
              WHERE s.run_id = r2.id AND s.context_id = r2.context_id AND s.model <> ''
              UNION
              SELECT left(r2.metadata->>'model', 200)
              WHERE jsonb_typeof(r2.metadata->'model') = 'string' AND r2.metadata->>'model' <> ''
          ) x
          GROUP BY r2.id, r2.context_id) m
    WHERE r.id = m.id AND r.context_id = m.context_id;
"""

COST_GROUPS_SQL = """
SELECT s.run_id, s.context_id, s.model, r.metadata->>'model',
    sum(s.cost), sum(s.input_tokens) FILTER (WHERE s.cost IS NULL),
    sum(s.output_tokens) FILTER (WHERE s.cost IS NULL)
FROM memory_app_step s JOIN memory_app_run r ON r.id = s.run_id AND r.context_id = s.context_id
GROUP BY s.run_id, s.context_id, s.model, r.metadata->>'model'
"""

BATCH = 5_000


def _prices() -> dict:
    table = dict(getattr(settings, "AGENTMEMORY_DEFAULT_MODEL_PRICES", {}))
    override = getattr(settings, "AGENTMEMORY_MODEL_PRICES", "") or ""
    if override.strip():
        table.update(json.loads(override))
    return {name.lower(): price for name, price in table.items() if price is not None}


def _priced(prices: dict, model: str, i, o):
    if not model or (i is None and o is None):
        return None
    name = model.lower().rsplit("/", 1)[-1]
    best = None
    for listed in prices:
        if (name == listed or name.startswith(listed + "-")) and (
            best is None or len(listed) > len(best)
        ):
            best = listed
    if best is None:
        return None
    price = prices[best]
    return ((i or 0) * price[0] + (o or 0) * price[1]) / 1_000_000


def fill(apps, schema_editor):
    connection = schema_editor.connection
    prices = _prices()
    costs: dict[tuple[int, int], float] = {}
    with connection.cursor() as cursor:
        cursor.execute(FILL_COUNTS_SQL)
        cursor.execute(COST_GROUPS_SQL)
        for run_id, context_id, model, run_model, reported, i, o in cursor.fetchall():
            cost = reported
            priced = _priced(prices, model or run_model or "", i, o)
            if priced is not None:
                cost = (cost or 0.0) + priced
            if cost is not None:
                costs[(run_id, context_id)] = costs.get((run_id, context_id), 0.0) + cost
        rows = [(cost, run_id, context_id) for (run_id, context_id), cost in costs.items()]
        for start in range(0, len(rows), BATCH):
            cursor.executemany(
                "UPDATE memory_app_run SET cost = %s WHERE id = %s AND context_id = %s",
                rows[start : start + BATCH],
            )


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0021_memory_review")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="cost",
            field=models.FloatField(blank=True, help_text="USD", null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="model_names",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(max_length=200),
                blank=True,
                db_default=models.Value([]),
                default=list,
                size=None,
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="tool_call_count",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                django.db.models.functions.comparison.Coalesce("started_at", "created_at"),
                models.F("id"),
                name="run_started_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                models.F("status"),
                django.db.models.functions.comparison.Coalesce("started_at", "created_at"),
                models.F("id"),
                name="run_status_started_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                django.db.models.functions.comparison.Coalesce("duration", models.Value(-1.0)),
                models.F("id"),
                name="run_duration_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                django.db.models.functions.comparison.Coalesce("cost", models.Value(-1.0)),
                models.F("id"),
                name="run_cost_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=django.contrib.postgres.indexes.GinIndex(
                fields=["model_names"], name="run_model_names_gin"
            ),
        ),
    ]
