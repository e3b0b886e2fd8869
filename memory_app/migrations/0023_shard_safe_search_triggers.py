"""The message search triggers lock one context per statement and work row by row.

On Citus a trigger on a distributed table runs on the shard the row lives on, and a row lock
there must name one distribution value. Migration 0013's triggers did not:
- the delete trigger was statement-level (one join of the deleted rows, all contexts at once,
  and a lock of every context they belonged to in one statement): it is now row-level, and
  deletes the one vector of the one deleted message after locking its context;
- the update trigger locked `id IN (OLD.context_id, NEW.context_id)` in one statement: it now
  locks the lower id, then the higher one if the message moved (no domain path moves one; a
  hand-made UPDATE might, and Citus refuses to change a distribution value anyway).

What they keep is unchanged: an edited text is parsed again, a pruned or deleted message loses
its vector, a restored one gets it back, a moved one takes it along, each after its context's
row lock, which the full-text indexer holds while it fills a context.

A purge of many messages now runs the delete trigger once per message (a lock its transaction
already holds, and one deletion by primary key) instead of one join per statement.

Frozen: the SQL is written out here (the config is `memory_app.models.FTS_CONFIG` when this
migration was written).
"""

from django.db import migrations

FTS_CONFIG = "english"
VECTOR = f"memory_app_search_vector('{FTS_CONFIG}', NEW.text)"

UPDATE_BODY = f"""
    IF (OLD.context_id, OLD.seq) IS DISTINCT FROM (NEW.context_id, NEW.seq) THEN
        -- Moved (no domain path does; a hand-made UPDATE might): the vector follows the key.
        DELETE FROM memory_app_messagesearch WHERE context_id = OLD.context_id AND seq = OLD.seq;
        IF NEW.pruned_at IS NULL THEN
            INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
                VALUES (NEW.context_id, NEW.seq, {VECTOR})
                ON CONFLICT (context_id, seq) DO UPDATE
                SET search_vector = EXCLUDED.search_vector, error = NULL;
        END IF;
    ELSIF NEW.pruned_at IS NOT NULL THEN
        DELETE FROM memory_app_messagesearch WHERE context_id = NEW.context_id AND seq = NEW.seq;
    ELSIF OLD.pruned_at IS NOT NULL THEN
        INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
            VALUES (NEW.context_id, NEW.seq, {VECTOR})
            ON CONFLICT (context_id, seq) DO UPDATE
            SET search_vector = EXCLUDED.search_vector, error = NULL;
    ELSE
        UPDATE memory_app_messagesearch SET search_vector = {VECTOR}, error = NULL
            WHERE context_id = NEW.context_id AND seq = NEW.seq;
    END IF;
    RETURN NULL;
END $$;
"""

FORWARD_SQL = (
    """
CREATE OR REPLACE FUNCTION memory_app_message_search_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    first_id bigint := LEAST(OLD.context_id, NEW.context_id);
    second_id bigint := GREATEST(OLD.context_id, NEW.context_id);
BEGIN
    -- One context per statement, in id order.
    PERFORM 1 FROM memory_app_context WHERE id = first_id FOR NO KEY UPDATE;
    IF second_id <> first_id THEN
        PERFORM 1 FROM memory_app_context WHERE id = second_id FOR NO KEY UPDATE;
    END IF;
"""
    + UPDATE_BODY
    + """
DROP TRIGGER message_search_delete ON memory_app_message;
CREATE OR REPLACE FUNCTION memory_app_message_search_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM memory_app_context WHERE id = OLD.context_id FOR NO KEY UPDATE;
    DELETE FROM memory_app_messagesearch WHERE context_id = OLD.context_id AND seq = OLD.seq;
    RETURN NULL;
END $$;
CREATE TRIGGER message_search_delete AFTER DELETE ON memory_app_message
    FOR EACH ROW EXECUTE FUNCTION memory_app_message_search_delete();
"""
)

# The triggers as migrations 0013 and 0019 left them.
REVERSE_SQL = (
    """
CREATE OR REPLACE FUNCTION memory_app_message_search_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM memory_app_context WHERE id IN (OLD.context_id, NEW.context_id)
        ORDER BY id FOR NO KEY UPDATE;
"""
    + UPDATE_BODY
    + """
DROP TRIGGER message_search_delete ON memory_app_message;
CREATE OR REPLACE FUNCTION memory_app_message_search_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM memory_app_context
        WHERE id IN (SELECT DISTINCT context_id FROM deleted_messages) ORDER BY id FOR NO KEY UPDATE;
    DELETE FROM memory_app_messagesearch s USING deleted_messages d
        WHERE s.context_id = d.context_id AND s.seq = d.seq;
    RETURN NULL;
END $$;
CREATE TRIGGER message_search_delete AFTER DELETE ON memory_app_message
    REFERENCING OLD TABLE AS deleted_messages
    FOR EACH STATEMENT EXECUTE FUNCTION memory_app_message_search_delete();
"""
)


class Migration(migrations.Migration):
    dependencies = [
        ("memory_app", "0022_run_table_columns"),
    ]

    operations = [migrations.RunSQL(FORWARD_SQL, REVERSE_SQL)]
