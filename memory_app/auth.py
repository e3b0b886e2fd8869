"""API keys: creation (secret shown once), verification, scopes and context-key confinement.

A key reads `am_<prefix>_<secret>`. Only SHA-256(full key) is stored; the prefix is stored in
clear to find the row in one indexed lookup. Secrets are 256-bit random tokens, so a fast hash
is enough (nothing to brute-force) and keeps per-request verification cheap.

Scopes: `read` (GET), `write` (create, append, edit, prune, restore), `admin` (everything,
including operator-level actions). `admin` implies the other two; `write` does not imply `read`.

Confinement: a key whose `context_keys` is `{"tenant": "acme"}` sees only contexts whose keys
contain it (PostgreSQL `keys @> context_keys`). Anything outside answers 404, as if absent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from memory_app.models import ApiKey, Context

KEY_PREFIX = "am_"
SCOPES = ApiKey.SCOPES
# last_used_at is refreshed at most this often per key: an UPDATE on every request would make
# the hot read path write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedKey:
    key: ApiKey
    secret: str  # the full key string, shown once


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _normalise_scopes(scopes: list[str] | tuple[str, ...]) -> list[str]:
    wanted = list(dict.fromkeys(scopes))
    unknown = [s for s in wanted if s not in SCOPES]
    if unknown or not wanted:
        raise ValueError(f"scopes must be a non-empty subset of {list(SCOPES)}, got {list(scopes)}")
    return wanted


def apikey_create(
    *,
    name: str,
    scopes: list[str] | tuple[str, ...] = ("read", "write"),
    context_keys: dict[str, Any] | None = None,
    created_by=None,
) -> IssuedKey:
    """Create a key; the returned `secret` is the only time the full key exists in clear."""
    if context_keys is not None and not isinstance(context_keys, dict):
        raise ValueError("context_keys must be a JSON object")
    scopes = _normalise_scopes(scopes)
    prefix = secrets.token_hex(6)
    secret = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(
        name=name,
        prefix=prefix,
        secret_hash=hash_secret(secret),
        scopes=scopes,
        context_keys=context_keys or {},
        created_by=created_by,
    )
    return IssuedKey(key=key, secret=secret)


def apikey_revoke(*, key: ApiKey) -> ApiKey:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def _parse(secret: str) -> str | None:
    """The prefix of a well-formed key string, else None."""
    if not secret.startswith(KEY_PREFIX):
        return None
    prefix, sep, rest = secret[len(KEY_PREFIX) :].partition("_")
    if not sep or not rest or len(prefix) != 12:
        return None
    return prefix


def apikey_verify(secret: str) -> ApiKey | None:
    """The live key matching `secret`, or None (unknown, malformed or revoked)."""
    prefix = _parse(secret or "")
    if prefix is None:
        return None
    key = ApiKey.objects.filter(prefix=prefix).first()
    if key is None or key.revoked_at is not None:
        return None
    if not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
        return None
    _touch(key)
    return key


def _touch(key: ApiKey) -> None:
    now = timezone.now()
    if key.last_used_at is not None and now - key.last_used_at < LAST_USED_RESOLUTION:
        return
    # Conditional UPDATE: concurrent requests of one key do not all write.
    ApiKey.objects.filter(pk=key.pk).exclude(last_used_at__gt=now - LAST_USED_RESOLUTION).update(
        last_used_at=now
    )
    key.last_used_at = now


def has_scope(key: ApiKey, scope: str) -> bool:
    return scope in key.scopes or "admin" in key.scopes


def visible_contexts(key: ApiKey, queryset: QuerySet | None = None) -> QuerySet:
    """Contexts the key may see (all of them for an unconfined key)."""
    queryset = Context.objects.all() if queryset is None else queryset
    if key.context_keys:
        return queryset.filter(keys__contains=key.context_keys)
    return queryset


def keys_allowed(key: ApiKey, keys: dict[str, Any]) -> bool:
    """Whether a context with `keys` lies inside the key's confinement.

    Asked of PostgreSQL so the answer is exactly the `@>` used by `visible_contexts`
    (nested objects and arrays included).
    """
    if not key.context_keys:
        return True
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT %s::jsonb @> %s::jsonb", [json.dumps(keys), json.dumps(key.context_keys)]
        )
        return bool(cursor.fetchone()[0])
