"""Contexts are found by keys through `memory_app_contextkey` (digest -> context), not a unique
constraint on contexts.

On Citus contexts are distributed by `id`, and a unique constraint there must include it:
`context_keys_digest_unique (keys_digest)` could not be kept, and with it went "same keys, same
context" across shards. The digest table holds it instead: keyed by the digest, distributed by
it, each row naming its context (`target_id`). Get-or-create inserts the digest row first and
the context under the id it reserved, in one transaction.

Carrying a store over: one transaction. The copy reads every context under a SHARE lock (no
context is created meanwhile; reads go on), writes one digest row each, then drops the unique
constraint. Servers still running the previous code would create contexts without a digest row
after it commits: stop them, or restart them right after (docs/scale-out.md, "Migration 0024").

Reversible: back to 0023 the constraint is put back (it fails if two contexts share a digest,
which only a server of the previous code running after this migration could have made).
Frozen: the SQL is written out here.
"""

import django.db.models.deletion
from django.db import migrations, models

FORWARD = """
LOCK TABLE memory_app_context IN SHARE MODE;
INSERT INTO memory_app_contextkey (digest, target_id)
    SELECT keys_digest, id FROM memory_app_context;
"""


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0029_scores")]

    operations = [
        migrations.CreateModel(
            name="ContextKey",
            fields=[
                ("digest", models.CharField(max_length=64, primary_key=True, serialize=False)),
                (
                    "target",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="memory_app.context",
                    ),
                ),
            ],
        ),
        migrations.RunSQL(FORWARD, reverse_sql=migrations.RunSQL.noop),
        migrations.RemoveConstraint(model_name="context", name="context_keys_digest_unique"),
    ]
