# Each model's HNSW index moves to half precision (embedding_hnsw_… on vector::vector(D) becomes
# embedding_hnswh_… on vector::halfvec(D)): about 40 % fewer pages for the same recall, so a
# large store's index stays in memory. Rows keep their full-precision vectors. The new index is
# built for every model that has vectors (this takes a while on a large store: ~2 min per
# 250,000 384-d vectors on 2 cores); searches scan exactly until it exists.

import hashlib

from django.conf import settings
from django.db import migrations
from psycopg import sql

# What this migration builds, as the code built it when the migration was written (from
# memory_app/embeddings/indexer.py, kept here so that a later change there never changes this step): each
# model's partial HNSW index, cosine on `vector::halfvec(D)`, of every row of the model (0011 adds
# `AND indexed`); m and ef_construction are the configured ones.
HNSW_MAX_DIMENSIONS = 2000


def index_name(model, dimensions, prefix):
    return f"{prefix}{hashlib.sha1(model.encode()).hexdigest()[:12]}_{dimensions}"  # noqa: S324


def replace_model_indexes(db, *, prefix, retired):
    """Build every model's index (named with `prefix`), then drop the indexes named with a
    `retired` prefix once the new ones serve; CONCURRENTLY outside a transaction, so the store
    stays readable and writable meanwhile."""
    concurrently = not db.in_atomic_block
    drop = "DROP INDEX CONCURRENTLY" if concurrently else "DROP INDEX"
    with db.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT model, dimensions FROM memory_app_embedding"
            " WHERE vector IS NOT NULL AND dimensions BETWEEN 1 AND %s",
            [HNSW_MAX_DIMENSIONS],
        )
        for model, dims in cursor.fetchall():
            statement = sql.SQL(
                "CREATE INDEX {concurrently} IF NOT EXISTS {name} ON memory_app_embedding "
                "USING hnsw ((vector::halfvec({dims})) halfvec_cosine_ops) "
                "WITH (m = {m}, ef_construction = {efc}) "
                "WHERE model = {model} AND dimensions = {dims}"
            ).format(
                concurrently=sql.SQL("CONCURRENTLY" if concurrently else ""),
                name=sql.Identifier(index_name(model, dims, prefix)),
                dims=sql.Literal(int(dims)),
                m=sql.Literal(int(settings.AGENTMEMORY_HNSW_M)),
                efc=sql.Literal(int(settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION)),
                model=sql.Literal(model),
            )
            cursor.execute(statement.as_string(db.connection))
        for old in retired:
            cursor.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'memory_app_embedding'"
                " AND indexname LIKE %s",
                [old.replace("_", r"\_") + "%"],
            )
            for (name,) in cursor.fetchall():
                cursor.execute(f'{drop} IF EXISTS "{name}"')


def to_halfvec(apps, schema_editor):
    replace_model_indexes(
        schema_editor.connection, prefix="embedding_hnswh_", retired=["embedding_hnsw_"]
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
