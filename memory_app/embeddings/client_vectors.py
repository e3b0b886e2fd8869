"""Vectors sent by clients: checked against their model's registration (an unregistered name is
refused, listing the registered ones) and dimensions, then stored (one row, or a binary COPY for
a batch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from django.conf import settings
from django.db import connection, transaction

from memory_app import db
from memory_app.embeddings import indexer
from memory_app.embeddings.indexer import ensure_model_index
from memory_app.embeddings.providers import active_model_name
from memory_app.embeddings.registry import require_registered
from memory_app.errors import DimensionMismatch, Invalid
from memory_app.models import (
    Embedding,
    EmbeddingRetry,
    EmbeddingWaiting,
    MemoryEmbedding,
    MemoryEmbeddingRetry,
    MemoryEmbeddingWaiting,
    MemoryRecord,
    Message,
)

# The largest magnitude a half-precision float (the HNSW index's `halfvec`) holds.
HALFVEC_MAX = 65504.0


def check_vector(*, model: str, vector: Sequence[float]) -> list[float]:
    """One client vector checked against its model's dimensions (see `client_vectors`)."""
    if not model or len(model) > 200:
        raise Invalid("model must be a non-empty name of at most 200 characters")
    [checked] = client_vectors([(vector, model, "vector")], label="")
    return checked.values.tolist()


def vector_put(
    *,
    model: str,
    vector: Sequence[float],
    message: Message | None = None,
    memory_record: MemoryRecord | None = None,
) -> Embedding | MemoryEmbedding:
    """Store a client-computed vector for one item under `model` (replacing an earlier one)."""
    values = check_vector(model=model, vector=vector)
    if (message is None) == (memory_record is None):
        raise Invalid("a vector belongs to exactly one message or memory record")
    if message is not None:
        # By its context too: on Citus the statements go to the context's shard.
        of = {"context_id": message.context_id}
        rows, retries = Embedding.objects.filter(**of), EmbeddingRetry.objects.filter(**of)
        waiting = EmbeddingWaiting.objects.filter(**of)
        item = {"message": message, **of}
    else:
        rows, retries = MemoryEmbedding.objects.all(), MemoryEmbeddingRetry.objects.all()
        waiting = MemoryEmbeddingWaiting.objects.all()
        item = {"memory_record": memory_record}
    with transaction.atomic():
        # A vector of the item still waiting for the graph is replaced too: an item's vector
        # under a model is in one of the two tables only.
        waiting.filter(**item, model=model).delete()
        row, _ = rows.select_for_update().get_or_create(**item, model=model)
        row.vector, row.dimensions = values, len(values)
        row.save()
        retries.filter(embedding=row).delete()
    ensure_model_index(model=model, dimensions=len(values))
    return row


@dataclass(frozen=True)
class ClientVector:
    """A checked client vector for one item of a batch, ready for `vectors_copy`."""

    model: str
    values: np.ndarray  # float32, one dimension


