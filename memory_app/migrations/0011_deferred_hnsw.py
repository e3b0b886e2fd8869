# Vectors of a large batch are stored first and inserted into their model's HNSW graph later
# (`Embedding.indexed`, see memory_app.embeddings.indexer.index_batch): each model's index now holds the
# `indexed` rows only (embedding_hnswh_… becomes embedding_hnswi_… with `AND indexed` in its
# predicate), and a small partial btree finds the rows still waiting. The new index is built
# CONCURRENTLY before the old one is dropped, so searches walk a graph throughout; this takes as
# long as migration 0010 did on a large store (~2 min per 250,000 384-d vectors on 2 cores).

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


def rebuild_with_predicate(apps, schema_editor):
    from memory_app.embeddings import indexer

    indexer.replace_model_indexes(
        schema_editor.connection,
        prefix="embedding_hnswi_",
        indexed_only=True,
        retired=["embedding_hnswh_", "embedding_hnsw_"],
    )


def back_to_halfvec(apps, schema_editor):
    """Back to 0010: every waiting row is marked indexed (0010's index holds them all) and the
    predicate indexes go; the earlier code builds its own on the next write."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("UPDATE memory_app_embedding SET indexed = true WHERE NOT indexed")
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'memory_app_embedding'"
            r" AND indexname LIKE 'embedding\_hnswi\_%'"
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memory_app", "0010_halfvec_hnsw")]

    operations = [
        migrations.AddField(
            model_name="embedding",
            name="indexed",
            field=models.BooleanField(db_default=True, default=True),
        ),
        migrations.RunPython(rebuild_with_predicate, back_to_halfvec),
        AddIndexConcurrently(
            model_name="embedding",
            index=models.Index(
                condition=models.Q(("indexed", False)),
                fields=["model", "context"],
                name="embedding_unindexed",
            ),
        ),
    ]
