"""Agent-written JSON columns become `json`, which keeps the text as written.

`jsonb` sorts an object's keys, so tool-call arguments, step model output, message content and
metadata, memory and run metadata came back in another order than the agent wrote them (only
the smolagents and AgentScope paths kept a key-order skeleton beside them). A `json` column
keeps the text verbatim; the models' `OrderedJSONField` writes one JSON text and casts the
column to `jsonb` for lookups, so filters mean what they meant.

Values already stored keep the order `jsonb` gave them (the order they arrived in is gone);
messages and smolagents steps written through their framework endpoints still carry their
skeleton, which those endpoints apply on the way out.

A memory's versions keep their metadata as the memory does (a restore gives it back).

Each `ALTER ... TYPE json` rewrites its table under an ACCESS EXCLUSIVE lock: writes and reads
of that table wait until it is done, a time proportional to the table's size (the operations
notes in the README say when to run it).

Frozen: the SQL is written out here; the state keeps `JSONField` (what the models' field
deconstructs to), the column type being this SQL's.
"""

from django.db import migrations

COLUMNS = {
    "memory_app_context": ["metadata"],
    "memory_app_message": ["content", "metadata"],
    "memory_app_run": ["final_answer", "metadata"],
    "memory_app_step": [
        "model_input_messages",
        "model_output_message",
        "model_output",
        "action_output",
        "payload",
    ],
    "memory_app_toolcall": ["arguments"],
    "memory_app_memoryrecord": ["metadata"],
    "memory_app_memoryversion": ["metadata"],
}


def _alter(to: str) -> list[str]:
    return [
        f"ALTER TABLE {table} "
        + ", ".join(f'ALTER COLUMN "{c}" TYPE {to} USING "{c}"::{to}' for c in columns)
        for table, columns in COLUMNS.items()
    ]


class Migration(migrations.Migration):
    dependencies = [("memory_app", "0027_memory_provenance_history")]

    operations = [
        migrations.RunSQL(sql=_alter("json"), reverse_sql=_alter("jsonb")),
    ]
