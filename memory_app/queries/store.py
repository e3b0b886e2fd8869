"""Reads of namespace items (LangGraph's store): get, search by namespace prefix with value
filters (by meaning when the items have vectors) and the namespaces in use. Every query is
confined to one scope's digest, the key of the items' unique constraint.

Answers follow LangGraph's `InMemoryStore`: without a query, items come namespace by namespace
in the order each namespace was first written, and within one in the order its items were
created (an overwrite keeps an item's place; deleted and put again, it goes last). With a query
and vectors, by cosine similarity, items without a vector after them; namespaces sort as tuples
of code points.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import BooleanField, Exists, OuterRef, QuerySet, Subquery
from django.db.models.expressions import RawSQL

from memory_app.errors import Invalid
from memory_app.memories import Scope, unexpired
from memory_app.models import (
    MemoryEmbedding,
    MemoryEmbeddingWaiting,
    MemoryRecord,
    MemoryStatus,
    StoreNamespace,
)
from memory_app.namespace_items import (
    MAX_NAMESPACES_LIMIT,
    MAX_SEARCH_LIMIT,
    clean_filter,
    clean_key,
    clean_namespace,
)
from memory_app.queries.memories import _semantic_hits, text_vectors
from memory_app.queries.store_filter import filtered

TABLE = "memory_app_memoryrecord"


def items_visible(scope: Scope) -> QuerySet[MemoryRecord]:
    """The scope's items an agent reads: live, not deleted (archived), not expired."""
    return MemoryRecord.objects.filter(
        unexpired(),
        scope_digest=scope.digest,
        namespace__isnull=False,
        status=MemoryStatus.LIVE,
        archived_at__isnull=True,
    )


def item_get(*, scope: Scope, namespace: Any, key: Any) -> MemoryRecord | None:
    namespace, key = clean_namespace(namespace), clean_key(key)
    return items_visible(scope).filter(namespace=namespace, item_key=key).first()


@dataclass(frozen=True)
class Found:
    record: MemoryRecord
    score: float | None = None


def _in_order(qs: QuerySet) -> QuerySet:
    # The namespace's first use places it: the order `InMemoryStore` iterates its namespaces.
    first = StoreNamespace.objects.filter(
        scope_digest=OuterRef("scope_digest"), namespace=OuterRef("namespace")
    )
    return qs.annotate(ns_first=Subquery(first.values("pk")[:1])).order_by(
        "ns_first", "created_at", "pk"
    )


def _bounds(limit: Any, offset: Any, most: int) -> tuple[int, int]:
    for name, n in (("limit", limit), ("offset", offset)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise Invalid(f"{name} must be an integer of 0 or more")
    if limit > most:
        raise Invalid(f"limit must be at most {most}")
    return limit, offset


def items_search(
    *,
    scope: Scope,
    namespace_prefix: Any = (),
    value_filter: Any = None,
    query: str | None = None,
    limit: int = 10,
    offset: int = 0,
) -> list[Found]:
    """Items under `namespace_prefix` whose values pass `value_filter`, `offset` of them
    skipped, `limit` kept. With a `query` and a configured embedding provider, the nearest first
    (score: cosine similarity), then items without a vector in listing order."""
    prefix = clean_namespace(namespace_prefix, empty=True)
    limit, offset = _bounds(limit, offset, MAX_SEARCH_LIMIT)
    qs = items_visible(scope)
    if prefix:
        qs = qs.filter(**{f"namespace__0_{len(prefix)}": prefix})
    qs = filtered(qs, clean_filter(value_filter), _in_order)
    vector, model = None, None
    if query:
        [vector], model = text_vectors([query])
    if vector is None or limit == 0:
        return [Found(r) for r in _in_order(qs)[offset : offset + limit]]
    hits = _semantic_hits(qs, vector, model, offset + limit)[offset : offset + limit]
    records = qs.in_bulk([pk for pk, _ in hits])
    found = [Found(records[pk], 1.0 - float(distance)) for pk, distance in hits]
    if len(found) < limit:
        embedded = MemoryEmbedding.objects.filter(
            memory_record=OuterRef("pk"), model=model, vector__isnull=False
        )
        waiting = MemoryEmbeddingWaiting.objects.filter(memory_record=OuterRef("pk"), model=model)
        scoreless = _in_order(qs.filter(~Exists(embedded), ~Exists(waiting)))[: limit - len(found)]
        found += [Found(r) for r in scoreless]
    return found


NAMESPACES = "memory_app_storenamespace"


def _match_sql(path: list[str], *, suffix: bool) -> tuple[str, list[Any]]:
    n = len(path)
    parts, params = [f"cardinality({NAMESPACES}.namespace) >= %s"], [n]
    for i, label in enumerate(path):
        if label == "*":
            continue
        if suffix:
            parts.append(f"{NAMESPACES}.namespace[cardinality({NAMESPACES}.namespace) - %s] = %s")
            params += [n - 1 - i, label]
        else:
            parts.append(f"{NAMESPACES}.namespace[%s] = %s")
            params += [i + 1, label]
    return " AND ".join(parts), params


def namespaces_list(
    *,
    scope: Scope,
    prefix: Any = None,
    suffix: Any = None,
    max_depth: Any = None,
    limit: int = 100,
    offset: int = 0,
) -> list[list[str]]:
    """The namespaces in use (put into, deleted from or asked about, as `InMemoryStore` keeps
    them), matching `prefix` and `suffix` (`*` matches any one label), cut to `max_depth`
    labels (duplicates then once), sorted, paged."""
    limit, offset = _bounds(limit, offset, MAX_NAMESPACES_LIMIT)
    if max_depth is not None and (
        isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1
    ):
        raise Invalid("max_depth must be an integer of 1 or more")
    qs = StoreNamespace.objects.filter(scope_digest=scope.digest)
    for path, is_suffix in ((prefix, False), (suffix, True)):
        if path is not None:
            path = clean_namespace(path, empty=True, wildcard=True)
            sql, params = _match_sql(path, suffix=is_suffix)
            name = "suffix_match" if is_suffix else "prefix_match"
            # Values reach the SQL as parameters; the fragments are this module's constants.
            match = RawSQL(sql, params, BooleanField())  # noqa: S611
            qs = qs.alias(**{name: match}).filter(**{name: True})
    # Sorted by code point, as Python sorts InMemoryStore's tuples.
    depth = "1:%s" if max_depth is not None else "1:cardinality(" + NAMESPACES + ".namespace)"
    cut = RawSQL(  # noqa: S611
        f'({NAMESPACES}.namespace[{depth}])::text[] COLLATE "C"',
        [max_depth] if max_depth is not None else [],
    )
    rows = (
        qs.annotate(ns=cut)
        .values_list("ns", flat=True)
        .distinct()
        .order_by("ns")[offset : offset + limit]
    )
    return [list(ns) for ns in rows]