def client_vectors(
    items: Sequence[tuple[Sequence[float] | None, str | None, str | None]],
    *,
    label: str,
) -> list[ClientVector | None]:
    """Check the `(vector, vector_model, where)` of every item of a batch before anything is
    written.

    The model is the item's `vector_model`, else the configured one (a vector with neither is
    refused). The model must be registered (`registry`: a 422 listing the registered names, so a
    tenant can neither fix the dimensions of a name nor add an index), and every vector of it
    must have its registered dimensions; a failure names the item (its `where`, else
    `label[i]`).
    Returns one entry per item.
    """
    out: list[ClientVector | None] = []
    active = None
    for n, (vector, model, where) in enumerate(items):
        item_where = where or f"{label}[{n}]"
        if vector is None:
            if model:
                raise Invalid(f"{item_where}: vector_model given without a vector")
            out.append(None)
            continue
        if not model:
            active = active or active_model_name()
            if active is None:
                raise Invalid(
                    f"{item_where}: give vector_model (no embedding provider is configured, "
                    "so the vector's model cannot be implied)"
                )
            model = active
        if len(model) > 200:
            raise Invalid(f"{item_where}: vector_model is longer than 200 characters")
        try:
            values = np.asarray(vector, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise Invalid(f"{item_where}: the vector must be a list of numbers") from exc
        if values.ndim != 1 or not 1 <= len(values) <= 16000:
            raise DimensionMismatch(f"{item_where}: a vector is a flat list of 1 to 16,000 numbers")
        if not np.isfinite(values).all():
            raise Invalid(f"{item_where}: the vector holds NaN or infinite values")
        if np.abs(values).max() > HALFVEC_MAX:
            raise Invalid(
                f"{item_where}: the vector holds a value beyond ±65,504, which its index (half "
                "precision) cannot hold; embeddings are normally within ±1"
            )
        expected = require_registered(model, where=item_where)
        if len(values) != expected:
            raise DimensionMismatch(
                f"{item_where}: model {model!r} has {expected} dimensions, "
                f"this vector has {len(values)}"
            )
        out.append(ClientVector(model, values))
    return out


# Per table: the item's columns, then the vector's.
VECTOR_COPY_COLUMNS = {
    Embedding._meta.db_table: ("message_id", "context_id"),
    MemoryEmbedding._meta.db_table: ("memory_record_id",),
}
_VECTOR_COLUMNS = ("model", "dimensions", "vector")
_VECTOR_TYPES = ["text", "int4", "vector"]


def vectors_copy(
    rows: Sequence[tuple[int | None, int | None, int | None, ClientVector]],
) -> bool:
    """Store checked client vectors with one binary COPY: rows of (message_id, memory_record_id,
    context_id, vector) (a message's into `Embedding`, a memory record's into `MemoryEmbedding`),
    for items that have no row of that model yet (new items). Call inside
    the transaction that created the items; `ensure_vector_indexes` after it. True when the rows
    wait for the indexer: the caller wakes it once the transaction commits.

    A batch of at least `AGENTMEMORY_INDEX_DEFER_MIN` vectors is written into the waiting side
    tables (`EmbeddingWaiting`, `MemoryEmbeddingWaiting`): the COPY then skips the HNSW graph
    (inserting each vector into it was most of the batch's cost) and the indexer moves them into
    the vector tables once the transaction commits (`memory_app.backlog`). Searches scan such
    rows exactly until then. Smaller batches go into the graph at once."""
    if not rows:
        return False
    deferred = len(rows) >= settings.AGENTMEMORY_INDEX_DEFER_MIN
    from pgvector.psycopg.vector import register_vector_info
    from psycopg.types import TypeInfo

    connection.ensure_connection()
    # On psycopg's own cursor (the type's lookup and the COPY), whose errors Django does not
    # translate: a database fault there is still a 503.
    with connection.cursor() as wrapper, db.copy_errors_as_django():
        cursor = wrapper.cursor
        # pgvector's binary dumper on this cursor only: the ORM keeps its own conversions.
        register_vector_info(cursor, TypeInfo.fetch(cursor.connection, "vector"))
        for table, item_columns in VECTOR_COPY_COLUMNS.items():
            of_messages = "message_id" in item_columns
            mine = [
                ((message_id, context_id) if of_messages else (memory_id,), v)
                for message_id, memory_id, context_id, v in rows
                if (message_id is not None) == of_messages
            ]
            if not mine:
                continue
            columns = ", ".join(item_columns + _VECTOR_COLUMNS)
            into = indexer.WAITING_TABLES[table] if deferred else table
            with cursor.copy(
                f"COPY {into} ({columns}) FROM STDIN WITH (FORMAT BINARY)"  # noqa: S608 - constants
            ) as copy:
                copy.set_types(["int8"] * len(item_columns) + _VECTOR_TYPES)
                for item, v in mine:
                    copy.write_row((*item, v.model, len(v.values), v.values))
    return deferred


def ensure_vector_indexes(vectors: Sequence[ClientVector | None]) -> None:
    """The HNSW index of every model among `vectors` (once per process and model)."""
    for model, dims in {(v.model, len(v.values)) for v in vectors if v is not None}:
        ensure_model_index(model=model, dimensions=dims)
