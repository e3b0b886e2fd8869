"""API keys: hashed storage, shown once, last_used_at throttled, management command."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from memory_app import auth
from memory_app.models import ApiKey, AuditEvent
from tests.api_helpers import ApiClient

pytestmark = pytest.mark.django_db


def test_secret_is_stored_only_as_its_sha256():
    issued = auth.apikey_create(name="agent", scopes=["read"])
    stored = ApiKey.objects.get(pk=issued.key.pk)
    assert issued.secret not in (stored.secret_hash, stored.prefix)
    assert stored.secret_hash == auth.hash_secret(issued.secret)
    assert issued.secret.startswith(f"am_{stored.prefix}_")
    assert auth.apikey_verify(issued.secret).pk == stored.pk


@pytest.mark.parametrize("scopes", [[], ["root"], ["read", "sudo"]])
def test_unknown_or_empty_scopes_are_refused(scopes):
    with pytest.raises(ValueError):
        auth.apikey_create(name="x", scopes=scopes)


def test_last_used_at_is_set_on_use_and_refreshed_at_most_once_a_minute():
    issued = auth.apikey_create(name="agent", scopes=["read"])
    client = ApiClient(issued.secret)
    client.get("/api/v1/contexts")
    first = ApiKey.objects.get(pk=issued.key.pk).last_used_at
    assert first is not None
    client.get("/api/v1/contexts")
    assert ApiKey.objects.get(pk=issued.key.pk).last_used_at == first
    ApiKey.objects.filter(pk=issued.key.pk).update(
        last_used_at=timezone.now() - timedelta(minutes=2)
    )
    client.get("/api/v1/contexts")
    assert ApiKey.objects.get(pk=issued.key.pk).last_used_at > first


def test_command_creates_lists_and_revokes_keys():
    out = StringIO()
    call_command(
        "apikey",
        "create",
        "crawler",
        "--scopes",
        "read",
        "--context-keys",
        '{"tenant": "acme"}',
        stdout=out,
    )
    secret = out.getvalue().strip().splitlines()[-1]
    key = ApiKey.objects.get(name="crawler")
    assert (key.scopes, key.context_keys) == (["read"], {"tenant": "acme"})
    assert ApiClient(secret).get("/api/v1/contexts").status_code == 200

    listing = StringIO()
    call_command("apikey", "list", stdout=listing)
    assert key.prefix in listing.getvalue() and secret not in listing.getvalue()

    call_command("apikey", "revoke", key.prefix, stdout=StringIO())
    assert ApiClient(secret).get("/api/v1/contexts").status_code == 401
    assert list(AuditEvent.objects.order_by("id").values_list("action", flat=True)) == [
        "key_create",
        "key_revoke",
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["create", "x", "--scopes", "god"],
        ["create", "x", "--context-keys", "{nope"],
        ["revoke", "missing"],
    ],
)
def test_command_errors_are_clear(args):
    with pytest.raises(CommandError):
        call_command("apikey", *args, stdout=StringIO())


# An empty value confines a key to nothing in particular: "" is what an unset variable in
# `{"tenant": "$TENANT"}` becomes (every such key shares one "tenant"), and in PostgreSQL's
# `keys @> confinement` an empty object or list is contained in every object or list value.
EMPTY_CONFINEMENTS = [
    {"tenant": ""},
    {"tenant": "   "},
    {"tenant": None},
    {"tenant": {}},
    {"tenant": []},
    {"tenant": "acme", "org": {"team": ""}},
    {"tenant": ["acme", ""]},
]


@pytest.mark.parametrize("confinement", EMPTY_CONFINEMENTS, ids=json.dumps)
def test_a_key_confined_to_an_empty_value_is_refused(confinement):
    with pytest.raises(ValueError, match="empty") as caught:
        auth.apikey_create(name="x", context_keys=confinement)
    assert "tenant" in str(caught.value) or "team" in str(caught.value)
    assert not ApiKey.objects.exists()


@pytest.mark.parametrize(
    "confinement",
    [
        {},
        {"tenant": "acme"},
        {"tenant": 0},
        {"tenant": False},
        {"org": {"team": "red"}},
        {"tenant": ["acme"]},
    ],
    ids=json.dumps,
)
def test_a_key_confined_to_real_values_or_not_confined_is_created(confinement):
    assert auth.apikey_create(name="x", context_keys=confinement).key.context_keys == confinement


def test_the_command_says_why_an_empty_confinement_is_refused():
    with pytest.raises(CommandError, match='"tenant".*empty'):
        call_command("apikey", "create", "x", "--context-keys", '{"tenant": ""}', stdout=StringIO())
    assert not ApiKey.objects.exists() and not AuditEvent.objects.exists()


@pytest.mark.parametrize("sharded", [False, True], ids=["one statement", "key and context apart"])
def test_a_key_reads_its_context_within_its_confinement(
    monkeypatch, django_assert_num_queries, sharded
):
    """The key and the context it may see, read together on one node (a join) or as two
    statements as on a cluster (the confinement then checked apart): the same answers, a
    revoked key none."""
    from memory_app import scale_out
    from tests.builders import make_context

    distributed = scale_out.table_is_distributed
    monkeypatch.setattr(
        scale_out,
        "table_is_distributed",
        lambda table: sharded if table == "memory_app_context" else distributed(table),
    )
    inside = make_context(keys={"tenant": "acme", "user": "u1"})
    outside = make_context(keys={"tenant": "other", "user": "u1"})
    confined = auth.apikey_create(name="c", scopes=["read"], context_keys={"tenant": "acme"})
    free = auth.apikey_create(name="f", scopes=["read"], context_keys=None)
    assert len(auth.key_context_statements(confined.secret, inside.id)) == (2 if sharded else 1)

    def seen(issued, context_id):
        key, context = auth.apikey_verify_with_context(issued.secret, context_id)
        return (key.pk if key else None), (context.pk if context else None)

    assert seen(confined, inside.id) == (confined.key.pk, inside.id)
    if sharded:
        # Verified once, the key's confinement filters its context's read: a context outside
        # it reads as none (no row comes back, nothing more is asked).
        statements = auth.key_context_statements(confined.secret, outside.id)
        assert '{"tenant": "acme"}' in statements[1][1]
        with django_assert_num_queries(2):
            assert seen(confined, outside.id) == (confined.key.pk, None)
    assert seen(confined, outside.id) == (confined.key.pk, None)
    assert seen(free, outside.id) == (free.key.pk, outside.id)
    assert seen(free, 10**12) == (free.key.pk, None)
    assert seen(free, None) == (free.key.pk, None)
    wrong = free.secret[:-1] + ("a" if free.secret[-1] != "a" else "b")
    assert auth.apikey_verify_with_context(wrong, inside.id) == (None, None)
    auth.apikey_revoke(key=free.key)
    assert auth.apikey_verify_with_context(free.secret, inside.id) == (None, None)


@pytest.mark.django_db(transaction=True)
def test_statements_read_together_open_the_threads_connection_first():
    """A thread's first request may read its key and context as two statements (on Citus)
    before anything opened its connection."""
    from django.db import connection

    from memory_app import pipelines

    connection.close()
    rows = pipelines.first_rows([("SELECT 1", []), ("SELECT 2 WHERE false", [])])
    assert rows == [(1,), None]
