"""Long-term memory: facts, preferences, task lessons and tool guidelines an agent can recall.

Semantics follow AgentScope 1.x's LongTermMemoryBase (reference/frameworks.md §3.4):
`record_to_memory(thinking, content: list[str])` records several facts with one thought, and
`retrieve_from_memory(keywords, limit)` answers up to `limit` records *per keyword*. Curation is
Mem0-like: records are edited, archived and restored, each change audited with before/after.

A record lives in a scope:
- one context (`Scope(context=...)`), seen only there; or
- a key subset (`Scope(keys={"user": "ada"})`), seen by every context whose keys contain it
  (`{"user": "ada", "chat": "7"}` sees it, `{"user": "bob"}` does not).
Recording the same content again in the same scope returns the existing record (the database
holds unique (scope_digest, content_hash); whitespace differences do not make new content).

This module is the one implementation: the API (`memory_app.api.memories`) and the dashboard
(`memory_app.views.memories`: promote a message or step, edit, archive, merge, list) both call it,
so a fact promoted in the dashboard and recorded by an agent in the same scope is one record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.conf import settings
from django.contrib.postgres.search import SearchQuery, SearchRank
from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from memory_app import auth, errors, search
from memory_app.audit import Actor, audit_record
from memory_app.embeddings import client_vectors, indexer, providers, queue
from memory_app.errors import Conflict, Forbidden, Invalid, NotFound
from memory_app.models import (
    FTS_CONFIG,
    ApiKey,
    Context,
    MemoryKind,
    MemoryRecord,
    Message,
    Step,
    keys_digest,
)

MAX_CONTENT_CHARS = 20_000
MAX_ITEMS = 200
MAX_LIMIT = 100
EDITABLE = ("content", "kind", "thinking", "keywords", "metadata")


@dataclass(frozen=True)
class Scope:
    """Exactly one of: a context, or a dict of keys shared by many contexts."""

    context: Context | None = None
    keys: dict[str, Any] | None = None

    def __post_init__(self):
        if (self.context is None) == (self.keys is None):
            raise Invalid("a memory scope is either one context or a set of context keys")
        if self.keys is not None and not isinstance(self.keys, dict):
            raise Invalid("scope keys must be an object")

    @property
    def digest(self) -> str:
        if self.context is not None:
            # Distinct from a key-subset scope equal to the context's keys: that one also covers
            # contexts with more keys.
            # The context's keys digest, not its pk: a backup restored into another database
            # keeps its records' digests, so recording the same content there still de-duplicates.
            return keys_digest({"__context__": self.context.keys_digest})
        return keys_digest(self.keys)

    @property
    def scope_keys(self) -> dict[str, Any]:
        return dict(self.context.keys) if self.context is not None else dict(self.keys)

    def covers(self, context: Context) -> bool:
        if self.context is not None:
            return self.context.pk == context.pk
        return all(k in context.keys and context.keys[k] == v for k, v in self.keys.items())


def scope_of(record: MemoryRecord) -> Scope:
    if record.context_id is not None:
        return Scope(context=record.context)
    return Scope(keys=record.scope_keys)


def scope_for_key(
    key: ApiKey, *, context_id: int | None = None, scope_keys: dict[str, Any] | None = None
) -> Scope:
    """The scope an API key records into: a key subset (`scope_keys`, which must lie inside the
    key's confinement and, with `context_id`, be a subset of that context's keys) or a context."""
    if scope_keys is not None:
        if not auth.keys_allowed(key, scope_keys):
            raise Forbidden("scope_keys lie outside this API key's context keys")
        if context_id is not None:
            context = auth.context_for_key(key, context_id)
            if not Scope(keys=scope_keys).covers(context):
                raise Invalid("scope_keys must be a subset of the context's keys")
        return Scope(keys=scope_keys)
    if context_id is None:
        raise Invalid("give context_id (context scope) or scope_keys (key subset scope)")
    return Scope(context=auth.context_for_key(key, context_id))


def content_hash(content: str) -> str:
    return hashlib.sha256(" ".join(content.split()).encode()).hexdigest()


def _snapshot(record: MemoryRecord) -> dict[str, Any]:
    return {f: getattr(record, f) for f in EDITABLE} | {
        "archived_at": record.archived_at.isoformat() if record.archived_at else None
    }


def _no_nul(value: str, what: str) -> str:
    # PostgreSQL text cannot hold NUL: refuse clearly instead of failing in the database.
    if "\x00" in value:
        raise Invalid(f"the memory {what} contains a NUL character")
    return value


def _clean_content(content: Any) -> str:
    if not isinstance(content, str) or not content.strip():
        raise Invalid("memory content must be a non-empty string")
    _no_nul(content, "content")
    if len(content) > MAX_CONTENT_CHARS:
        raise Invalid(f"memory content is longer than {MAX_CONTENT_CHARS} characters")
    return content.strip()


def _clean_kind(kind: Any) -> str:
    kind = kind or MemoryKind.FACT
    if kind not in MemoryKind.values:
        raise Invalid(f"kind must be one of {', '.join(MemoryKind.values)}")
    return kind


def _clean_keywords(keywords: Any) -> list[str]:
    keywords = keywords or []
    if not isinstance(keywords, list | tuple) or not all(
        isinstance(k, str) and 0 < len(k) <= 200 for k in keywords
    ):
        raise Invalid("keywords must be a list of strings of 1 to 200 characters")
    for k in keywords:
        _no_nul(k, "keywords")
    return list(dict.fromkeys(k.strip() for k in keywords if k.strip()))


def _check_source(scope: Scope, *, message_id: int | None, step_id: int | None) -> None:
    """Provenance must come from a context the scope covers (no pointing into other tenants)."""
    if message_id is not None:
        message = Message.objects.select_related("context").filter(pk=message_id).first()
        if message is None or not scope.covers(message.context):
            raise NotFound(f"message {message_id} not found in this scope")
    if step_id is not None:
        step = Step.objects.select_related("run__context").filter(pk=step_id).first()
        if step is None or not scope.covers(step.run.context):
            raise NotFound(f"step {step_id} not found in this scope")


class Recorded(NamedTuple):
    """A tuple, so callers may write `record, created = ...`."""

    record: MemoryRecord
    created: bool


def memories_record(
    *, scope: Scope, items: Sequence[dict[str, Any]], actor: Actor, thinking: str = ""
) -> list[Recorded]:
    """Record facts into `scope`, all or nothing. Each item: content, and optionally kind,
    thinking (defaults to the shared `thinking`), keywords, metadata, source_message_id,
    source_step_id. Content already in the scope returns the stored record (created False)."""
    return _record(scope=scope, items=items, actor=actor, thinking=thinking, action="record")


def _record(
    *,
    scope: Scope,
    items: Sequence[dict[str, Any]],
    actor: Actor,
    thinking: str,
    action: str,
    note: str = "",
) -> list[Recorded]:
    if not items:
        raise Invalid("nothing to record")
    if len(items) > MAX_ITEMS:
        raise Invalid(f"at most {MAX_ITEMS} memories per request")
    if scope.keys is not None and not scope.keys:
        # An empty subset is contained in every context's keys: it would be seen by every
        # tenant. A memory for one context takes that context's scope instead.
        raise Invalid("scope_keys must name at least one key (an empty set would reach every context)")
    # Client vectors are checked before anything is written (a wrong dimension names the item).
    vectors = client_vectors.client_vectors(items, label="items")
    results: list[Recorded] = []
    with transaction.atomic():
        for item in items:
            content = _clean_content(item.get("content"))
            source_message_id, source_step_id = (
                item.get("source_message_id"),
                item.get("source_step_id"),
            )
            _check_source(scope, message_id=source_message_id, step_id=source_step_id)
            fields = {
                "context": scope.context,
                "scope_keys": scope.scope_keys,
                "scope_digest": scope.digest,
                "content": content,
                "content_hash": content_hash(content),
                "kind": _clean_kind(item.get("kind")),
                "thinking": _no_nul(item.get("thinking") or thinking or "", "thinking"),
                "keywords": _clean_keywords(item.get("keywords")),
                "metadata": item.get("metadata") or {},
                "source_message_id": source_message_id,
                "source_step_id": source_step_id,
                "recorded_by": actor.label,
            }
            try:
                with transaction.atomic():
                    record = MemoryRecord.objects.create(**fields)
                created = True
            except IntegrityError:
                record = MemoryRecord.objects.get(
                    scope_digest=fields["scope_digest"], content_hash=fields["content_hash"]
                )
                created = False
            results.append(Recorded(record, created))
        new = [r.record for r in results if r.created]
        if new:
            # New records keep the vectors sent with them (a repeat stores nothing); the rest
            # wait for the configured model's worker.
            fresh = [(r.record, v) for r, v in zip(results, vectors, strict=True) if r.created]
            client_vectors.vectors_copy(
                [(None, rec.pk, rec.context_id, v) for rec, v in fresh if v is not None]
            )
            active = providers.active_model_name()
            queue.enqueue_memory_records(
                [rec for rec, v in fresh if v is None or v.model != active]
            )
            audit_record(
                actor=actor,
                action=action,
                target_type="memoryrecord",
                target_ids=[r.pk for r in new],
                context_id=scope.context.pk if scope.context else None,
                after=[{"id": r.pk, "content": r.content, "kind": r.kind} for r in new],
                note=note,
            )
    client_vectors.ensure_vector_indexes(vectors)
    return results


def memories_visible(
    *, context: Context, include_archived: bool = False, confined_to: dict[str, Any] | None = None
) -> QuerySet[MemoryRecord]:
    """Records a context sees: its own, and those of every non-empty key subset its keys contain.

    `confined_to` (an API key's context keys) also leaves out key subsets outside that
    confinement, as `GET /memories/{id}` does: a confined key never reads a record its tenant
    does not own, even when that record's subset happens to match the context.
    """
    subsets = Q(context__isnull=True, scope_keys__contained_by=context.keys) & ~Q(scope_keys={})
    if confined_to:
        subsets &= Q(scope_keys__contains=confined_to)
    qs = MemoryRecord.objects.filter(Q(context=context) | subsets)
    return qs if include_archived else qs.filter(archived_at__isnull=True)


@dataclass(frozen=True)
class Recalled:
    record: MemoryRecord
    score: float
    reason: str


def _keyword_hits(qs: QuerySet, keyword: str, limit: int) -> list[tuple[MemoryRecord, float]]:
    tsq = SearchQuery(keyword, config=FTS_CONFIG, search_type="websearch")
    # An exact keyword tag outweighs any text rank (ts_rank stays below 1).
    tagged = RawSQL(
        "CASE WHEN EXISTS (SELECT 1 FROM unnest(memory_app_memoryrecord.keywords) k WHERE lower(k) = lower(%s)) "
        "THEN 1.0::real ELSE 0.0::real END",
        [keyword],
    )
    rows = (
        qs.annotate(text_rank=SearchRank(F("search_vector"), tsq), tag_hit=tagged)
        .filter(Q(search_vector=tsq) | Q(tag_hit__gt=0))
        .order_by((F("text_rank") + F("tag_hit")).desc(), "-created_at", "-id")[:limit]
    )
    return [(r, float(r.text_rank) + float(r.tag_hit)) for r in rows]


def _query_vectors(texts: Sequence[str]) -> tuple[list[list[float] | None], str | None]:
    """The provider's vectors for `texts` (one call) and its model; Nones when there is no
    provider or it is down (retrieval then stays full-text, as without vectors)."""
    provider = providers.get_provider()
    if provider is None or not texts:
        return [None] * len(texts), None
    try:
        return list(provider.embed(list(texts))), provider.model
    except errors.ProviderError:
        return [None] * len(texts), None


def _semantic_hits(
    qs: QuerySet, vector: Sequence[float], model: str, fetch: int
) -> list[tuple[int, float]]:
    """(record id, cosine distance) of the records of `qs` nearest to `vector` under `model`,
    through search's vector path: an exact scan while few records are visible, the HNSW index's
    iterative scan beyond."""
    threshold = settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD
    visible = qs.order_by().values("pk")
    share = visible[:threshold].count()
    if share == 0:
        return []
    subquery, params = visible.query.sql_with_params()
    hits, _ = search.nearest_vectors(
        model=model,
        vector=vector,
        limit=fetch,
        item_column="memory_record_id",
        join_sql="",
        where_sql=f"e.memory_record_id IN ({subquery})",
        params=params,
        approximate=share >= threshold and len(vector) <= indexer.HNSW_MAX_DIMENSIONS,
        share=share,
    )
    return hits


def _fused(
    text: list[tuple[int, float]], semantic: list[tuple[int, float]], limit: int, *, first=frozenset()
) -> list[tuple[MemoryRecord, float, str]]:
    """Reciprocal rank fusion of both rankings, best `limit`; ids in `first` (exact keyword
    tags) lead and score one more, as an exact tag outweighs any rank."""
    fused = search.rrf_scores(text, semantic)
    why: dict[int, list[str]] = {}
    for label, ranking in (("text", text), ("semantic", semantic)):
        for rank, (pk, _) in enumerate(ranking, start=1):
            why.setdefault(pk, []).append(f"{label} #{rank}")
    order = sorted(fused.items(), key=lambda kv: (kv[0] not in first, -kv[1], -kv[0]))[:limit]
    records = MemoryRecord.objects.in_bulk([pk for pk, _ in order])
    return [
        (records[pk], score + (1.0 if pk in first else 0.0), ", ".join(why[pk])) for pk, score in order
    ]


def _query_hits(qs: QuerySet, query: str, limit: int) -> list[tuple[MemoryRecord, float, str]]:
    """Full-text (any word) fused with cosine similarity when the records have vectors."""
    from memory_app.search import _any_terms_tsquery

    fetch = max(limit * 3, 20)
    text: list[tuple[int, float]] = []
    tsq_text = _any_terms_tsquery(query)
    if tsq_text:
        tsq = SearchQuery(tsq_text, config="simple", search_type="raw")
        text = [
            (r.pk, float(r.rank))
            for r in qs.annotate(rank=SearchRank(F("search_vector"), tsq))
            .filter(search_vector=tsq)
            .order_by("-rank", "-id")[:fetch]
        ]
    [vector], model = _query_vectors([query])
    semantic = _semantic_hits(qs, vector, model, fetch) if vector is not None else []
    return _fused(text, semantic, limit)


def _keyword_recall(
    qs: QuerySet, keyword: str, vector: Sequence[float] | None, model: str | None, limit: int
) -> list[tuple[MemoryRecord, float, str]]:
    """Up to `limit` records for one keyword: exact tag, then full-text rank; with a vector,
    fused with the records nearest to the keyword's meaning (as AgentScope's Mem0 memory
    retrieves each keyword), exact tags still first."""
    if vector is None:
        return [(r, score, "") for r, score in _keyword_hits(qs, keyword, limit)]
    fetch = max(limit * 3, 20)
    text = _keyword_hits(qs, keyword, fetch)
    tagged = frozenset(r.pk for r, score in text if score >= 1.0)
    return _fused(
        [(r.pk, score) for r, score in text], _semantic_hits(qs, vector, model, fetch), limit, first=tagged
    )


def memories_retrieve(
    *,
    context: Context,
    keywords: Sequence[str] | None = None,
    query: str | None = None,
    limit: int = 5,
    kinds: Sequence[str] | None = None,
    include_archived: bool = False,
    confined_to: dict[str, Any] | None = None,
) -> list[Recalled]:
    """What `context` recalls. With `keywords`, up to `limit` records per keyword (AgentScope's
    `retrieve_from_memory`), best first: an exact keyword tag, then full-text rank, fused with
    semantic similarity to the keyword when the records have vectors. With `query`,
    up to `limit` records by full-text and, when vectors exist, semantic similarity. Both may be
    given: keyword hits come first; a record is listed once."""
    if not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise Invalid(f"limit must be an integer between 1 and {MAX_LIMIT}")
    keywords = _clean_keywords(keywords)
    if not keywords and not (query and query.strip()):
        raise Invalid("give keywords, a query, or both")
    qs = memories_visible(
        context=context, include_archived=include_archived, confined_to=confined_to
    )
    if kinds:
        bad = set(kinds) - set(MemoryKind.values)
        if bad:
            raise Invalid(f"unknown kind {sorted(bad)[0]!r}")
        qs = qs.filter(kind__in=list(kinds))
    seen: set[int] = set()
    out: list[Recalled] = []
    vectors, model = _query_vectors(keywords)
    for kw, vector in zip(keywords, vectors, strict=True):
        for record, score, why in _keyword_recall(qs, kw, vector, model, limit):
            if record.pk not in seen:
                seen.add(record.pk)
                out.append(Recalled(record, score, f"keyword {kw!r}" + (f" ({why})" if why else "")))
    if query and query.strip():
        for record, score, why in _query_hits(qs, query, limit):
            if record.pk not in seen:
                seen.add(record.pk)
                out.append(Recalled(record, score, f"query ({why})"))
    return out


def memory_get(*, pk: int) -> MemoryRecord:
    record = MemoryRecord.objects.select_related("context").filter(pk=pk).first()
    if record is None:
        raise NotFound(f"memory {pk} not found")
    return record


def memory_for_key(key: ApiKey, memory_id: int) -> MemoryRecord:
    """The record if `key` may see its scope, else NotFound (unknown and foreign look alike)."""
    record = memory_get(pk=memory_id)
    if record.context_id is not None:
        visible = auth.visible_contexts(key).filter(pk=record.context_id).exists()
    else:
        visible = auth.keys_allowed(key, record.scope_keys)
    if not visible:
        raise NotFound(f"memory {memory_id} not found")
    return record


def memory_edit(
    *,
    record: MemoryRecord,
    actor: Actor,
    content: str | None = None,
    kind: str | None = None,
    thinking: str | None = None,
    keywords: list[str] | None = None,
    metadata: dict | None = None,
    note: str = "",
) -> MemoryRecord:
    """Edit a record; the audit event keeps the previous version."""
    with transaction.atomic():
        record = MemoryRecord.objects.select_for_update().get(pk=record.pk)
        before = _snapshot(record)
        if content is not None:
            record.content = _clean_content(content)
            record.content_hash = content_hash(record.content)
        if kind is not None:
            record.kind = _clean_kind(kind)
        if thinking is not None:
            record.thinking = _no_nul(thinking, "thinking")
        if keywords is not None:
            record.keywords = _clean_keywords(keywords)
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise Invalid("metadata must be an object")
            record.metadata = metadata
        after = _snapshot(record)
        if after == before:
            return record
        try:
            with transaction.atomic():
                record.save()
        except IntegrityError as exc:
            raise Conflict("another memory in this scope already has this content") from exc
        audit_record(
            actor=actor,
            action="edit",
            target_type="memoryrecord",
            target_ids=[record.pk],
            context_id=record.context_id,
            before=before,
            after=after,
            note=note,
        )
        if before["content"] != after["content"]:
            queue.requeue_memory_record(record)
    return record


def memory_set_archived(
    *, record: MemoryRecord, archived: bool, actor: Actor, note: str = ""
) -> MemoryRecord:
    """Archive (hide from retrieval) or restore a record; audited, nothing is lost."""
    with transaction.atomic():
        record = MemoryRecord.objects.select_for_update().get(pk=record.pk)
        if (record.archived_at is not None) == archived:
            return record
        before = _snapshot(record)
        record.archived_at = timezone.now() if archived else None
        record.save(update_fields=["archived_at", "updated_at"])
        audit_record(
            actor=actor,
            action="archive" if archived else "restore",
            target_type="memoryrecord",
            target_ids=[record.pk],
            context_id=record.context_id,
            before=before,
            after=_snapshot(record),
            note=note,
        )
    return record


def memory_promote(
    *, actor: Actor, message: Message | None = None, step: Step | None = None, kind: str = "fact"
) -> Recorded:
    """Record a message's text or a step's observations as a memory of its context, linked back
    to its source (provenance). It goes through the same path as an agent's record, so promoting
    content already recorded in that context's scope returns the existing record."""
    if (message is None) == (step is None):
        raise Invalid("promote exactly one message or one step")
    if message is not None:
        context, content, source = message.context, message.text, "message"
    else:
        context, content, source = step.run.context, step.observations, "step"
    if not (content or "").strip():
        raise Invalid("there is no text to promote")
    [recorded] = _record(
        scope=Scope(context=context),
        items=[
            {
                "content": content,
                "kind": kind,
                "metadata": {"promoted_from": source},
                "source_message_id": message.pk if message is not None else None,
                "source_step_id": step.pk if step is not None else None,
            }
        ],
        actor=actor,
        thinking="",
        action="memory_promote",
        note=f"from {source} {(message or step).pk}",
    )
    return recorded


