"""An audit event's before and after become `json`, which keeps the text as written.

Undoing a message's edit writes its `before` back: `jsonb` had sorted its keys, so an edit of a
message's text, undone, left the agent's metadata in another order than it wrote it. The model's
`OrderedJSONField` writes one JSON text and casts the columns to `jsonb` for lookups (a purged
snapshot is found with `has_key`).

Snapshots already stored keep the order `jsonb` gave them. The `ALTER ... TYPE json` rewrites
the table under an ACCESS EXCLUSIVE lock: every audited change (and the audit pages) waits
until it is done, a time proportional to the table's size.

Frozen: the SQL is written out here; the state keeps `JSONField` (what the model's field
deconstructs to), the column type being this SQL's.
"""

from django.db import migrations


def _alter(to: str) -> str:
    return "ALTER TABLE memory_app_auditevent " + ", ".join(
        f'ALTER COLUMN "{c}" TYPE {to} USING "{c}"::{to}' for c in ("before", "after")
    )


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0041_checkpoint_write_summary_json")]

    operations = [
        migrations.RunSQL(sql=_alter("json"), reverse_sql=_alter("jsonb")),
    ]
