"""Every other GIN index keeps a pending list of 1 MB too (`memory_app.models.shared.
PENDING_LIST_KB`), as the full-text ones do since 0047: each search through one of them (tags,
a context's or a memory's keys, memory keywords, the store's namespaces, the runs' search and
model names, audit targets, a span's trace) reads its list whole, up to 4 MB at PostgreSQL's
default.

As in 0047 the setting is changed in place (`ALTER INDEX ... SET`, nothing rebuilt; Citus
passes it on to the shards' indexes; only Django's record of the indexes is dropped and made
again). Each index's ACCESS EXCLUSIVE lock waits for the statements running on its table, and
those that come meanwhile wait for it: the migration is not atomic, so each change commits on
its own and no lock is held while the next one waits (a failure part way leaves the indexes
changed so far changed, and running the migration again changes them again)."""

import django.contrib.postgres.indexes
from django.db import migrations
from django.db.models import Q

PENDING_LIST_KB = 1024


def _gin(fields: list[str], name: str, **options):
    return django.contrib.postgres.indexes.GinIndex(
        fields=fields, name=name, gin_pending_list_limit=PENDING_LIST_KB, **options
    )


JSONB_PATHS = {"opclasses": ["jsonb_path_ops"]}
INDEXES = [
    ("auditevent", _gin(["target_ids"], "audit_target_ids_gin")),
    ("context", _gin(["keys"], "context_keys_gin", **JSONB_PATHS)),
    ("memoryrecord", _gin(["scope_keys"], "memory_scope_gin", **JSONB_PATHS)),
    ("memoryrecord", _gin(["keywords"], "memory_keywords_gin")),
    ("message", _gin(["tags"], "message_tags_gin")),
    ("run", _gin(["model_names"], "run_model_names_gin")),
    *(
        ("runsearch", _gin(["search_vector"], f"run_search_{kind}_gin", condition=Q(kind=kind)))
        for kind in ("output", "error", "tool")
    ),
    ("spanqueue", _gin(["trace_ids"], "spanqueue_trace_ids_gin")),
    ("storenamespace", _gin(["scope_keys"], "store_namespace_keys_gin", **JSONB_PATHS)),
]


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("memory_app", "0047_full_text_pending_lists")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    f"ALTER INDEX {index.name} SET (gin_pending_list_limit = {PENDING_LIST_KB})",
                    f"ALTER INDEX {index.name} RESET (gin_pending_list_limit)",
                )
                for _, index in INDEXES
            ],
            state_operations=[
                operation
                for model, index in INDEXES
                for operation in (
                    migrations.RemoveIndex(model_name=model, name=index.name),
                    migrations.AddIndex(model_name=model, index=index),
                )
            ],
        )
    ]
