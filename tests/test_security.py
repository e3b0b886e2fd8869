"""Attacks a hostile tenant would try, end to end through the Agent API.

Tenant A and tenant B each hold keys confined to their own context keys. B's admin key may import
backups, but only into B's keys: nothing in a file B writes may reach, confirm or change A's data.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memory_app import memories
from memory_app.models import (
    AuditEvent,
    Context,
    Embedding,
    MemoryEmbedding,
    MemoryRecord,
    Message,
    Run,
    keys_digest,
)
from tests.api_helpers import make_key, new_context
from tests.builders import BACKUP_HEADER, backup_file, register_models

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
A_KEYS = {"tenant": "a", "chat": "1"}
B_KEYS = {"tenant": "b", "chat": "1"}
A_FACT = "Ada's card ends in 4242"
HEADER = BACKUP_HEADER


@pytest.fixture
def tenants():
    a = make_key(scopes=("read", "write"), context_keys={"tenant": "a"}, name="tenant-a")
    b = make_key(scopes=("read", "write", "admin"), context_keys={"tenant": "b"}, name="tenant-b")
    return a, b, new_context(a, A_KEYS), new_context(b, B_KEYS)


def _import(client, lines):
    body = backup_file(lines)
    return client.client.generic(
        "POST", "/api/v1/import", body, content_type="application/x-ndjson", **client._headers()
    )


def _context_line(keys):
    return {
        "type": "context",
        "digest": keys_digest(keys),
        "keys_digest": keys_digest(keys),
        "keys": keys,
    }


def _a_scope_digests(a_context_id):
    a_context = Context.objects.get(pk=a_context_id)
    return {
        "context": memories.Scope(context=a_context).digest,
        "subset": memories.Scope(keys={"tenant": "a"}).digest,
    }


def _memory_line(*, content, scope_digest, context=None, scope_keys=None):
    return {
        "type": "memory",
        "context": context,
        "scope_keys": scope_keys or {},
        "scope_digest": scope_digest,
        "content": content,
        "content_hash": memories.content_hash(A_FACT),
        "recorded_by": "user:admin",
    }


def test_an_import_cannot_plant_records_under_another_tenants_scope(tenants):
    a, b, a_ctx, b_ctx = tenants
    digests = _a_scope_digests(a_ctx)
    lines = [
        HEADER,
        _context_line(B_KEYS),
        # A memory of B's context, and one of B's key subset, each claiming A's scope digest and
        # the hash of A's next fact.
        _memory_line(
            content="planted", scope_digest=digests["context"], context=keys_digest(B_KEYS)
        ),
        _memory_line(
            content="planted too", scope_digest=digests["subset"], scope_keys={"tenant": "b"}
        ),
    ]
    response = _import(b, lines)
    assert response.status_code == 200, response.content
    assert response.json()["created"]["memories"] == 2

    # A's own facts are stored as A's, created now, in both of A's scopes.
    for scope in ({"context_id": a_ctx}, {"scope_keys": {"tenant": "a"}}):
        recorded = a.post("/api/v1/memories", {**scope, "content": A_FACT})
        assert recorded.status_code == 201, recorded.content
        [item] = recorded.json()["items"]
        assert item["created"] is True and item["memory"]["content"] == A_FACT
    # The planted records sit in B's scopes, as B's import recorded them.
    planted = MemoryRecord.objects.filter(content__startswith="planted")
    assert {m.scope_digest for m in planted} == {
        memories.Scope(context=Context.objects.get(pk=b_ctx)).digest,
        memories.Scope(keys={"tenant": "b"}).digest,
    }
    assert {m.recorded_by for m in planted} == {b.key.actor}
    assert {m.content_hash for m in planted} == {
        memories.content_hash("planted"),
        memories.content_hash("planted too"),
    }


def test_an_import_cannot_confirm_another_tenants_facts(tenants):
    a, b, a_ctx, _ = tenants
    a.post("/api/v1/memories", {"context_id": a_ctx, "content": A_FACT})
    a.post("/api/v1/memories", {"scope_keys": {"tenant": "a"}, "content": A_FACT})
    digests = _a_scope_digests(a_ctx)
    guesses = [
        _memory_line(content=A_FACT, scope_digest=digests["context"], context=keys_digest(B_KEYS)),
        _memory_line(content=A_FACT, scope_digest=digests["subset"], scope_keys={"tenant": "b"}),
    ]
    response = _import(b, [HEADER, _context_line(B_KEYS), *guesses])
    # A right guess and a wrong one answer alike: each is a new record in B's own scope.
    assert response.json()["created"]["memories"] == 2
    assert response.json()["skipped"].get("memories", 0) == 0
    assert MemoryRecord.objects.filter(content=A_FACT).count() == 4


def test_an_import_cannot_attach_vectors_to_another_tenants_memories(tenants):
    a, b, a_ctx, _ = tenants
    a.post("/api/v1/memories", {"context_id": a_ctx, "content": A_FACT})
    target = MemoryRecord.objects.get(content=A_FACT)
    register_models(squat=3)  # a registered name: what is tested here is the confinement
    line = {
        "type": "embedding",
        "item": "memory",
        "scope_digest": target.scope_digest,
        "content_hash": target.content_hash,
        "model": "squat",
        "vector": [0.1, 0.2, 0.3],
    }
    response = _import(b, [HEADER, _context_line(B_KEYS), line])
    assert response.status_code == 200, response.content
    assert not MemoryEmbedding.objects.filter(memory_record=target, model="squat").exists()


def test_a_foreign_context_and_an_unknown_one_are_refused_alike(tenants):
    _, b, _, _ = tenants
    run = {
        "type": "run",
        "ref": {"client_id": "r", "created_at": "2026-01-01T00:00:00+00:00"},
        "client_id": "r",
        "task": "t",
    }
    foreign = _import(b, [HEADER, {**run, "context": keys_digest(A_KEYS)}])
    unknown = _import(b, [HEADER, {**run, "context": keys_digest({"tenant": "nobody"})}])
    assert foreign.status_code == unknown.status_code == 422
    assert foreign.json()["detail"].replace(keys_digest(A_KEYS)[:12], "…") == unknown.json()[
        "detail"
    ].replace(keys_digest({"tenant": "nobody"})[:12], "…")
    assert not Run.objects.exists()
    # A context line outside B's keys is refused whether or not it exists here.
    for keys in (A_KEYS, {"tenant": "a", "chat": "never"}):
        assert _import(b, [HEADER, _context_line(keys)]).status_code == 403


def test_derived_values_in_an_imported_file_are_recomputed(tenants):
    _, b, _, _ = tenants
    keys = {"tenant": "b", "chat": "restored"}
    register_models(m3=3)
    lies = {"last_seq": 900, "message_count": 5000, "token_count": 7, "run_count": 40}
    lines = [
        HEADER,
        {**_context_line(keys), **lies},
        {
            "type": "run",
            "context": keys_digest(keys),
            "client_id": "r1",
            "task": "t",
            "ref": {"client_id": "r1", "created_at": "2026-01-01T00:00:00+00:00"},
            "step_count": 77,
            "error_count": 9,
            "last_position": 12,
        },
        {
            "type": "step",
            "run": {"client_id": "r1", "created_at": "2026-01-01T00:00:00+00:00"},
            "position": 1,
            "kind": "action",
            "error_type": "AgentError",
            "error_message": "boom",
        },
        *(
            {
                "type": "message",
                "context": keys_digest(keys),
                "seq": n,
                "role": "user",
                "text": "three little words",
                "token_count": 999,
                "tokenizer": "cl100k_base",
            }
            for n in (1, 2)
        ),
        {
            "type": "embedding",
            "item": "message",
            "context": keys_digest(keys),
            "seq": 1,
            "model": "m3",
            "dimensions": 1536,
            "vector": [0.1, 0.2, 0.3],
        },
    ]
    response = _import(b, lines)
    assert response.status_code == 200, response.content
    ctx = Context.objects.get(keys_digest=keys_digest(keys))
    tokens = list(Message.objects.filter(context=ctx).values_list("token_count", flat=True))
    assert tokens == [3, 3]
    assert (ctx.last_seq, ctx.message_count, ctx.token_count, ctx.run_count) == (2, 2, 6, 1)
    run = Run.objects.get(context=ctx)
    assert (run.step_count, run.error_count, run.last_position) == (1, 1, 1)
    assert Embedding.objects.get(context=ctx).dimensions == 3
    # Imports are audited, the importing key as the actor.
    event = AuditEvent.objects.get(action="import")
    assert event.actor == b.key.actor and event.api_key_id == b.key.pk
    assert event.target_ids == [ctx.pk]
    assert event.after["created"]["messages"] == 2


# --- embedding model names ------------------------------------------------------------------


def _hnsw_indexes() -> set[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'memory_app_embedding'"
            " AND indexdef ILIKE '%% USING hnsw %%'"
        )
        return {name for (name,) in cursor.fetchall()}


def test_a_tenants_vector_under_an_unregistered_name_is_422_listing_the_registered(
    tenants, settings
):
    """A tenant cannot take the name of the operator's next model: every vector path refuses a
    name no operator registered, says which are, and stores nothing, not even an index."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    a, _, a_ctx, _ = tenants
    register_models(**{"operator-3": 3})
    squat = "text-embedding-4-large"
    indexes = _hnsw_indexes()
    messages, embeddings = Message.objects.count(), Embedding.objects.count()
    item = {"role": "user", "text": "x", "vector": [0.1, 0.2, 0.3], "vector_model": squat}
    mid = a.post(f"/api/v1/contexts/{a_ctx}/messages", {"role": "user", "text": "y"}).json()["id"]
    messages += 1
    refused = [
        a.post(f"/api/v1/contexts/{a_ctx}/messages", item),
        a.post(f"/api/v1/contexts/{a_ctx}/messages/batch", {"messages": [item]}),
        a.post(f"/api/v1/messages/{mid}/embeddings", {"model": squat, "vector": [0.1, 0.2]}),
        a.post(
            "/api/v1/memories",
            {"context_id": a_ctx, "content": "c", "vector": [0.1], "vector_model": squat},
        ),
        a.post(
            f"/api/v1/contexts/{a_ctx}/select",
            {"selector": "search", "mode": "semantic", "model": squat, "query_vector": [1.0]},
        ),
    ]
    for response in refused:
        assert response.status_code == 422, response.content
        detail = response.json()["detail"]
        assert squat in detail and "not registered" in detail and "'operator-3'" in detail
    assert (Message.objects.count(), Embedding.objects.count()) == (messages, embeddings)
    assert not MemoryRecord.objects.filter(content="c").exists()
    assert _hnsw_indexes() == indexes


