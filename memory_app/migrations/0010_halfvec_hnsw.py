# Each model's HNSW index moves to half precision (embedding_hnsw_… on vector::vector(D) becomes
# embedding_hnswh_… on vector::halfvec(D)): about 40 % fewer pages for the same recall, so a
# large store's index stays in memory. Rows keep their full-precision vectors. The new index is
# built for every model that has vectors (this takes a while on a large store: ~2 min per
# 250,000 384-d vectors on 2 cores); searches scan exactly until it exists.

from django.db import migrations


def to_halfvec(apps, schema_editor):
    from memory_app.embeddings import indexer

    # 0010's index as it was: every row of the model (0011 adds `AND indexed`).
    indexer.replace_model_indexes(
        schema_editor.connection,
        prefix="embedding_hnswh_",
        indexed_only=False,
        retired=["embedding_hnsw_"],
    )


def drop_halfvec(apps, schema_editor):
    """Back to 0009: the halfvec indexes go; the earlier code builds its own on the next write."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'memory_app_embedding'"
            r" AND indexname LIKE 'embedding\_hnswh\_%'"
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memory_app", "0009_index_review")]

    operations = [migrations.RunPython(to_halfvec, drop_halfvec)]
