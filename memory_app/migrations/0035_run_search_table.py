"""Full-text vectors of what runs wrote: step outputs, step errors and tool calls (RunSearch).

The search across contexts (`memory_app.queries.search_all`) finds step outputs, errors and
tool-call arguments and outputs through a GIN index, as it finds messages through
MessageSearch's. Row triggers on steps and tool calls keep the vectors in step with any writer
(the API, MCP, OTLP, imports, hand-made SQL): an insert writes the row's vectors, an update of
a searched column writes them again (or drops one whose text became empty), a delete drops
them. Each statement names its own row's context and key (shard-safe on Citus: a trigger runs
on the shard of its row and touches that shard's rows only). A pruned step keeps its vectors:
the search joins the step and leaves it out while it is pruned.

Existing steps and tool calls are backfilled here, before the GIN index is built (one sort
instead of an insertion per row); writes to steps and tool calls wait while it runs.

Frozen: the SQL is written out here (the config is `memory_app.models.FTS_CONFIG` when this
migration was written; `memory_app_search_vector` is migration 0019's).
"""

import django.contrib.postgres.indexes
import django.contrib.postgres.search
from django.db import migrations, models

FTS_CONFIG = "english"


def _text(row: str, kind: str) -> str:
    """The text a row's vector is made of: JSON strings as their text, other JSON as written."""
    if kind == "output":
        return (
            f"concat_ws(' ', {row}.plan, {row}.code_action, {row}.model_output #>> '{{}}',"
            f" {row}.observations, {row}.action_output #>> '{{}}')"
        )
    if kind == "error":
        return f"concat_ws(' ', {row}.error_type, {row}.error_message)"
    return f"concat_ws(' ', {row}.name, {row}.arguments #>> '{{}}', {row}.output)"


def _upsert(kind: str, ref: str, step: str) -> str:
    return f"""
    body := {_text("NEW", kind)};
    IF body = '' THEN
        DELETE FROM memory_app_runsearch
            WHERE context_id = NEW.context_id AND kind = '{kind}' AND ref_id = NEW.{ref};
    ELSE
        INSERT INTO memory_app_runsearch (context_id, kind, ref_id, run_id, step_id, search_vector)
            VALUES (NEW.context_id, '{kind}', NEW.{ref}, {step},
                    memory_app_search_vector('{FTS_CONFIG}', body))
            ON CONFLICT (context_id, kind, ref_id) DO UPDATE
            SET run_id = EXCLUDED.run_id, step_id = EXCLUDED.step_id,
                search_vector = EXCLUDED.search_vector;
    END IF;"""


STEP_COLUMNS = "plan, code_action, model_output, observations, action_output, error_type, error_message"
TOOL_COLUMNS = "name, arguments, output"

FORWARD_SQL = f"""
LOCK TABLE memory_app_step, memory_app_toolcall IN SHARE ROW EXCLUSIVE MODE;

CREATE FUNCTION memory_app_step_search_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    body text;
BEGIN
{_upsert("output", "id", "NEW.run_id, NEW.id")}
{_upsert("error", "id", "NEW.run_id, NEW.id")}
    RETURN NULL;
END $$;
CREATE TRIGGER step_search_write AFTER INSERT OR UPDATE OF {STEP_COLUMNS}
    ON memory_app_step FOR EACH ROW EXECUTE FUNCTION memory_app_step_search_write();

CREATE FUNCTION memory_app_step_search_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_app_runsearch
        WHERE context_id = OLD.context_id AND kind IN ('output', 'error') AND ref_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER step_search_delete AFTER DELETE ON memory_app_step
    FOR EACH ROW EXECUTE FUNCTION memory_app_step_search_delete();

CREATE FUNCTION memory_app_toolcall_search_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    run bigint;
    body text;
BEGIN
    SELECT s.run_id INTO run FROM memory_app_step s
        WHERE s.context_id = NEW.context_id AND s.id = NEW.step_id;
{_upsert("tool", "id", "run, NEW.step_id")}
    RETURN NULL;
END $$;
CREATE TRIGGER toolcall_search_write AFTER INSERT OR UPDATE OF {TOOL_COLUMNS}, step_id
    ON memory_app_toolcall FOR EACH ROW EXECUTE FUNCTION memory_app_toolcall_search_write();

CREATE FUNCTION memory_app_toolcall_search_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM memory_app_runsearch
        WHERE context_id = OLD.context_id AND kind = 'tool' AND ref_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER toolcall_search_delete AFTER DELETE ON memory_app_toolcall
    FOR EACH ROW EXECUTE FUNCTION memory_app_toolcall_search_delete();

INSERT INTO memory_app_runsearch (context_id, kind, ref_id, run_id, step_id, search_vector)
    SELECT context_id, 'output', id, run_id, id,
           memory_app_search_vector('{FTS_CONFIG}', {_text("s", "output")})
    FROM memory_app_step s WHERE {_text("s", "output")} <> ''
    UNION ALL
    SELECT context_id, 'error', id, run_id, id,
           memory_app_search_vector('{FTS_CONFIG}', {_text("s", "error")})
    FROM memory_app_step s WHERE {_text("s", "error")} <> ''
    UNION ALL
    SELECT t.context_id, 'tool', t.id, s.run_id, t.step_id,
           memory_app_search_vector('{FTS_CONFIG}', {_text("t", "tool")})
    FROM memory_app_toolcall t
    JOIN memory_app_step s ON s.context_id = t.context_id AND s.id = t.step_id
    ORDER BY 1, 2, 3;
"""

REVERSE_SQL = """
DROP TRIGGER IF EXISTS toolcall_search_delete ON memory_app_toolcall;
DROP TRIGGER IF EXISTS toolcall_search_write ON memory_app_toolcall;
DROP TRIGGER IF EXISTS step_search_delete ON memory_app_step;
DROP TRIGGER IF EXISTS step_search_write ON memory_app_step;
DROP FUNCTION IF EXISTS memory_app_toolcall_search_delete();
DROP FUNCTION IF EXISTS memory_app_toolcall_search_write();
DROP FUNCTION IF EXISTS memory_app_step_search_delete();
DROP FUNCTION IF EXISTS memory_app_step_search_write();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0034_store_namespaces"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunSearch",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "context_id",
                        "kind",
                        "ref_id",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("context_id", models.BigIntegerField()),
                ("kind", models.CharField(max_length=10)),
                ("ref_id", models.BigIntegerField()),
                ("run_id", models.BigIntegerField()),
                ("step_id", models.BigIntegerField()),
                ("search_vector", django.contrib.postgres.search.SearchVectorField()),
            ],
        ),
        # Filled before its GIN index exists: one sort instead of an insertion per row.
        migrations.RunSQL(FORWARD_SQL, REVERSE_SQL),
        migrations.AddIndex(
            model_name="runsearch",
            index=django.contrib.postgres.indexes.GinIndex(
                fields=["search_vector"], name="run_search_gin"
            ),
        ),
    ]
