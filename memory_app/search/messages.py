"""Search inside one context: PostgreSQL full-text (`keyword`), pgvector cosine (`semantic`),
and their fusion (`fusion`).

Within one context every mode returns min(k, n) results, whatever share of the table that
context holds (see each module for how).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from django.db import router

from memory_app import db, pipelines
from memory_app.embeddings import providers
from memory_app.errors import Invalid, ProviderDown, SemanticUnavailable
from memory_app.models import Context, Message
from memory_app.search import fulltext
from memory_app.search.fusion import ranked_order
from memory_app.search.keyword import keyword_ranking
from memory_app.search.semantic import query_vector_for, semantic_ranking

Mode = Literal["auto", "keyword", "semantic", "hybrid"]
MAX_QUERY_CHARS = 10_000


@dataclass(frozen=True)
class Hit:
    message: Message
    rank: int
    score: float
    keyword_rank: int | None = None
    keyword_score: float | None = None
    semantic_rank: int | None = None
    distance: float | None = None

    @property
    def explain(self) -> str:
        parts = []
        if self.keyword_rank is not None:
            parts.append(f"keyword #{self.keyword_rank}, bm25 {self.keyword_score:.4f}")
        if self.semantic_rank is not None:
            parts.append(f"semantic #{self.semantic_rank}, cosine distance {self.distance:.4f}")
        return "; ".join(parts)


@dataclass
class SearchResult:
    hits: list[Hit]
    mode: str
    model: str | None = None
    notes: list[str] = field(default_factory=list)


def search_messages(
    *,
    context: Context,
    query: str,
    k: int = 5,
    mode: Mode = "auto",
    model: str | None = None,
    query_vector: Sequence[float] | None = None,
    exclude_ids: Sequence[int] = (),
    match: str | None = None,
) -> SearchResult:
    """Top `k` live messages of `context` for `query`.

    `auto` is hybrid when vectors can be had (a provider, or a client query vector), keyword
    otherwise. Keyword search matches any word or "phrase" of the query and none of its
    -exclusions, ranked by BM25 (natural-language prompts rarely hold every word of a message);
    `match="all"` requires every word, as websearch_to_tsquery reads the query.
    """
    query = _checked_query(query, mode=mode, k=k, match=match)
    notes: list[str] = []
    if mode == "auto":
        available = query_vector is not None or providers.get_provider() is not None
        mode = "hybrid" if available else "keyword"
    if not query.strip() and query_vector is None:
        return SearchResult(hits=[], mode=mode, notes=["empty query"])

    keyword: list[tuple[int, float]] = []
    semantic: list[tuple[int, float]] = []
    used_model = None
    walked_rows: dict[int, tuple] = {}  # the messages each ranking read with it
    fetch = k if mode != "hybrid" else max(k * 3, 20)
    if mode in ("keyword", "hybrid") and query.strip():
        keyword = keyword_ranking(
            context_id=context.pk,
            query=query,
            limit=fetch,
            exclude_ids=exclude_ids,
            match=match or "any",
            last_seq=context.last_seq,
            search_seq=context.search_seq,
            message_count=context.message_count,
            rows=walked_rows,
        )
    if mode in ("semantic", "hybrid"):
        try:
            vector, used_model = query_vector_for(
                query=query, model=model, query_vector=query_vector
            )
        except (SemanticUnavailable, ProviderDown) as exc:
            if mode == "semantic":
                raise
            notes.append(f"semantic part skipped: {exc}")
        else:
            semantic, path = semantic_ranking(
                context_id=context.pk,
                model=used_model,
                vector=vector,
                limit=fetch,
                exclude_ids=exclude_ids,
                context_size=context.message_count,
                rows=walked_rows,
            )
            notes.append(f"vector scan: {path}")

    kw = {mid: (i, s) for i, (mid, s) in enumerate(keyword, start=1)}
    sem = {mid: (i, d) for i, (mid, d) in enumerate(semantic, start=1)}
    order = ranked_order(mode, keyword, semantic, kw=kw, sem=sem)[:k]
    hits = _hits(order, context_id=context.pk, kw=kw, sem=sem, read=walked_rows)
    if mode in ("keyword", "hybrid"):
        notes += fulltext.truncation_notes([h.message for h in hits])
    return SearchResult(hits=hits, mode=mode, model=used_model, notes=notes)


def _checked_query(query: str, *, mode: str, k: Any, match: str | None) -> str:
    """The query (empty for none) once the search's arguments are known to be valid."""
    if mode not in ("auto", "keyword", "semantic", "hybrid"):
        raise Invalid("mode must be one of auto, keyword, semantic, hybrid")
    if not isinstance(k, int) or not 1 <= k <= 1000:
        raise Invalid("k must be an integer between 1 and 1000")
    query = query or ""
    if len(query) > MAX_QUERY_CHARS:
        raise Invalid(f"the query is longer than {MAX_QUERY_CHARS} characters")
    if match not in (None, "all", "any"):
        raise Invalid("match must be 'all' or 'any'")
    return query


def _hits(
    order: list[tuple[int, float]],
    *,
    context_id: int,
    kw: dict[int, tuple[int, float]],
    sem: dict[int, tuple[int, float]],
    read: dict[int, tuple] | None = None,
) -> list[Hit]:
    """The ranked messages, each with where it stood in the keyword and the semantic ranking.
    Those already `read` (rows by id) are built from them; the others read by id within their
    context: on a distributed store, one shard."""
    read = read or {}
    messages = _messages_by_id(context_id, [mid for mid, _ in order if mid not in read])
    for mid, _ in order:
        if mid in read:
            messages[mid] = db.from_row(Message, read[mid])
    hits = []
    for rank, (mid, score) in enumerate(order, start=1):
        hits.append(
            Hit(
                message=messages[mid],
                rank=rank,
                score=score,
                keyword_rank=kw[mid][0] if mid in kw else None,
                keyword_score=kw[mid][1] if mid in kw else None,
                semantic_rank=sem[mid][0] if mid in sem else None,
                distance=sem[mid][1] if mid in sem else None,
            )
        )
    return hits


_MESSAGE_COLUMNS = db.select_columns(Message, "m")


def _messages_by_id(context_id: int, ids: list[int]) -> dict[int, Message]:
    """The messages by id, as `in_bulk` reads them (on the database the router names for
    reads) without compiling a query on every search."""
    if not ids:
        return {}
    using = router.db_for_read(Message)
    rows = pipelines.read_rows(
        f"SELECT {_MESSAGE_COLUMNS} FROM memory_app_message m"  # noqa: S608 - constant
        " WHERE m.context_id = %s AND m.id = ANY(%s)",
        [context_id, ids],
        using=using,
    )
    return {row[0]: db.from_row(Message, row, using) for row in rows}
