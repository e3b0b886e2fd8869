"""The context: one memory space, and the counters the write path keeps on it."""

from __future__ import annotations

import json

from django.db import models
from django.db.models import F, Q

from memory_app.models.shared import OrderedJSONField, gin_index


class Context(models.Model):
    """One memory space, identified by a JSON dict of keys (get-or-create, order-insensitive)."""

    keys = models.JSONField()
    keys_digest = models.CharField(max_length=64, editable=False)
    title = models.CharField(max_length=500, blank=True, default="")
    metadata = OrderedJSONField(default=dict, blank=True)
    # AgentScope 1.x working memory keeps a compressed summary beside its messages.
    compressed_summary = models.TextField(blank=True, default="")
    # Allocation counter for message seq: incremented under the row lock, so seq is gap-free
    # and strictly increasing however many writers append at once.
    last_seq = models.BigIntegerField(default=0)
    # Messages up to this seq have their full-text vector in MessageSearch; later ones are
    # matched from their text until the indexer catches up (`memory_app.search.fulltext`).
    search_seq = models.BigIntegerField(default=0, db_default=0)
    # Counters kept by the write path so lists never count millions of rows per page.
    message_count = models.IntegerField(default=0)
    token_count = models.BigIntegerField(default=0)
    run_count = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Indexed by context_activity_idx, which leads with it (a one-column index would repeat it).
    last_activity_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # "Same keys, same context" is held by `ContextKey` (unique by digest), not here: on
        # Citus a unique constraint on contexts must include their distribution column, `id`.
        constraints = [
            models.CheckConstraint(condition=Q(last_seq__gte=0), name="context_last_seq_nonneg"),
        ]
        indexes = [
            gin_index(fields=["keys"], name="context_keys_gin", opclasses=["jsonb_path_ops"]),
            models.Index(fields=["-last_activity_at", "-id"], name="context_activity_idx"),
            # The full-text indexer's worklist: contexts with messages past their search_seq.
            models.Index(
                fields=["id"],
                condition=Q(search_seq__lt=F("last_seq")),
                name="context_search_behind_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.title or json.dumps(self.keys, sort_keys=True)


class ContextKey(models.Model):
    """The context of a keys digest: the one place "same keys, same context" is held.

    Its own table, keyed by the digest alone, so that on Citus it is distributed by the digest
    (each lookup by keys routed to one shard) while contexts are distributed by `id`. Get-or-
    create inserts the digest row first (`INSERT … ON CONFLICT (digest) DO NOTHING`), then the
    context under the id it reserved, in one transaction (`services/contexts.py`).

    The column is `target_id`, not `context_id`: the row belongs to its digest's shard, not to
    the context's. No database foreign key (the two tables are distributed by different
    columns); Django's cascade deletes the digest row with its context.
    """

    digest = models.CharField(max_length=64, primary_key=True)
    target = models.ForeignKey(
        Context, on_delete=models.CASCADE, db_constraint=False, related_name="+"
    )

    def __str__(self) -> str:
        return f"{self.digest[:12]}… -> context {self.target_id}"
