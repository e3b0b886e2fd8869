"""API keys: creation (secret shown once), verification, scopes and context-key confinement.

A key reads `am_<prefix>_<secret>`. Only SHA-256(full key) is stored; the prefix is stored in
clear to find the row in one indexed lookup. Secrets are 256-bit random tokens, so a fast hash
is enough (nothing to brute-force) and keeps per-request verification cheap.

Scopes: `read` (GET), `write` (create, append, edit, prune, restore), `admin` (everything,
including operator-level actions). `admin` implies the other two; `write` does not imply `read`.

Confinement: a key whose `context_keys` is `{"tenant": "acme"}` sees only contexts whose keys
contain it (PostgreSQL `keys @> context_keys`). Anything outside answers 404, as if absent.
Confinement values are never empty (see `_check_confinement`).
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

from memory_app import db, pipelines, scale_out
from memory_app.errors import Forbidden, NotFound
from memory_app.models import ApiKey, Context, Message, Run, Step

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


def _check_confinement(context_keys: dict[str, Any]) -> None:
    """Refuse a confinement holding an empty value anywhere: "" or whitespace (what an unset
    variable in `{"tenant": "$TENANT"}` becomes, so unrelated keys would share one tenant), null
    (the same, from a JSON template), and an empty object or list (`keys @> confinement` holds for
    every object or list value there, so it confines to nothing). `{}` as a whole is no
    confinement, said on purpose."""
    stack: list[tuple[str, Any]] = [(json.dumps(k), v) for k, v in context_keys.items()]
    while stack:
        path, value = stack.pop()
        if value is None or (isinstance(value, str) and not value.strip()):
            empty = "null" if value is None else json.dumps(value)
        elif isinstance(value, dict | list) and not value:
            empty = "an empty object" if isinstance(value, dict) else "an empty list"
        else:
            if isinstance(value, dict):
                stack += [(f"{path}.{json.dumps(k)}", v) for k, v in value.items()]
            elif isinstance(value, list):
                stack += [(f"{path}[{n}]", v) for n, v in enumerate(value)]
            continue
        raise ValueError(
            f"context_keys {path} is empty ({empty}): a key is confined to non-empty values, "
            'e.g. {"tenant": "acme"}; leave context_keys out for a key that is not confined'
        )


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
    _check_confinement(context_keys or {})
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
    return apikey_verify_with_context(secret, None)[0]


def apikey_verify_with_context(
    secret: str, context_id: int | None, *, id_suffices: bool = False
) -> tuple[ApiKey | None, Context | None]:
    """The live key matching `secret` (None: unknown, malformed or revoked) and, when
    `context_id` is given, that context if the key may see it (as `context_for_key` finds it),
    in one round trip: a request to a context's route needs both before anything else.

    `id_suffices`: the caller needs only the context's id, its own statement failing when the
    context does not exist (an append). On a distributed store, where the context's read is a
    hop to its worker, a key this process last verified as unconfined, which may see every
    context, is then read alone, and the context answered is a reference by id
    (`context_reference`)."""
    if id_suffices and context_id is not None and _unconfined_on_shards(secret):
        key, _ = apikey_verify_with_context(secret, None)
        if key is None:
            return None, None
        if not key.context_keys:
            return key, context_reference(context_id)
        _confinements[key.prefix] = _confinement_text(key)  # confined since: read it as usual
    statements = key_context_statements(secret, context_id)
    if statements is None:
        return None, None
    return key_context_from_rows(secret, pipelines.first_rows(statements))


def _unconfined_on_shards(secret: str) -> bool:
    """Whether the contexts are distributed and this process last verified `secret`'s key as
    unconfined."""
    prefix = _parse(secret or "")
    return (
        prefix is not None
        and _confinements.get(prefix) == _UNCONFINED
        and scale_out.table_is_distributed(Context._meta.db_table)
    )


def context_reference(context_id: int) -> Context:
    """A context named by its id alone, nothing read: what an append needs of it (its other
    fields are the model's defaults, not the stored values)."""
    return Context(pk=context_id)


def is_context_reference(context: Context) -> bool:
    """Whether `context` is a `context_reference` (never read) rather than a stored row."""
    return context._state.adding


def key_context_statements(secret: str, context_id: int | None) -> list[tuple[str, list]] | None:
    """The statements `apikey_verify_with_context` reads the key and the context with (None for
    a malformed key string): a caller may send them with other statements in one round trip and
    hand their first rows to `key_context_from_rows`."""
    prefix = _parse(secret or "")
    if prefix is None:
        return None
    key = (f"SELECT {_KEY_COLUMNS} FROM memory_app_apikey k WHERE k.prefix = %s", [prefix])  # noqa: S608
    if context_id is None:
        return [key]
    if scale_out.table_is_distributed(Context._meta.db_table):
        # On Citus the keys are a local table and the contexts sharded: a statement joining
        # them is planned in steps (each side gathered as an intermediate result, the join run
        # through the coordinator's connection to itself), about 2 ms more than the key's read
        # on the coordinator and the context's read routed to its shard, sent one after the
        # other. The context's read filters by the key's confinement as this process last
        # verified it, and says which it used (`key_context_from_rows` checks it is the key's):
        # a context outside it reads as no context, the same work.
        confinement = _confinements.get(prefix, "{}")
        context = (
            f"SELECT {_CONTEXT_COLUMNS}, %s::text FROM memory_app_context c "  # noqa: S608
            "WHERE c.id = %s AND c.keys @> %s::jsonb",
            [confinement, context_id, confinement],
        )
        return [key, context]
    # Confinement as `visible_contexts` applies it: every context contains `{}`.
    sql = (
        f"SELECT {_KEY_COLUMNS}, {_CONTEXT_COLUMNS} FROM memory_app_apikey k "  # noqa: S608
        "LEFT JOIN (SELECT * FROM memory_app_context WHERE id = %s) c "
        "ON c.keys @> k.context_keys WHERE k.prefix = %s"
    )
    return [(sql, [context_id, prefix])]


def key_context_from_rows(
    secret: str, rows: list[tuple | None]
) -> tuple[ApiKey | None, Context | None]:
    """The key and context of `key_context_statements`' first rows, as
    `apikey_verify_with_context` answers them: (None, None) unless the key's row is live and its
    hash is `secret`'s."""
    row = rows[0]
    if row is None:
        return None, None
    split = len(ApiKey._meta.concrete_fields)
    key = db.from_row(ApiKey, row[:split])
    if key.revoked_at is not None or not hmac.compare_digest(key.secret_hash, hash_secret(secret)):
        return None, None
    _touch(key)
    if len(rows) == 1:
        found = row[split:]
        return key, (db.from_row(Context, found) if found and found[0] is not None else None)
    # Read apart (on Citus): the context's row came filtered by the confinement named in its
    # last column. Another than the key's (not verified in this process yet) is checked here.
    confinement = _confinement_text(key)
    _confinements[key.prefix] = confinement
    found = rows[1]
    if found is None:
        return key, None
    context = db.from_row(Context, found[:-1])
    if found[-1] != confinement and not keys_allowed(key, context.keys):
        context = None  # outside the key's confinement: as if absent
    return key, context


# Each key's confinement as this process last verified it, by prefix (the text a context's read
# filters by on Citus: `key_context_statements`).
_confinements: dict[str, str] = {}


def _confinement_text(key: ApiKey) -> str:
    return json.dumps(key.context_keys or {}, sort_keys=True)


_UNCONFINED = json.dumps({})


_KEY_COLUMNS = db.select_columns(ApiKey, "k")
_CONTEXT_COLUMNS = db.select_columns(Context, "c")


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


def require_scope(key: ApiKey, scope: str) -> ApiKey:
    """`key`, or Forbidden when it lacks `scope` ('read', 'write' or 'admin')."""
    if not has_scope(key, scope):
        raise Forbidden(f"this API key lacks the '{scope}' scope")
    return key


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


def require_keys_allowed(key: ApiKey, keys: dict[str, Any]) -> None:
    """Forbidden when a context with `keys` would lie outside the key's confinement."""
    if not keys_allowed(key, keys):
        raise Forbidden(f"this API key may only use contexts whose keys contain {key.context_keys}")


# --- one object by id, if the key may see it: unknown and foreign ids look alike (NotFound) ------


def context_for_key(key: ApiKey, context_id: int, *, lock: bool = False) -> Context:
    qs = visible_contexts(key).filter(pk=context_id)
    if lock:
        qs = qs.select_for_update()
    context = qs.first()
    if context is None:
        raise NotFound(f"context {context_id} not found")
    return context


def _in_context(queryset: QuerySet, context_id: int | None) -> QuerySet:
    """Rows of one context when the route names it: on Citus the lookup then goes to the one
    shard holding it instead of every shard."""
    return queryset if context_id is None else queryset.filter(context_id=context_id)


def run_for_key(key: ApiKey, run_id: int, context_id: int | None = None) -> Run:
    runs = _in_context(Run.objects.filter(pk=run_id), context_id)
    run = runs.filter(context__in=visible_contexts(key)).first()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


def message_for_key(key: ApiKey, message_id: int, context_id: int | None = None) -> Message:
    messages = _in_context(Message.objects.filter(pk=message_id), context_id)
    message = messages.filter(context__in=visible_contexts(key)).first()
    if message is None:
        raise NotFound(f"message {message_id} not found")
    return message


def step_for_key(key: ApiKey, step_id: int, context_id: int | None = None) -> Step:
    steps = _in_context(Step.objects.filter(pk=step_id), context_id)
    step = steps.filter(context__in=visible_contexts(key)).first()
    if step is None:
        raise NotFound(f"step {step_id} not found")
    # Its run by id and context (one shard), not a join by id alone.
    step.run = Run.objects.get(pk=step.run_id, context_id=step.context_id)
    return step
