"""A message that takes its seq but not its full-text row says so: the trigger of migration
0043 raises a notice (SQLSTATE AM001) for each row whose full-text vector it leaves to the
indexer (the context's were behind), so the appender knows from its own statement whether to
wake the indexer, without reading the context's counters first. On Citus the worker's notice
reaches the client through the coordinator (`citus.worker_min_messages`, NOTICE by default). A
server whose `client_min_messages` is above NOTICE sends none: the indexer then takes the rows
on its next round (a later batch's wake, or its own retries while work is pending).

Frozen: the SQL is written out here (the full-text config is `memory_app.models.FTS_CONFIG`
when this was written).
"""

from django.db import migrations

FTS_CONFIG = "english"


def _function(left_behind: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION memory_app_message_take_seq() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    taken bigint;
    searched bigint;
BEGIN
    UPDATE memory_app_context SET last_seq = last_seq + 1,
        search_seq = CASE WHEN search_seq = last_seq THEN last_seq + 1 ELSE search_seq END,
        message_count = message_count + 1, token_count = token_count + NEW.token_count,
        last_activity_at = NEW.created_at
    WHERE id = NEW.context_id RETURNING last_seq, search_seq INTO taken, searched;
    IF taken IS NULL THEN
        RAISE EXCEPTION 'context % not found', NEW.context_id USING ERRCODE = 'P0002';
    END IF;
    NEW.seq := taken;
    IF searched = taken THEN
        INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
            VALUES (NEW.context_id, taken, memory_app_search_vector('{FTS_CONFIG}', NEW.text))
            ON CONFLICT (context_id, seq)
            DO UPDATE SET search_vector = EXCLUDED.search_vector, error = NULL;{left_behind}
    END IF;
    RETURN NEW;
END $$
"""


LEFT_BEHIND = """
    ELSE
        RAISE NOTICE 'context %: the full-text vector of seq % is left to the indexer',
            NEW.context_id, taken USING ERRCODE = 'AM001';"""


class Migration(migrations.Migration):
    # As 0043: a function's DDL in a transaction of its own, so that it runs on Citus and can
    # run again after a failure.
    atomic = False

    dependencies = [("memory_app", "0043_message_takes_its_seq")]

    operations = [migrations.RunSQL(_function(LEFT_BEHIND), _function(""))]
