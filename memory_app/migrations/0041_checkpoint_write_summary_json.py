"""A LangGraph pending write's summary becomes `json`, which keeps the text as written.

The logbook's step of a super-step is made from these summaries (the messages a node wrote,
their tool calls): `jsonb` sorted their keys, so a tool call's arguments read
`{"city", "unit"}` where the model wrote `{"unit", "city"}`. The model's `OrderedJSONField`
writes one JSON text and casts the column to `jsonb` for lookups.

Summaries already stored keep the order `jsonb` gave them. The `ALTER ... TYPE json` rewrites
the table under an ACCESS EXCLUSIVE lock: the checkpointer's writes and reads of the table wait
until it is done, a time proportional to its size.

Frozen: the SQL is written out here; the state keeps `JSONField` (what the model's field
deconstructs to), the column type being this SQL's.
"""

from django.db import migrations


def _alter(to: str) -> str:
    return (
        "ALTER TABLE memory_app_checkpointwrite"
        f' ALTER COLUMN "summary" TYPE {to} USING "summary"::{to}'
    )


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0040_trace_span_data_json")]

    operations = [
        migrations.RunSQL(sql=_alter("json"), reverse_sql=_alter("jsonb")),
    ]