def test_a_confined_admin_key_cannot_register_a_model(tenants):
    _, b, _, _ = tenants
    response = b.post("/api/v1/embedding-models", {"name": "squatted", "dimensions": 3})
    assert response.status_code == 403 and "confined" in response.json()["detail"]
    assert b.get("/api/v1/embedding-models").status_code == 200
    from memory_app.models import EmbeddingModel

    assert not EmbeddingModel.objects.filter(name="squatted").exists()


def test_new_names_add_no_index(tenants, settings):
    """Each name used to add an HNSW index (460 names made vector writes 3x slower): the number
    of indexes is bounded by the registered models, whatever names requests use."""
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    a, _, a_ctx, _ = tenants
    before = _hnsw_indexes()
    for n in range(20):
        item = {"role": "user", "text": f"m{n}", "vector": [1.0, n, 0.5], "vector_model": f"x{n}"}
        response = a.post(f"/api/v1/contexts/{a_ctx}/messages/batch", {"messages": [item]})
        assert response.status_code == 422
    assert _hnsw_indexes() == before
    assert not Embedding.objects.filter(model__startswith="x").exists()


# --- login throttling and HTTPS --------------------------------------------------------------


def _login(client, username, password):
    return client.post("/accounts/login/", {"username": username, "password": password})