def memories_merge(*, keep_id: int, ids: Sequence[int], actor: Actor) -> MemoryRecord:
    """Merge duplicates into `keep_id`: keywords are united, the others archived (not deleted)
    with `merged_into` in their metadata, and one audit event keeps every merged version."""
    ids = list(dict.fromkeys(int(i) for i in ids))
    if keep_id not in ids:
        ids.append(keep_id)
    if len(ids) < 2:
        raise Invalid("select at least two memories to merge")
    with transaction.atomic():
        rows = {r.pk: r for r in MemoryRecord.objects.select_for_update().filter(pk__in=ids)}
        if len(rows) != len(ids):
            raise NotFound(f"memory {sorted(set(ids) - set(rows))[0]} not found")
        keep = rows[keep_id]
        others = [rows[i] for i in ids if i != keep_id]
        before = {str(r.pk): _snapshot(r) for r in rows.values()}
        keep.keywords = list(
            dict.fromkeys([*keep.keywords, *(k for r in others for k in r.keywords)])
        )
        keep.save(update_fields=["keywords", "updated_at"])
        now = timezone.now()
        for r in others:
            r.archived_at = r.archived_at or now
            r.metadata = {**r.metadata, "merged_into": keep.pk}
            r.save(update_fields=["archived_at", "metadata", "updated_at"])
        audit_record(
            actor=actor,
            action="memory_merge",
            target_type="memoryrecord",
            target_ids=ids,
            context_id=keep.context_id,
            before=before,
            after={"kept": keep.pk, **_snapshot(keep)},
        )
    return keep


def memories_search(
    *,
    query: str = "",
    context_id: int | None = None,
    scope: dict | None = None,
    archived: bool = False,
    limit: int = 100,
) -> list[MemoryRecord]:
    """Records for the operator's list (not an agent's recall, see `memories_retrieve`): archived
    or live ones, of one context and/or whose scope mentions `scope`'s keys, matching `query` by
    full-text, substring or exact keyword."""
    qs = MemoryRecord.objects.select_related("context", "source_message", "source_step").defer(
        "search_vector"
    )
    qs = qs.filter(archived_at__isnull=not archived)
    if context_id is not None:
        qs = qs.filter(context_id=context_id)
    if scope:
        qs = qs.filter(Q(scope_keys__contains=scope) | Q(context__keys__contains=scope))
    query = (query or "").replace("\x00", "").strip()
    if query:
        sq = SearchQuery(query, config=FTS_CONFIG, search_type="websearch")
        qs = qs.filter(
            Q(search_vector=sq) | Q(content__icontains=query) | Q(keywords__contains=[query])
        )
        qs = qs.annotate(rank=SearchRank(F("search_vector"), sq)).order_by("-rank", "-id")
    else:
        qs = qs.order_by("-updated_at", "-id")
    return list(qs[:limit])
