"""A trace span's data becomes `json`, which keeps the text as received.

OTLP attributes and log event attributes may be structured (key-value lists): the latest GenAI
conventions send a model call's messages that way, its tool-call arguments as the model wrote
them. `jsonb` sorted their keys, so the steps mapped from kept spans gave the arguments back in
another order than the model wrote them. The model's `OrderedJSONField` writes one JSON text and
casts the column to `jsonb` for lookups (the purge markers are read with `has_key`).

Spans already kept keep the order `jsonb` gave them. The `ALTER ... TYPE json` rewrites the
table under an ACCESS EXCLUSIVE lock: OTLP exports (the receiver reads the kept spans), their
mapping and the retention's sweep wait until it is done, a time proportional to the table's
size.

Frozen: the SQL is written out here; the state keeps `JSONField` (what the model's field
deconstructs to), the column type being this SQL's.
"""

from django.db import migrations


def _alter(to: str) -> str:
    return f'ALTER TABLE memory_app_tracespan ALTER COLUMN "data" TYPE {to} USING "data"::{to}'


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0039_store_items_swept_after_their_ttl")]

    operations = [
        migrations.RunSQL(sql=_alter("json"), reverse_sql=_alter("jsonb")),
    ]
