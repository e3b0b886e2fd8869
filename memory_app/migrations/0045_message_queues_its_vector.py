"""A message appended with a queue model set queues itself for its vector: an AFTER INSERT row
trigger writes the embedding queue's row (as `embeddings.queue.enqueue_messages` does) when
the transaction set `agentmemory.queue_model` (SET LOCAL) and the message has text.

The append on a distributed store sets it (`message_rows.append_taking_seqs`): its INSERT goes
to the context's worker whole, and SET LOCAL goes with it (`citus.propagate_set_commands =
local`, set by `manage.py distribute`), so the queue's row is written there beside the message.
Written as a data-modifying CTE after the INSERT, as one node's append writes it, it is a step
of its own there: the new rows come back to the coordinator and go out again. Every other
writer leaves the setting unset, and its rows queue nothing here (the WHEN clause: no event is
even queued).

An AFTER trigger: the queue's row refers to the message's, which a BEFORE trigger would not see
yet.
"""

from django.db import migrations

FUNCTION_SQL = """
CREATE OR REPLACE FUNCTION memory_app_message_queue_vector() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_app_embedding (message_id, context_id, model, dimensions, vector, indexed)
        VALUES (NEW.id, NEW.context_id, current_setting('agentmemory.queue_model'), NULL, NULL,
                true)
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$
"""
# A statement of its own: on a distributed store Citus passes each DDL statement on to the
# workers as one command.
TRIGGER_SQL = """
CREATE OR REPLACE TRIGGER message_queue_vector AFTER INSERT ON memory_app_message
    FOR EACH ROW WHEN (NEW.text <> '' AND current_setting('agentmemory.queue_model', true) <> '')
    EXECUTE FUNCTION memory_app_message_queue_vector();
"""


class Migration(migrations.Migration):
    # As 0043: a function's DDL beside the shards' in transactions of their own, so that it
    # runs on Citus either way and can run again after a failure.
    atomic = False

    dependencies = [("memory_app", "0044_take_seq_says_what_it_left")]

    operations = [
        migrations.RunSQL(FUNCTION_SQL, "DROP FUNCTION IF EXISTS memory_app_message_queue_vector()"),
        migrations.RunSQL(
            TRIGGER_SQL, "DROP TRIGGER IF EXISTS message_queue_vector ON memory_app_message"
        ),
    ]
