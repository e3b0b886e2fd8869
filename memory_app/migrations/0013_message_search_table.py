"""Move messages' full-text vectors out of the message row into MessageSearch.

The stored generated `search_vector` parsed every message's text inside the INSERT or COPY that
stored it: a third of PostgreSQL's work for a batch of text. Now a large batch is stored
without it and the indexer (`memory_app.search.fulltext`) parses it afterwards; `Context.search_seq`
tells searches up to where the vectors exist (later messages are matched from their text).

The existing vectors of live messages are copied, not recomputed, and every context starts
caught up. Triggers keep the side table in step with any writer, ORM or SQL:
- an UPDATE of a live message's text parses it again; pruning a message deletes its vector and
  restoring it writes it back; a message moved to another context or seq takes it along (each
  after locking the context row, which the indexer holds while it fills a context: the two
  never race on one message; the domain's writers lock the context before the message, see
  `logbook.lock_contexts`);
- a DELETE of messages deletes their vectors (statement-level: one join for a whole purge).

Writes to messages wait while it runs (about 20 s per million messages here). The space the
dropped column held stays in the existing rows until they are rewritten: `VACUUM FULL
memory_app_message` returns it (it locks the table while it rewrites it).
"""

import django.contrib.postgres.indexes
import django.contrib.postgres.search
from django.db import migrations, models

FTS_CONFIG = "english"  # memory_app.models.FTS_CONFIG when this migration was written

FORWARD_SQL = f"""
-- Writers wait (readers do not) until the copy and the triggers are in place: a prune or an
-- edit committed between the two would leave a stale vector.
LOCK TABLE memory_app_message IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
    SELECT context_id, seq, search_vector FROM memory_app_message WHERE pruned_at IS NULL
    ORDER BY context_id, seq;
UPDATE memory_app_context SET search_seq = last_seq WHERE search_seq <> last_seq;

CREATE FUNCTION memory_app_message_search_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM memory_app_context WHERE id IN (OLD.context_id, NEW.context_id)
        ORDER BY id FOR NO KEY UPDATE;
    IF (OLD.context_id, OLD.seq) IS DISTINCT FROM (NEW.context_id, NEW.seq) THEN
        -- Moved (no domain path does; a hand-made UPDATE might): the vector follows the key.
        DELETE FROM memory_app_messagesearch WHERE context_id = OLD.context_id AND seq = OLD.seq;
        IF NEW.pruned_at IS NULL THEN
            INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
                VALUES (NEW.context_id, NEW.seq, to_tsvector('{FTS_CONFIG}', NEW.text))
                ON CONFLICT (context_id, seq) DO UPDATE SET search_vector = EXCLUDED.search_vector;
        END IF;
    ELSIF NEW.pruned_at IS NOT NULL THEN
        DELETE FROM memory_app_messagesearch WHERE context_id = NEW.context_id AND seq = NEW.seq;
    ELSIF OLD.pruned_at IS NOT NULL THEN
        INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
            VALUES (NEW.context_id, NEW.seq, to_tsvector('{FTS_CONFIG}', NEW.text))
            ON CONFLICT (context_id, seq) DO UPDATE SET search_vector = EXCLUDED.search_vector;
    ELSE
        UPDATE memory_app_messagesearch SET search_vector = to_tsvector('{FTS_CONFIG}', NEW.text)
            WHERE context_id = NEW.context_id AND seq = NEW.seq;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER message_search_update AFTER UPDATE OF text, pruned_at, context_id, seq
    ON memory_app_message FOR EACH ROW WHEN (
        OLD.text IS DISTINCT FROM NEW.text OR (OLD.pruned_at IS NULL) <> (NEW.pruned_at IS NULL)
        OR OLD.context_id <> NEW.context_id OR OLD.seq <> NEW.seq
    )
    EXECUTE FUNCTION memory_app_message_search_update();

CREATE FUNCTION memory_app_message_search_delete() RETURNS trigger LANGUAGE plpgsql AS $$
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

REVERSE_SQL = """
DROP TRIGGER IF EXISTS message_search_delete ON memory_app_message;
DROP FUNCTION IF EXISTS memory_app_message_search_delete();
DROP TRIGGER IF EXISTS message_search_update ON memory_app_message;
DROP FUNCTION IF EXISTS memory_app_message_search_update();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0012_embedding_redundant_indexes'),
    ]

    operations = [
        migrations.CreateModel(
            name='MessageSearch',
            fields=[
                ('pk', models.CompositePrimaryKey('context_id', 'seq', blank=True, editable=False, primary_key=True, serialize=False)),
                ('context_id', models.BigIntegerField()),
                ('seq', models.BigIntegerField()),
                ('search_vector', django.contrib.postgres.search.SearchVectorField()),
            ],
        ),
        migrations.AddField(
            model_name='context',
            name='search_seq',
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        # Filled before its GIN index exists: one sort instead of an insertion per row.
        migrations.RunSQL(FORWARD_SQL, REVERSE_SQL),
        migrations.AddIndex(
            model_name='messagesearch',
            index=django.contrib.postgres.indexes.GinIndex(fields=['search_vector'], name='message_search_gin'),
        ),
        migrations.AddIndex(
            model_name='context',
            index=models.Index(condition=models.Q(('search_seq__lt', models.F('last_seq'))), fields=['id'], name='context_search_behind_idx'),
        ),
        migrations.RemoveIndex(
            model_name='message',
            name='message_fts_gin',
        ),
        migrations.RemoveField(
            model_name='message',
            name='search_vector',
        ),
    ]
