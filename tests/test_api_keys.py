"""API keys: hashed storage, shown once, last_used_at throttled, management command."""

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
    ApiKey.objects.filter(pk=issued.key.pk).update(last_used_at=timezone.now() - timedelta(minutes=2))
    client.get("/api/v1/contexts")
    assert ApiKey.objects.get(pk=issued.key.pk).last_used_at > first


def test_command_creates_lists_and_revokes_keys():
    out = StringIO()
    call_command("apikey", "create", "crawler", "--scopes", "read", "--context-keys", '{"tenant": "acme"}', stdout=out)
    secret = out.getvalue().strip().splitlines()[-1]
    key = ApiKey.objects.get(name="crawler")
    assert (key.scopes, key.context_keys) == (["read"], {"tenant": "acme"})
    assert ApiClient(secret).get("/api/v1/contexts").status_code == 200

    listing = StringIO()
    call_command("apikey", "list", stdout=listing)
    assert key.prefix in listing.getvalue() and secret not in listing.getvalue()

    call_command("apikey", "revoke", key.prefix, stdout=StringIO())
    assert ApiClient(secret).get("/api/v1/contexts").status_code == 401
    assert list(AuditEvent.objects.order_by("id").values_list("action", flat=True)) == ["key_create", "key_revoke"]


@pytest.mark.parametrize(
    "args", [["create", "x", "--scopes", "god"], ["create", "x", "--context-keys", "{nope"], ["revoke", "missing"]]
)
def test_command_errors_are_clear(args):
    with pytest.raises(CommandError):
        call_command("apikey", *args, stdout=StringIO())
