"""Full-text vectors of a bounded prefix of the text, and a failed vector marked, not blocking.

PostgreSQL refuses a tsvector whose distinct lexemes hold more than 1 MB ("string is too long
for tsvector"): a message of log-like text about that size could not be appended alone, and
stored in a batch it stopped the indexer and made keyword search on its context fail. Every
vector of a message is now `memory_app_search_vector(config, text)`, the vector of the text's
first `memory_app_search_chars()` characters, whoever computes it (the indexer, an append,
keyword search for messages the indexer has not reached, these triggers).

The bound: a character is at most 4 bytes of UTF-8 and lower-casing keeps it to one code point
of at most 4 bytes (or `İ`'s 3), and the parser emits a compound (hyphenated word, URL) once
whole and once in parts, so the lexemes of N characters hold fewer than 8 N bytes, whatever
the text: 128,000 characters stay under 1,024,000 bytes.

A row whose vector cannot be written all the same keeps a null vector and the error that
stopped it (`error`): the indexer goes on to the next messages and contexts, and keyword search
does not find that message until its text is edited (the trigger parses it again and clears the
error).

Frozen: the SQL is written out here (the config is `memory_app.models.FTS_CONFIG` when this
migration was written); changing the bound is a new migration that replaces
`memory_app_search_chars()` and re-parses MessageSearch.
"""

import django.contrib.postgres.search
from django.db import migrations, models

FTS_CONFIG = "english"
INDEXED_CHARS = 128_000

TRIGGER_SQL = """
CREATE OR REPLACE FUNCTION memory_app_message_search_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM memory_app_context WHERE id IN (OLD.context_id, NEW.context_id)
        ORDER BY id FOR NO KEY UPDATE;
    IF (OLD.context_id, OLD.seq) IS DISTINCT FROM (NEW.context_id, NEW.seq) THEN
        -- Moved (no domain path does; a hand-made UPDATE might): the vector follows the key.
        DELETE FROM memory_app_messagesearch WHERE context_id = OLD.context_id AND seq = OLD.seq;
        IF NEW.pruned_at IS NULL THEN
            INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
                VALUES (NEW.context_id, NEW.seq, {vector})
                ON CONFLICT (context_id, seq) DO UPDATE
                SET search_vector = EXCLUDED.search_vector{clear};
        END IF;
    ELSIF NEW.pruned_at IS NOT NULL THEN
        DELETE FROM memory_app_messagesearch WHERE context_id = NEW.context_id AND seq = NEW.seq;
    ELSIF OLD.pruned_at IS NOT NULL THEN
        INSERT INTO memory_app_messagesearch (context_id, seq, search_vector)
            VALUES (NEW.context_id, NEW.seq, {vector})
            ON CONFLICT (context_id, seq) DO UPDATE
            SET search_vector = EXCLUDED.search_vector{clear};
    ELSE
        UPDATE memory_app_messagesearch SET search_vector = {vector}{clear}
            WHERE context_id = NEW.context_id AND seq = NEW.seq;
    END IF;
    RETURN NULL;
END $$;
"""

FORWARD_SQL = f"""
CREATE FUNCTION memory_app_search_chars() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN {INDEXED_CHARS};
CREATE FUNCTION memory_app_search_vector(config regconfig, body text) RETURNS tsvector
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN to_tsvector(config, left(body, memory_app_search_chars()));
""" + TRIGGER_SQL.format(
    vector=f"memory_app_search_vector('{FTS_CONFIG}', NEW.text)", clear=", error = NULL"
)

# The trigger function as migration 0013 wrote it.
REVERSE_SQL = TRIGGER_SQL.format(vector=f"to_tsvector('{FTS_CONFIG}', NEW.text)", clear="") + """
DROP FUNCTION memory_app_search_vector(regconfig, text);
DROP FUNCTION memory_app_search_chars();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('memory_app', '0018_trace_span_retention'),
    ]

    operations = [
        migrations.AlterField(
            model_name='messagesearch',
            name='search_vector',
            field=django.contrib.postgres.search.SearchVectorField(null=True),
        ),
        migrations.AddField(
            model_name='messagesearch',
            name='error',
            field=models.TextField(null=True),
        ),
        migrations.RunSQL(FORWARD_SQL, REVERSE_SQL),
    ]
