"""Search everything: one full-text search over the messages, step outputs, errors and tool
calls of every context the key may see."""

from __future__ import annotations

from ninja import Query, Router, Status
from ninja.errors import HttpError

from memory_app import auth
from memory_app.api.common import require_scope, responses
from memory_app.api.contexts import parse_keys_filter
from memory_app.queries.search_all import BadQuery, SearchFilters, search_all
from memory_app.schemas.search_all import SearchPageOut, SearchQuery, page_out

router = Router(tags=["search"])


@router.get(
    "/search",
    response=responses({200: SearchPageOut}),
    summary="Search messages, step outputs, errors and tool calls across contexts",
)
def search(request, params: Query[SearchQuery]):
    """Best first (ts_rank_cd); a key confined to some context keys finds only its contexts'
    hits. The cursor is opaque: pass back `next_cursor` with the same query and filters."""
    key = require_scope(request, "read")
    try:
        found = search_all(
            filters=SearchFilters(
                q=params.q, kinds=list(params.kind), keys_contain=parse_keys_filter(params.keys)
            ),
            cursor=params.cursor or None,
            limit=params.limit,
            # An unconfined key sees every context: no filter to join.
            contexts=auth.visible_contexts(key) if key.context_keys else None,
        )
    except BadQuery as exc:
        raise HttpError(422, str(exc)) from None
    return Status(200, page_out(found))