def test_wrong_passwords_lock_the_account_out_then_an_admin_lifts_it(settings):
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    get_user_model().objects.create_user(username="ada", password="a long right passphrase")
    client = Client()
    for _ in range(40):
        assert _login(client, "ada", "wrong").status_code in (200, 429)
    # The right password is refused too while the lockout lasts, and no session is made.
    locked = _login(client, "ada", "a long right passphrase")
    assert locked.status_code == 429
    assert b"Too many failed logins" in locked.content
    assert "_auth_user_id" not in client.session
    # Another account from the same address is not locked.
    get_user_model().objects.create_user(username="bo", password="another right passphrase")
    assert _login(Client(), "bo", "another right passphrase").status_code == 302
    call_command("axes_reset_username", "ada", stdout=io.StringIO())
    assert _login(client, "ada", "a long right passphrase").status_code == 302


def test_fewer_wrong_passwords_than_the_limit_still_let_the_right_one_in(settings):
    from django.contrib.auth import get_user_model
    from django.test import Client

    get_user_model().objects.create_user(username="ada", password="a long right passphrase")
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _login(client, "ada", "wrong").status_code == 200
    assert _login(client, "ada", "a long right passphrase").status_code == 302


def test_the_operator_password_from_the_environment_passes_the_validators():
    from django.core.management.base import CommandError

    from memory_app.management.commands.serve import ensure_operator

    for weak in ("1234", "password123", "operator1"):
        with pytest.raises(CommandError, match="AGENTMEMORY_OPERATOR_PASSWORD"):
            ensure_operator(username="operator", password=weak)
    assert ensure_operator(username="operator", password="a long right passphrase") == (
        "operator",
        None,
    )


