"""A message inserted without a seq takes the next one of its context (a BEFORE INSERT trigger).

An append of a few messages is one INSERT of rows without seqs: for each row the trigger
updates the context's counters (its row lock keeps seqs gap-free, as the UPDATE of the other
paths does), sets the row's seq, and writes its full-text row when the context's vectors are
caught up. A data-modifying CTE doing the same (the counters' UPDATE, the INSERT reading its
seqs, the full-text row reading the INSERT) is planned anew on every append by PostgreSQL and
in steps by Citus, each a hop from the coordinator to the context's worker; the INSERT goes to
that worker whole, where the trigger's statements find the context's shards beside the
message's.

Every other path writes its seqs itself: for them the trigger's condition is false and nothing
runs. A full-text vector that cannot be written fails the INSERT (the caller then appends
through the path that keeps the message and stores the vector's error); a context that does
not exist fails it with SQLSTATE P0002.

Frozen: the SQL is written out here (the full-text config is `memory_app.models.FTS_CONFIG`
when this was written).
"""

from django.db import migrations

FTS_CONFIG = "english"

FUNCTION_SQL = f"""
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
            DO UPDATE SET search_vector = EXCLUDED.search_vector, error = NULL;
    END IF;
    RETURN NEW;
END $$
"""
# A statement of its own: on a distributed store Citus passes each DDL statement on to the
# workers as one command.
TRIGGER_SQL = """
CREATE OR REPLACE TRIGGER message_take_seq BEFORE INSERT ON memory_app_message
    FOR EACH ROW WHEN (NEW.seq IS NULL) EXECUTE FUNCTION memory_app_message_take_seq();
"""


class Migration(migrations.Migration):
    # Each statement in a transaction of its own. On Citus a function's DDL goes to every node
    # over one connection each, which Citus refuses in a transaction that already ran DDL on
    # the shards in parallel: taking this migration back (the trigger dropped from every shard,
    # then the function) failed as one transaction. Run again after a failure, either way, it
    # starts over: the function and the trigger are replaced, the drops find nothing.
    atomic = False

    dependencies = [("memory_app", "0042_audit_snapshots_json")]

    operations = [
        migrations.RunSQL(FUNCTION_SQL, "DROP FUNCTION IF EXISTS memory_app_message_take_seq()"),
        migrations.RunSQL(TRIGGER_SQL, "DROP TRIGGER IF EXISTS message_take_seq ON memory_app_message"),
    ]
