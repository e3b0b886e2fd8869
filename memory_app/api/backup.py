"""Backup endpoints: streamed JSON Lines export and import (see `memory_app.backup`)."""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import IntegrityError
from django.http import StreamingHttpResponse
from ninja import Query, Router, Schema
from ninja.errors import HttpError
from psycopg.errors import CheckViolation, NotNullViolation

from memory_app import auth, errors
from memory_app.api.common import WRITE_ERRORS, json_loads, require_scope, responses
from memory_app.audit import Actor
from memory_app.backup.export import contexts_matching, export_lines
from memory_app.backup.restore import import_records
from memory_app.json_values import depth_over
from memory_app.schemas.fields import Id, _check_json, _examples

router = Router(tags=["backup"])

# Two lines of a backup (the header, then a context); real files go on with its runs, steps,
# messages and memories. Documented as JSON Lines, not as a JSON schema: the body is not one value.
BACKUP_EXAMPLE = (
    '{"type":"header","format":"agentmemory-backup","version":1,"embeddings":false}\n'
    '{"type":"context","digest":"b074f81dcd237c9c0e0da95dd6588a94fb4b16f89de21146dd19ede8500f1348",'
    '"keys":{"chat":"42","user":"ada"},'
    '"title":"Ada\'s chat","metadata":{}}\n'
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
    JSON object), with runs, steps, tool calls, messages and memory records; vectors on request."""
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
    response = StreamingHttpResponse(
        export_lines(
            contexts=contexts, embeddings=embeddings, confined_to=key.context_keys or None
        ),
        content_type="application/x-ndjson",
    )
    response["Content-Disposition"] = 'attachment; filename="agentmemory-backup.jsonl"'
    return response


# Deeper lines are refused: the import writes each value with encoders that recurse once per
# level, and about 1,000 levels (less the request's own stack) end in RecursionError. No backup
# of agent data nests anywhere near this.
MAX_DEPTH = 500

# A JSON escape that may spell what PostgreSQL cannot store: a surrogate (lone, or one half of a
# pair) or NUL. Only lines holding one are walked, so a large import pays a byte search per line.
_ESCAPE_TO_CHECK = re.compile(rb"\\u(?:[dD][89a-fA-F]|0000)")


def _record(line: bytes, number: int) -> Any:
    """One backup line as Python values, or a 422 naming the line: not UTF-8, not RFC 8259 JSON
    (NaN, 1e400), nested deeper than MAX_DEPTH (10,000 levels exhaust Python's recursion limit
    in the parser already), or a string or key PostgreSQL cannot store (a lone surrogate, NUL).
    Raised while the import's transaction is open, so nothing of the lines before it is written."""
    too_deep = HttpError(422, f"line {number} is nested deeper than {MAX_DEPTH} levels")
    try:
        value = json_loads(line)
    except RecursionError:
        raise too_deep from None
    except UnicodeDecodeError:
        raise HttpError(422, f"line {number} is not UTF-8") from None
    except ValueError as exc:  # json.JSONDecodeError too
        raise HttpError(422, f"line {number} is not JSON: {getattr(exc, 'msg', exc)}") from None
    # Only a line with that many brackets (in strings or not) can nest that deep: one count in C.
    if line.count(b"[") + line.count(b"{") > MAX_DEPTH and depth_over(value, MAX_DEPTH):
        raise too_deep
    if _ESCAPE_TO_CHECK.search(line):
        try:
            _check_json(value)
        except ValueError as exc:
            raise HttpError(422, f"line {number}: {exc}") from None
    return value


class BackupImportOut(Schema):
    model_config = _examples(
        {
            "created": {"context": 1, "run": 1, "step": 4, "message": 12, "memory": 2},
            "skipped": {"context": 0, "run": 0, "step": 0, "message": 0, "memory": 0},
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
    key = require_scope(request, "admin")

    def records():
        for number, line in enumerate(iter(request.readline, b""), start=1):
            if not line.strip():
                continue
            yield _record(line, number)

    try:
        result = import_records(
            records(),
            # A confined key writes only inside its context keys (contexts and key-subset memories).
            allowed=(lambda keys: auth.keys_allowed(key, keys)) if key.context_keys else None,
            actor=Actor.for_key(key),
        )
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
