"""Vectors in a backup: each embedding line is checked against this server's model registry
(as any vector a client sends is) and attaches to the message or memory it names by natural key.
A message's or memory's vector of a model it has already (in its graph or waiting) is left as
it is."""

from __future__ import annotations

from typing import Any

from memory_app.backup.format import EMBEDDING_FIELDS, load_fields
from memory_app.embeddings.providers import active_model_name
from memory_app.embeddings.registry import registered_dimensions, unregistered
from memory_app.errors import BackupFormatError
from memory_app.models import (
    Embedding,
    EmbeddingWaiting,
    MemoryEmbedding,
    MemoryEmbeddingWaiting,
    Message,
)


def import_embeddings(importer: Any, records: list[dict[str, Any]]) -> None:
    """One chunk of embedding lines (`importer`: restore's `_Importer`): a message's vector only
    in a context the file defines, a memory's only on a record a memory line resolved to."""
    rows: dict[type, list] = {Embedding: [], MemoryEmbedding: []}
    for rec in records:
        table = Embedding if rec["item"] == "message" else MemoryEmbedding
        emb = table(**load_fields(rec, EMBEDDING_FIELDS), vector=rec.get("vector"))
        emb.dimensions = len(rec["vector"]) if rec.get("vector") is not None else None
        _check_model(emb.model, emb.dimensions)
        if table is Embedding:
            ctx_pk = importer.context_id(rec["context"])
            emb.message_id = (
                Message.objects.filter(context_id=ctx_pk, seq=rec["seq"])
                .values_list("pk", flat=True)
                .first()
            )
            emb.context_id = ctx_pk
            item = emb.message_id
            exists = any(
                kind.objects.filter(context_id=ctx_pk, message_id=item, model=emb.model).exists()
                for kind in (Embedding, EmbeddingWaiting)
            )
        else:
            # Only a memory a line of this file resolved to (inside the importer's
            # confinement): a digest and hash of any other record attach nothing.
            item = emb.memory_record_id = importer.memories.get(
                (rec["scope_digest"], rec["content_hash"]), (None, None)
            )[0]
            exists = any(
                kind.objects.filter(memory_record_id=item, model=emb.model).exists()
                for kind in (MemoryEmbedding, MemoryEmbeddingWaiting)
            )
        if exists or item is None:
            importer.result.count("embeddings", 0, 1)
            continue
        rows[table].append(emb)
    for table, new in rows.items():
        importer.insert(table, new, [])
        importer.result.count("embeddings", len(new), 0)


def _check_model(model: str, dimensions: int | None) -> None:
    """An embedding line's model must be registered here, its vector of the registered length,
    like any vector a client sends: a backup is no way around the registry. A pending line (no
    vector yet) may also name the configured provider's model, which registers itself when the
    worker first embeds with it."""
    if dimensions is None and model == active_model_name():
        return
    expected = registered_dimensions(model)
    if expected is None:
        raise BackupFormatError(f"an embedding line: {unregistered(model)}")
    if dimensions is not None and dimensions != expected:
        raise BackupFormatError(
            f"an embedding line: model {model!r} has {expected} dimensions, "
            f"this vector has {dimensions}"
        )
