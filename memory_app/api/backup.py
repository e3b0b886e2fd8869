"""Backup endpoints: streamed JSON Lines export and import (see `memory_app.backup`)."""

from __future__ import annotations

import json

from django.db import IntegrityError
from django.http import StreamingHttpResponse
from ninja import Query, Router, Schema
from ninja.errors import HttpError
from psycopg.errors import CheckViolation, NotNullViolation

from memory_app import auth, errors
from memory_app.api.common import WRITE_ERRORS, require_scope, responses
from memory_app.audit import Actor
from memory_app.backup.export import contexts_matching, export_lines
from memory_app.backup.lines import Summary
from memory_app.backup.restore import import_lines
from memory_app.replica import replica_stream
from memory_app.schemas.fields import Id, _check_json, _examples

router = Router(tags=["backup"])

# A whole backup of one empty context: the header, the context, the trailer (its counts and the
# digest of the lines before it, computed here as export computes them). Real files go on with
# the context's runs, steps, messages and memories before the trailer. Documented as JSON Lines,
# not as a JSON schema: the body is not one value.
_EXAMPLE_LINES = [
    b'{"type":"header","format":"agentmemory-backup","version":3,"embeddings":false}\n',
    b'{"type":"context","digest":"b074f81dcd237c9c0e0da95dd6588a94fb4b16f89de21146dd19ede8500f1348",'
    b'"keys":{"chat":"42","user":"ada"},"title":"Ada\'s chat","metadata":{}}\n',
]
_example_summary = Summary()
for _line in _EXAMPLE_LINES:
    _example_summary.add(_line, json.loads(_line)["type"])
BACKUP_EXAMPLE = (
    b"".join(_EXAMPLE_LINES).decode()
    + json.dumps(_example_summary.trailer(), separators=(",", ":"))
    + "\n"
)
JSONL = {"application/x-ndjson": {"schema": {"type": "string"}, "example": BACKUP_EXAMPLE}}


@router.get(
    "/export",
    response=responses({200: None}),
    summary="Export memory as JSON Lines (streamed)",
    openapi_extra={"responses": {200: {"description": "OK", "content": JSONL}}},
)
def export(
    request,
    context_id: list[Id] | None = Query(None),  # noqa: B008 - ninja parameter marker
    match_keys: str | None = None,
    embeddings: bool = False,
):
    """Every visible context (or the given ids, or those whose keys contain `match_keys`, a
    JSON object), with runs, steps, tool calls, messages, scores, labels, comments, LangGraph
    checkpoints and memory records; vectors on request. A memory's versions (its past content
    and notes) only for a key with the admin scope."""
    key = require_scope(request, "read")
    subset = None
    # Not called `keys`: ninja merges parameters through a mapping's .keys() method.
    if match_keys:
        try:
            subset = json.loads(match_keys)
        except json.JSONDecodeError as exc:
            raise HttpError(422, f"match_keys is not JSON: {exc.msg}") from exc
        if not isinstance(subset, dict):
            raise HttpError(422, "match_keys must be a JSON object")
        # Checked before the stream starts: PostgreSQL refuses a NUL in the first query, which
        # runs after the 200 has gone out and would cut the body short.
        try:
            _check_json(subset)
        except ValueError as exc:
            raise HttpError(422, f"match_keys: {exc}") from exc
    contexts = contexts_matching(context_ids=context_id, keys=subset)
    contexts = contexts.filter(pk__in=auth.visible_contexts(key).values("pk"))
    # Without context ids, an unconfined key's export holds the key-subset memories under no
    # exported context too; a confined key's holds what its contexts recall, nothing more.
    subsets = None if context_id or key.context_keys else (subset or {})
    # A backup may be a moment behind the primary: it reads from the read replica when there is
    # one (the key was checked on the primary above).
    response = StreamingHttpResponse(
        replica_stream(
            export_lines(
                contexts=contexts,
                embeddings=embeddings,
                confined_to=key.context_keys or None,
                subsets=subsets,
                # A memory's history may hold what an operator edited out of it: an admin
                # key's matter, as it is the dashboard's, never a read key's.
                memory_versions=auth.has_scope(key, "admin"),
            )
        ),
        content_type="application/x-ndjson",
    )
    response["Content-Disposition"] = 'attachment; filename="agentmemory-backup.jsonl"'
    return response


class BackupImportOut(Schema):
    model_config = _examples(
        {
            "created": {
                "contexts": 1,
                "runs": 1,
                "steps": 4,
                "messages": 12,
                "scores": 2,
                "labels": 1,
                "comments": 1,
                "checkpoints": 3,
                "checkpoint_blobs": 2,
                "checkpoint_writes": 1,
                "memories": 2,
                "memory_versions": 3,
            },
            # Each kind the file held, in both: what went in and what was stored already.
            "skipped": {
                "contexts": 0,
                "runs": 0,
                "steps": 0,
                "messages": 0,
                "scores": 0,
                "labels": 0,
                "comments": 0,
                "checkpoints": 0,
                "checkpoint_blobs": 0,
                "checkpoint_writes": 0,
                "memories": 0,
                "memory_versions": 0,
            },
        }
    )
    created: dict[str, int]
    skipped: dict[str, int]


@router.post(
    "/import",
    response=responses({200: BackupImportOut}, WRITE_ERRORS),
    summary="Import a JSON Lines backup (idempotent); needs the admin scope",
    # The body is read line by line, not parsed by ninja, so it is documented here.
    openapi_extra={"requestBody": {"required": True, "content": JSONL}},
)
def import_(request):
    """The body is read line by line as it arrives (never whole), under its own size limit
    (`AGENTMEMORY_MAX_IMPORT_BYTES`, memory_app/api/limits.py), and written in one transaction
    that a bad line, a forbidden context or a missing or wrong trailer rolls back."""
    key = require_scope(request, "admin")
    try:
        result = import_lines(
            iter(request.readline, b""),
            # A confined key writes only inside its context keys (contexts and key-subset memories).
            allowed=(lambda keys: auth.keys_allowed(key, keys)) if key.context_keys else None,
            actor=Actor.for_key(key),
        )
    except errors.BodyTooLarge as exc:
        raise HttpError(413, str(exc)) from exc
    except errors.BackupFormatError as exc:
        raise HttpError(422, str(exc)) from exc
    except IntegrityError as exc:
        # A value a table's check or not-null constraint refuses (a negative seq, say) is the
        # file's fault, not a concurrent write to retry: the import was rolled back whole.
        if isinstance(exc.__cause__, CheckViolation | NotNullViolation):
            raise HttpError(
                422, f"a value cannot be stored: {exc.__cause__.diag.message_primary}"
            ) from exc
        raise
    return {"created": result.created, "skipped": result.skipped}
