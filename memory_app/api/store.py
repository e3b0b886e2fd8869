"""Namespace items, LangGraph's store over long-term memories (`/api/v1/store/...`): put, get,
delete, search and the namespaces in use.

Items live in a key subset: `scope_keys` in the body (inside the key's confinement), else the
key subset the API key is confined to. A key confined to `{"tenant": "acme"}` reads and writes
the items of `{"tenant": "acme", ...}` subsets only; another tenant's are out of reach (403 for
a subset outside the confinement). Items are long-term memories (`memory_id`): recalled by the
contexts of their subset and curated in the dashboard like the rest.
"""

from __future__ import annotations

from ninja import Router, Status

from memory_app.api.common import WRITE_ERRORS, actor_for, require_scope, responses
from memory_app.errors import NotFound
from memory_app.namespace_items import scope_for_store
from memory_app.queries.store import item_get, items_search, namespaces_list
from memory_app.schemas.store import (
    StoreDeletedOut,
    StoreItemKeyIn,
    StoreItemOut,
    StoreItemPutIn,
    StoreItemsOut,
    StoreNamespacesIn,
    StoreNamespacesOut,
    StoreSearchIn,
    item_out,
)
from memory_app.services.store import (
    item_delete,
    item_put,
    items_refresh_ttl,
    namespace_touched,
)

router = Router(tags=["store"])


@router.put(
    "/store/items",
    response=responses({200: StoreItemOut, 201: StoreItemOut}, WRITE_ERRORS),
    summary="Put an item",
)
def store_put(request, body: StoreItemPutIn):
    """Store `value` under `namespace` and `key` (201 for a new item, 200 for a new value; an
    item deleted before comes back as a new one). With `ttl`, it expires that many minutes after
    this write."""
    key = require_scope(request, "write")
    scope = scope_for_store(key, body.scope_keys)
    record, created = item_put(
        scope=scope,
        namespace=body.namespace,
        key=body.key,
        value=body.value,
        ttl=body.ttl,
        actor=actor_for(request),
    )
    return Status(201 if created else 200, item_out(record))


@router.post(
    "/store/items/get",
    response=responses({200: StoreItemOut}, WRITE_ERRORS),
    summary="Get an item",
)
def store_get(request, body: StoreItemKeyIn):
    """The item, or 404 when there is none (deleted, expired, or never put)."""
    key = require_scope(request, "read")
    scope = scope_for_store(key, body.scope_keys)
    # Asking about a namespace puts it in the listing, as it does in `InMemoryStore`.
    namespace = namespace_touched(scope, body.namespace)
    record = item_get(scope=scope, namespace=namespace, key=body.key)
    if record is None:
        raise NotFound("no item under this namespace and key")
    if body.refresh_ttl and record.item_ttl is not None:
        items_refresh_ttl(scope, [record.pk])
        record.refresh_from_db(fields=["item_expires_at"])
    return Status(200, item_out(record))


@router.post(
    "/store/items/delete",
    response=responses({200: StoreDeletedOut}, WRITE_ERRORS),
    summary="Delete an item",
)
def store_delete(request, body: StoreItemKeyIn):
    """The item is archived: it is no longer read, and the dashboard can restore or purge it."""
    key = require_scope(request, "write")
    scope = scope_for_store(key, body.scope_keys)
    deleted = item_delete(
        scope=scope, namespace=body.namespace, key=body.key, actor=actor_for(request)
    )
    return Status(200, {"deleted": deleted})


@router.post(
    "/store/items/search",
    response=responses({200: StoreItemsOut}, WRITE_ERRORS),
    summary="Search items",
)
def store_search(request, body: StoreSearchIn):
    """Items under `namespace_prefix` whose values pass `filter`, in the order they were written
    (namespace by namespace), or with `query` by meaning when vectors exist (`score`)."""
    key = require_scope(request, "read")
    scope = scope_for_store(key, body.scope_keys)
    found = items_search(
        scope=scope,
        namespace_prefix=body.namespace_prefix,
        value_filter=body.filter,
        query=body.query,
        limit=body.limit,
        offset=body.offset,
    )
    if body.refresh_ttl:
        items_refresh_ttl(scope, [f.record.pk for f in found if f.record.item_ttl is not None])
    return Status(200, {"items": [item_out(f.record, f.score) for f in found]})


@router.post(
    "/store/namespaces",
    response=responses({200: StoreNamespacesOut}, WRITE_ERRORS),
    summary="List namespaces",
)
def store_namespaces(request, body: StoreNamespacesIn):
    """The namespaces holding items, matching `prefix` and `suffix`, cut to `max_depth`."""
    key = require_scope(request, "read")
    scope = scope_for_store(key, body.scope_keys)
    namespaces = namespaces_list(
        scope=scope,
        prefix=body.prefix,
        suffix=body.suffix,
        max_depth=body.max_depth,
        limit=body.limit,
        offset=body.offset,
    )
    return Status(200, {"namespaces": namespaces})
