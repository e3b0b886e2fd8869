"""Writes of contexts: get-or-create by keys (order-insensitive), and title/metadata edits."""

from __future__ import annotations

from typing import Any

from django.db import connection, router, transaction

from memory_app.audit import Actor, audit_record
from memory_app.models import (
    Context,
    ContextKey,
    keys_digest,
)

# The digest row is written first, under an id taken from the contexts' own sequence: the
# unique digest decides the race (a loser's INSERT waits for the winner's commit, then does
# nothing), and the context row follows in the same transaction, so a digest row is never
# seen without its context.
_CLAIM_DIGEST = """
    INSERT INTO memory_app_contextkey (digest, target_id)
    VALUES (%s, nextval(pg_get_serial_sequence('memory_app_context', 'id')))
    ON CONFLICT (digest) DO NOTHING
    RETURNING target_id
"""


def context_get_or_create(
    *, keys: dict[str, Any], title: str | None = None, metadata: dict | None = None
) -> tuple[Context, bool]:
    """The context for `keys` (order-insensitive), created when missing; safe under races."""
    digest = keys_digest(keys)
    # Twice at most: a digest row whose context was deleted by hand is dropped, then claimed.
    for _ in range(2):
        found = _context_of_digest(digest)
        if found is not None:
            return found, False
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(_CLAIM_DIGEST, [digest])
                claimed = cursor.fetchone()
            if claimed is not None:
                context = Context.objects.create(
                    pk=claimed[0],
                    keys=keys,
                    keys_digest=digest,
                    title=title or "",
                    metadata=metadata or {},
                )
                return context, True
        # Another writer claimed the digest and has committed (the INSERT waited for it).
        found = _context_of_digest(digest)
        if found is not None:
            return found, False
    raise RuntimeError(f"context digest {digest} is claimed by no context")


def contexts_get_or_create(*, keys: list[dict[str, Any]]) -> list[Context]:
    """The contexts for several sets of keys, in their order, created when missing: the ones
    that exist are read in two statements whatever their number (a request naming many)."""
    primary = router.db_for_write(ContextKey)
    digests = [keys_digest(k) for k in keys]
    targets = dict(
        ContextKey.objects.using(primary)
        .filter(digest__in=digests)
        .values_list("digest", "target_id")
    )
    found = Context.objects.using(primary).in_bulk(list(targets.values()))
    return [
        found.get(targets.get(digest)) or context_get_or_create(keys=k)[0]
        for k, digest in zip(keys, digests, strict=True)
    ]


def _context_of_digest(digest: str) -> Context | None:
    """The context the digest names; a digest row left without its context is deleted. Read
    on the primary: a get-or-create decides on it (a replica may not have the row yet)."""
    primary = router.db_for_write(ContextKey)
    keys = ContextKey.objects.using(primary).filter(digest=digest)
    target = keys.values_list("target_id", flat=True).first()
    if target is None:
        return None
    context = Context.objects.using(primary).filter(pk=target).first()
    if context is None:
        ContextKey.objects.filter(digest=digest, target_id=target).delete()
    return context


def context_update(
    *, context: Context, title: str | None = None, metadata: dict | None = None, actor: Actor
) -> Context:
    before = {"title": context.title, "metadata": context.metadata}
    if title is not None:
        context.title = title
    if metadata is not None:
        context.metadata = metadata
    with transaction.atomic():
        context.save(update_fields=["title", "metadata", "updated_at"])
        audit_record(
            actor=actor,
            action="edit",
            target_type="context",
            target_ids=[context.pk],
            context_id=context.pk,
            before=before,
            after={"title": context.title, "metadata": context.metadata},
        )
    return context
