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
    in a context the file defines, a memory's only on a record a memory line resolved to. The
    chunk's messages and the vectors they hold are read together, one query each per context;
    the memories' vectors likewise, one query each."""
    lines = []
    for rec in records:
        table = Embedding if rec["item"] == "message" else MemoryEmbedding
        emb = table(**load_fields(rec, EMBEDDING_FIELDS), vector=rec.get("vector"))
        emb.dimensions = len(rec["vector"]) if rec.get("vector") is not None else None
        _check_model(emb.model, emb.dimensions)
        if table is Embedding:
            emb.context_id = importer.context_id(rec["context"])
        else:
            # Only a memory a line of this file resolved to (inside the importer's
            # confinement): a digest and hash of any other record attach nothing.
            emb.memory_record_id = importer.memories.get(
                (rec["scope_digest"], rec["content_hash"]), (None, None)
            )[0]
        lines.append((rec, emb))
    messages = [(rec, emb) for rec, emb in lines if isinstance(emb, Embedding)]
    held = _message_vectors_held(messages) | _memory_vectors_held(
        [emb for _, emb in lines if isinstance(emb, MemoryEmbedding)]
    )
    rows: dict[type, list] = {Embedding: [], MemoryEmbedding: []}
    for _, emb in lines:
        item = emb.message_id if isinstance(emb, Embedding) else emb.memory_record_id
        if item is None or (type(emb), item, emb.model) in held:
            importer.result.count("embeddings", 0, 1)
            continue
        rows[type(emb)].append(emb)
    for table, new in rows.items():
        importer.insert(table, new, [])
        importer.result.count("embeddings", len(new), 0)


def _message_vectors_held(lines: list[tuple[dict[str, Any], Embedding]]) -> set[tuple]:
    """Sets each line's message (None when its seq is not stored in its context) and answers
    (Embedding, message, model) for each vector or waiting row of those messages and models:
    per context, one read of its messages and one of each vector table, each in the context."""
    by_context: dict[int, list[tuple[dict[str, Any], Embedding]]] = {}
    for rec, emb in lines:
        by_context.setdefault(emb.context_id, []).append((rec, emb))
    held: set[tuple] = set()
    for ctx_pk, group in by_context.items():
        ids = dict(
            Message.objects.filter(
                context_id=ctx_pk, seq__in={rec["seq"] for rec, _ in group}
            ).values_list("seq", "pk")
        )
        for rec, emb in group:
            emb.message_id = ids.get(rec["seq"])
        wanted = {emb.message_id for _, emb in group} - {None}
        if not wanted:
            continue
        for kind in (Embedding, EmbeddingWaiting):
            found = kind.objects.filter(
                context_id=ctx_pk,
                message_id__in=wanted,
                model__in={emb.model for _, emb in group},
            ).values_list("message_id", "model")
            held |= {(Embedding, message, model) for message, model in found}
    return held


def _memory_vectors_held(rows: list[MemoryEmbedding]) -> set[tuple]:
    """(MemoryEmbedding, record, model) for each vector or waiting row these lines' records hold
    of their models, one read of each table."""
    wanted = {emb.memory_record_id for emb in rows} - {None}
    if not wanted:
        return set()
    held: set[tuple] = set()
    for kind in (MemoryEmbedding, MemoryEmbeddingWaiting):
        found = kind.objects.filter(
            memory_record_id__in=wanted, model__in={emb.model for emb in rows}
        ).values_list("memory_record_id", "model")
        held |= {(MemoryEmbedding, record, model) for record, model in found}
    return held


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
