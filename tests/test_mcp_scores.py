"""The MCP `score` tool over the live ASGI site: the key is the author, a repeated client id with
the same content answers the stored score, another tenant's run, step or message is "not
found" as an unknown id is, and a key without 'write' is refused."""

from __future__ import annotations

import pytest

from memory_app.models import AuditEvent, Message, Score, Step
from tests.builders import make_context, make_run
from tests.test_mcp import Session, _secret

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_score_tool_is_idempotent_by_client_id_and_authored_by_the_key(asgi_live_server):
    run = make_run(context=make_context(keys={"tenant": "acme"}), steps=2)
    secret = _secret(context_keys={"tenant": "acme"})
    mcp = Session(asgi_live_server, secret)
    prefix = secret.split("_")[1]
    first = mcp.ok(
        "score",
        target="run",
        target_id=run.pk,
        name="correct",
        kind="boolean",
        value=True,
        client_id="judge-1",
    )
    assert first["created"] is True
    assert first["score"]["author"] == f"key:{prefix}" and first["score"]["value"] is True
    again = mcp.ok(
        "score",
        target="run",
        target_id=run.pk,
        name="correct",
        kind="boolean",
        value=True,
        client_id="judge-1",
    )
    assert again == {"score": first["score"], "created": False}
    conflict = mcp.error(
        "score",
        target="run",
        target_id=run.pk,
        name="correct",
        kind="boolean",
        value=False,
        client_id="judge-1",
    )
    assert "already exists with different content" in conflict
    # Clients that send every value as text are understood by the score's kind.
    step = Step.objects.get(run=run, position=2)
    quality = mcp.ok(
        "score", target="step", target_id=step.pk, name="quality", kind="numeric", value="0.75"
    )
    assert quality["score"]["value"] == 0.75 and quality["score"]["target"] == "step"
    assert "numeric score" in mcp.error(
        "score", target="run", target_id=run.pk, name="q", kind="numeric", value="high"
    )
    assert Score.objects.count() == 2
    assert AuditEvent.objects.filter(action="score_add", actor=f"key:{prefix}").count() == 2


def test_the_score_tool_is_confined_to_the_keys_contexts(asgi_live_server):
    theirs = make_context(keys={"tenant": "globex"}, messages=1)
    their_run = make_run(context=theirs, steps=2)
    their_step = Step.objects.get(run=their_run, position=1)
    their_message = Message.objects.filter(context=theirs).first()
    acme = Session(asgi_live_server, _secret(context_keys={"tenant": "acme"}))
    unknown = 10**12
    for target, ident in (
        ("run", their_run.pk),
        ("step", their_step.pk),
        ("message", their_message.pk),
    ):
        args = {"target": target, "name": "correct", "kind": "boolean", "value": True}
        foreign = acme.error("score", target_id=ident, **args)
        absent = acme.error("score", target_id=unknown, **args)
        assert f"{target} {ident} not found" in foreign
        assert foreign.replace(str(ident), "N") == absent.replace(str(unknown), "N")
    reader = Session(asgi_live_server, _secret(scopes=("read",)))
    refused = reader.error(
        "score", target="run", target_id=their_run.pk, name="c", kind="boolean", value=True
    )
    assert "lacks the 'write' scope" in refused
    assert not Score.objects.exists()
