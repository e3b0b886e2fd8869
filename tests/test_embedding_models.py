"""The embedding-model registry: an operator registers a name with its dimensions (API with an
unconfined admin key, or `manage.py embedding_model`), then vectors under it are accepted;
stored names are registered by migration 0017, the configured provider's model by itself."""

from __future__ import annotations

import io
from importlib import import_module
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection

from memory_app.embeddings import registry
from memory_app.models import AuditEvent, Embedding, EmbeddingModel
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from tests.api_helpers import make_key, new_context

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_provider(settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"


def test_an_unconfined_admin_registers_a_model_then_vectors_under_it_are_accepted():
    admin = make_key(scopes=["admin"])
    writer = make_key(scopes=["read", "write"])
    cid = new_context(writer, {"test": "registered"})
    item = {"role": "user", "text": "a", "vector": [0.1, 0.2, 0.3, 0.4], "vector_model": "ops-4"}
    assert writer.post(f"/api/v1/contexts/{cid}/messages", item).status_code == 422

    assert (
        writer.post("/api/v1/embedding-models", {"name": "ops-4", "dimensions": 4}).status_code
        == 403
    )
    created = admin.post("/api/v1/embedding-models", {"name": "ops-4", "dimensions": 4})
    assert created.status_code == 201, created.content
    assert created.json()["dimensions"] == 4 and created.json()["created_by"] == admin.key.actor
    again = admin.post("/api/v1/embedding-models", {"name": "ops-4", "dimensions": 4})
    assert again.status_code == 200
    other = admin.post("/api/v1/embedding-models", {"name": "ops-4", "dimensions": 8})
    assert other.status_code == 409
    listed = writer.get("/api/v1/embedding-models").json()["items"]
    assert [(m["name"], m["dimensions"]) for m in listed] == [("ops-4", 4)]
    event = AuditEvent.objects.get(action="register", target_type="embedding_model")
    assert event.api_key_id == admin.key.pk and event.after == {"name": "ops-4", "dimensions": 4}

    stored = writer.post(f"/api/v1/contexts/{cid}/messages", item)
    assert stored.status_code in (200, 201), stored.content
    short = {**item, "vector": [0.1, 0.2]}
    bad = writer.post(f"/api/v1/contexts/{cid}/messages", short)
    assert bad.status_code == 422 and "4 dimensions" in bad.json()["detail"]
    assert Embedding.objects.filter(model="ops-4").count() == 1


def test_the_command_registers_and_lists_models():
    out = io.StringIO()
    call_command("embedding_model", "add", "cli-3", "--dimensions", "3", stdout=out)
    assert "registered: cli-3 (3 dimensions)" in out.getvalue()
    out = io.StringIO()
    call_command("embedding_model", "list", stdout=out)
    assert out.getvalue().startswith("cli-3\t3\t")
    context, _ = context_get_or_create(keys={"test": "cli-registered"})
    result = messages_append(
        context=context,
        items=[{"role": "user", "text": "a", "vector": [1, 0, 0], "vector_model": "cli-3"}],
    )
    assert Embedding.objects.get(message=result.messages[0]).dimensions == 3


def test_migration_0017_registers_every_stored_model_with_its_dimensions():
    context, _ = context_get_or_create(keys={"test": "legacy"})
    messages = messages_append(
        context=context, items=[{"role": "user", "text": f"m{i}"} for i in range(3)]
    ).messages
    # Vectors stored before the registry existed: two of 5 dimensions, one stray of 2.
    for message, vector in zip(messages, ([1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0]), strict=True):
        Embedding.objects.create(
            message=message,
            context=context,
            model="legacy-5",
            vector=vector,
            dimensions=len(vector),
        )
    migration = import_module("memory_app.migrations.0017_register_stored_models")
    migration.register_stored(apps, SimpleNamespace(connection=connection))
    assert EmbeddingModel.objects.get(name="legacy-5").dimensions == 5
    registry.forget()
    assert registry.registered_dimensions("legacy-5") == 5


def test_a_backup_line_under_an_unregistered_model_is_refused():
    from memory_app.backup.restore import import_lines
    from memory_app.errors import BackupFormatError
    from memory_app.models import keys_digest
    from tests.builders import BACKUP_HEADER, backup_file

    keys = {"test": "backup-model"}
    lines = [
        BACKUP_HEADER,
        {
            "type": "context",
            "digest": keys_digest(keys),
            "keys_digest": keys_digest(keys),
            "keys": keys,
        },
        {"type": "message", "context": keys_digest(keys), "seq": 1, "role": "user", "text": "t"},
        {
            "type": "embedding",
            "item": "message",
            "context": keys_digest(keys),
            "seq": 1,
            "model": "never-registered",
            "vector": [0.1, 0.2],
        },
    ]
    with pytest.raises(BackupFormatError, match="never-registered.*not registered"):
        import_lines(backup_file(lines).splitlines(keepends=True))
    assert not Embedding.objects.filter(model="never-registered").exists()


def test_an_admin_registers_a_model_on_the_dashboard(client):
    from tests.builders import make_user

    client.force_login(make_user(role="admin"))
    response = client.post("/keys/embedding-models/", {"name": "dash-8", "dimensions": "8"})
    assert response.status_code == 302
    row = EmbeddingModel.objects.get(name="dash-8")
    assert row.dimensions == 8 and row.created_by.startswith("user:")
    page = client.get("/keys/").content.decode()
    assert "dash-8" in page and "Embedding models" in page
    refused = client.post("/keys/embedding-models/", {"name": "dash-8", "dimensions": "9"})
    assert refused.status_code == 400 and "registered with 8 dimensions" in refused.content.decode()
    client.force_login(make_user(role="curator"))
    assert (
        client.post("/keys/embedding-models/", {"name": "x", "dimensions": "2"}).status_code == 403
    )


def test_the_configured_local_model_registers_itself(settings):
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "local"
    settings.AGENTMEMORY_EMBEDDING_MODEL = ""
    settings.AGENTMEMORY_LOCAL_MODEL_PATH = ""
    context, _ = context_get_or_create(keys={"test": "local-registers"})
    result = messages_append(
        context=context, items=[{"role": "user", "text": "a", "vector": [0.01] * 384}]
    )
    assert Embedding.objects.get(message=result.messages[0]).model == "all-MiniLM-L6-v2"
    row = EmbeddingModel.objects.get(name="all-MiniLM-L6-v2")
    assert (row.dimensions, row.created_by) == (384, "system:provider")
