"""Erasure by key subset (`POST /api/v1/erasure`): forget everything about, say, user ada.

'admin' scope, and a confined key erases only inside its confinement: the subset must contain
the key's own context keys (else some contexts it names lie outside what the key may touch).
Without `confirmation` the answer counts what would go and nothing changes.
"""

from __future__ import annotations

from typing import Any

from ninja import Router, Schema, Status
from pydantic import Field

from memory_app import auth
from memory_app.api.common import WRITE_ERRORS, actor_for, require_scope, responses
from memory_app.errors import Forbidden
from memory_app.schemas.fields import JsonObject, Text, _examples
from memory_app.services import erasure

router = Router(tags=["erasure"])


RECEIPT_EXAMPLE = {kind: 0 for kind in erasure.KINDS} | {"contexts": 2, "messages": 40}


class ErasureIn(Schema):
    model_config = _examples(
        {"keys": {"user": "ada"}},
        {"keys": {"user": "ada"}, "confirmation": erasure.ERASE_CONFIRMATION},
    )
    keys: JsonObject = Field(
        description="the key subset: every context whose keys contain it, and its memories",
        examples=[{"user": "ada"}],
    )
    confirmation: Text | None = Field(
        None,
        max_length=200,
        description=f"type {erasure.ERASE_CONFIRMATION!r} to erase; without it, only counts",
    )


class ErasureOut(Schema):
    model_config = _examples(
        {"erased": False, "receipt": RECEIPT_EXAMPLE},
        {
            "erased": True,
            "receipt": RECEIPT_EXAMPLE,
            "keys_digest": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "audit_event_id": 812,
        },
    )
    erased: bool
    receipt: dict[str, int] = Field(description="rows removed (or that would be) per kind")
    keys_digest: str | None = None
    audit_event_id: int | None = None


@router.post(
    "/erasure", response=responses({200: ErasureOut}, WRITE_ERRORS), summary="Erase a key subset"
)
def erase(request, body: ErasureIn) -> Any:
    """Irreversible, 'admin' scope: every context whose keys contain `keys` goes with its
    messages, full-text rows, runs, steps, tool calls, trace spans, OTLP exports still queued,
    memories, vectors and retries; the key subset's own memories and the API keys confined
    inside it too; audit payloads about them are redacted. The
    receipt counts each kind. 409 when a memory in the subset is under legal hold."""
    key = require_scope(request, "admin")
    keys = erasure.clean_keys(body.keys)
    if not auth.keys_allowed(key, keys):
        raise Forbidden("the key subset reaches contexts outside this API key's confinement")
    if body.confirmation is None:
        return Status(200, {"erased": False, "receipt": erasure.erase_preview(keys=keys)})
    done = erasure.erase(keys=keys, confirmation=body.confirmation, actor=actor_for(request))
    return Status(200, {"erased": True, **done})