HTTPS_SCRIPT = """
import json, os
os.environ["DJANGO_SETTINGS_MODULE"] = "agentmemory_site.settings"
import django
django.setup()
from django.conf import settings
from django.test import Client
plain = Client().get("/accounts/login/")
proxied = Client().get("/accounts/login/", headers={"X-Forwarded-Proto": "https"})
print(json.dumps({
    "cookies": [settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE],
    "plain": [plain.status_code, plain.headers.get("Location")],
    "proxied": [proxied.status_code, proxied.headers.get("Strict-Transport-Security"),
                bool(proxied.cookies["csrftoken"]["secure"])],
}))
"""


@pytest.mark.parametrize("https", ["true", "false"])
def test_one_setting_turns_on_https_behind_a_proxy(https, tmp_path):
    env = {**os.environ, "AGENTMEMORY_HTTPS": https, "AGENTMEMORY_DATA_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    out = subprocess.run(
        [sys.executable, "-c", HTTPS_SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    if https == "true":
        assert seen["cookies"] == [True, True]
        assert seen["plain"] == [301, "https://testserver/accounts/login/"]
        assert seen["proxied"][0] == 200 and "max-age=31536000" in seen["proxied"][1]
        assert seen["proxied"][2] is True
    else:
        assert seen["cookies"] == [False, False]
        assert seen["plain"][0] == 200 and seen["proxied"][1] is None


# --- scores, labels, comments, checkpoints and memory versions in a tenant's import ------------


def _a_run_and_memory(a, a_ctx):
    """A's run (client id "a-run") with a step at position 1 and a score on it, a message (seq 1)
    in A's context, and A's fact: the rows B's lines aim at."""
    from memory_app.audit import Actor
    from memory_app.services.runs import run_create, steps_append
    from memory_app.services.scores import Target, score_add

    run, _ = run_create(context=Context.objects.get(pk=a_ctx), client_id="a-run", task="t")
    steps_append(run=run, items=[{"kind": "action"}])
    score_add(
        actor=Actor.for_key(a.key), target=Target.of(run), name="ok", kind="boolean", value=True
    )
    a.post(f"/api/v1/contexts/{a_ctx}/messages", {"role": "user", "text": "hi"})
    a.post("/api/v1/memories", {"context_id": a_ctx, "content": A_FACT})
    return {"client_id": "a-run", "created_at": run.created_at.isoformat()}


def _refusals_alike(b, foreign_lines, unknown_lines, hide=()):
    foreign, unknown = _import(b, foreign_lines), _import(b, unknown_lines)
    assert foreign.status_code == unknown.status_code == 422, (foreign.content, unknown.content)
    said = [r.json()["detail"] for r in (foreign, unknown)]
    for text in hide:
        said = [s.replace(text, "…") for s in said]
    assert said[0] == said[1], said
    return said[0]


def test_new_kinds_reach_no_other_tenants_context_run_step_message_or_memory(tenants):
    """Scores, labels, comments, checkpoints and memory versions of B's file reach only the
    contexts, runs, steps, messages and memories the file defines: A's context, A's run, step and
    message (named in a context of B's own) and A's memory fail exactly as ones that exist
    nowhere, and nothing of A's changes. Each line is valid but for what it refers to (no
    author or actor: the importer is both), so the refusal is the lookup's."""
    from memory_app.models import Checkpoint, Comment, Label, MemoryVersion, Message, Score, Step

    a, b, a_ctx, _ = tenants
    a_run = _a_run_and_memory(a, a_ctx)
    assert Step.objects.filter(context_id=a_ctx, position=1).exists()
    assert Message.objects.filter(context_id=a_ctx, seq=1).exists()
    nobody_run = {"client_id": "no-run", "created_at": a_run["created_at"]}
    a_digest, nobody = keys_digest(A_KEYS), keys_digest({"tenant": "nobody"})
    # A context of B's that holds no run, step or message yet.
    b_keys = {"tenant": "b", "chat": "fresh"}
    b_context = _context_line(b_keys)
    stamp = {"created_at": "2026-01-01T00:00:00+00:00"}
    score = {"type": "score", "name": "ok", "kind": "boolean", "number": 1.0, **stamp}
    label = {"type": "label", "name": "x"}
    comment = {"type": "comment", "text": "x", **stamp}
    checkpoint = {
        "type": "checkpoint",
        "checkpoint_ns": "",
        "checkpoint_id": "cp",
        "checkpoint_type": "msgpack",
        "checkpoint_data": "AA==",
        "metadata_type": "json",
        "metadata_data": "e30=",
    }
    target = MemoryRecord.objects.get(content=A_FACT)
    version = {
        "type": "memory_version",
        "version": 1,
        "content": A_FACT,
        "kind": "fact",
        "status": "live",
        "action": "record",
        "at": "2026-01-01T00:00:00+00:00",
    }
    # A's context named by its digest, against a digest of no context.
    for line in (
        {**score, "run": a_run},
        {**label, "run": a_run},
        {**comment, "run": a_run},
        checkpoint,
        {**checkpoint, "type": "checkpoint_blob", "channel": "c", "version": "1", "blob_type": "t"}
        | {"blob_data": "AA=="},
    ):
        said = _refusals_alike(
            b,
            [HEADER, {**line, "context": a_digest}],
            [HEADER, {**line, "context": nobody}],
            hide=(a_digest[:12], nobody[:12]),
        )
        assert "is referenced before it is defined" in said
    # A's run, step and message named in B's own context, against ones that exist nowhere.
    in_b = {"context": keys_digest(b_keys)}
    # B's own run under the ref of A's (the same client id and instant), without steps: A's step
    # at its position is as absent from it as a position no step has.
    b_run = {"type": "run", **in_b, "ref": a_run, "client_id": "a-run", "task": "t"}
    b_run |= {"created_at": a_run["created_at"]}
    cases = [
        ([], {"run": a_run}, {"run": nobody_run}, "run"),
        ([], {"step": {"run": a_run, "position": 1}}, {"step": {"run": nobody_run, "position": 1}})
        + ("run",),
        ([b_run], {"step": {"run": a_run, "position": 1}}, {"step": {"run": a_run, "position": 9}})
        + ("step",),
        ([], {"message": 1}, {"message": 999}, "message"),
    ]
    for line in (score, label, comment):
        for before, foreign, unknown, what in cases:
            said = _refusals_alike(
                b,
                [HEADER, b_context, *before, {**line, **in_b, **foreign}],
                [HEADER, b_context, *before, {**line, **in_b, **unknown}],
            )
            assert said == f"a {line['type']} refers to a {what} that is not in the backup"
    said = _refusals_alike(
        b,
        [HEADER, b_context, {**checkpoint, **in_b, "run": a_run}],
        [HEADER, b_context, {**checkpoint, **in_b, "run": nobody_run}],
    )
    assert said == "a checkpoint refers to a run that is not in the backup"
    # A's memory by its scope digest and content hash, against a memory of no scope.
    said = _refusals_alike(
        b,
        [
            HEADER,
            b_context,
            {**version, "scope_digest": target.scope_digest, "content_hash": target.content_hash},
        ],
        [HEADER, b_context, {**version, "scope_digest": "0" * 64, "content_hash": "0" * 64}],
    )
    assert said == "a memory version refers to a memory that is not in the backup"
    assert Score.objects.count() == 1 and not Checkpoint.objects.exists()
    assert not Label.objects.exists() and not Comment.objects.exists()
    assert list(MemoryVersion.objects.filter(memory=target).values_list("version", flat=True)) == [
        1
    ]
    # B's export holds none of A's rows.
    body = b"".join(b.get("/api/v1/export").streaming_content).decode()
    assert '"type":"score"' not in body and A_FACT not in body


def test_who_wrote_an_imported_score_or_version_is_the_importer(tenants):
    """A file may claim an operator wrote its scores and memory versions: the rows say the
    importing key, as its memories' `recorded_by` does."""
    from memory_app.models import Label, MemoryVersion, Score

    _, b, _, _ = tenants
    keys = {"tenant": "b", "chat": "claims"}
    digest = keys_digest(keys)
    stamp = "2026-01-01T00:00:00+00:00"
    run_ref = {"client_id": "r1", "created_at": stamp}
    memory = _memory_line(content="B's own fact", scope_digest="0" * 64, context=digest)
    lines = [
        HEADER,
        _context_line(keys),
        {"type": "run", "context": digest, "ref": run_ref, "client_id": "r1", "task": "t"},
        {"type": "score", "context": digest, "run": run_ref, "name": "ok", "kind": "numeric"}
        | {"number": 0.5, "author": "user:admin", "created_at": stamp},
        {"type": "label", "context": digest, "run": run_ref, "name": "x", "author": "user:admin"},
        memory,
        {
            "type": "memory_version",
            "scope_digest": memory["scope_digest"],
            "content_hash": memory["content_hash"],
            "version": 1,
            "content": "B's own fact",
            "kind": "fact",
            "status": "live",
            "action": "approve",
            "actor": "user:admin",
            "at": stamp,
        },
    ]
    response = _import(b, lines)
    assert response.status_code == 200, response.content
    assert {Score.objects.get().author, Label.objects.get().author} == {b.key.actor}
    first, imported = MemoryVersion.objects.order_by("version")
    assert (first.actor, first.api_key_id, first.action) == (b.key.actor, b.key.pk, "approve")
    assert (imported.version, imported.action, imported.actor) == (2, "import", b.key.actor)
