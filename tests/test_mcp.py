"""The MCP server at /mcp, driven by the official SDK's ClientSession over Streamable HTTP against
the live ASGI site (uvicorn, tests/asgi_server.py): every tool, keys and scopes, tenant
confinement, bad arguments."""

from __future__ import annotations

import json

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from memory_app import audit, auth, memories
from memory_app.models import MemoryRecord, Message
from memory_app.services.memories import memories_record
from tests.aio import run_coroutine
from tests.builders import make_context, make_run

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = {
    "open_context",
    "find_contexts",
    "append_message",
    "select_context",
    "search_memory",
    "record_memory",
    "retrieve_memories",
    "list_memories",
    "memory_status",
    "correct_memory",
    "delete_memory",
    "list_runs",
    "read_run",
    "search_everything",
    "score",
}


def _secret(scopes=("read", "write"), context_keys=None) -> str:
    return auth.apikey_create(
        name="mcp-test", scopes=list(scopes), context_keys=context_keys
    ).secret


class Session:
    """Synchronous façade over one MCP ClientSession: `calls` are (tool, arguments) pairs."""

    def __init__(self, server, secret: str | None):
        self.url = server.url + "/mcp"
        self.headers = {"Authorization": f"Bearer {secret}"} if secret else {}

    def run(self, fn):
        async def go():
            async with httpx.AsyncClient(headers=self.headers, timeout=30) as http:
                async with streamable_http_client(self.url, http_client=http) as (read, write, _):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        return await fn(session)

        return run_coroutine(go())

    def call(self, tool: str, **arguments):
        return self.run(lambda s: s.call_tool(tool, arguments))

    def ok(self, tool: str, **arguments) -> dict:
        result = self.call(tool, **arguments)
        assert not result.isError, result.content[0].text
        # The text block carries the same JSON as the structured content.
        assert json.loads(result.content[0].text) == result.structuredContent
        return result.structuredContent

    def error(self, tool: str, **arguments) -> str:
        result = self.call(tool, **arguments)
        assert result.isError, result.structuredContent
        return result.content[0].text


@pytest.fixture
def mcp(asgi_live_server):
    return Session(asgi_live_server, _secret())


def test_tools_are_listed_with_their_schemas(mcp):
    listed = mcp.run(lambda s: s.list_tools()).tools
    assert {t.name for t in listed} == TOOLS
    by_name = {t.name: t for t in listed}
    for tool in listed:
        assert len(tool.description) > 40, tool.name
        assert tool.inputSchema["type"] == "object"
        assert "ctx" not in tool.inputSchema["properties"]
    append = by_name["append_message"].inputSchema
    assert set(append["required"]) == {"context_id", "role"}
    assert "user" in append["properties"]["role"]["enum"]
    assert by_name["select_context"].inputSchema["properties"]["selector"]["enum"] == [
        "window",
        "token_window",
        "search",
        "composite",
    ]
    assert by_name["read_run"].annotations.readOnlyHint is True
    assert by_name["append_message"].annotations.readOnlyHint is False


def test_conversation_written_selected_and_searched(mcp):
    opened = mcp.ok("open_context", keys={"user": "ada", "chat": "7"}, title="Ada")
    assert opened["created"] is True
    cid = opened["context"]["id"]
    again = mcp.ok("open_context", keys={"chat": "7", "user": "ada"})
    assert again == {"context": again["context"], "created": False}
    assert again["context"]["id"] == cid and again["context"]["title"] == "Ada"

    texts = [
        ("user", "What's the weather in Paris?"),
        ("assistant", "Sunny and 21 degrees in Paris."),
        ("user", "And in Lyon?"),
        ("assistant", "Rainy in Lyon."),
    ]
    for i, (role, text) in enumerate(texts, start=1):
        out = mcp.ok("append_message", context_id=cid, role=role, text=text, client_id=f"m{i}")
        assert out["created"] is True
        assert out["message"]["seq"] == i and out["message"]["text"] == text
    repeat = mcp.ok("append_message", context_id=cid, role="user", text=texts[0][1], client_id="m1")
    assert repeat["created"] is False and repeat["message"]["seq"] == 1
    assert list(
        Message.objects.filter(context_id=cid).order_by("seq").values_list("text", flat=True)
    ) == [t for _, t in texts]

    window = mcp.ok("select_context", context_id=cid, selector="window", k=2)
    assert [i["message"]["text"] for i in window["items"]] == [texts[2][1], texts[3][1]]
    assert window["count"] == 2 and all(i["reason"].startswith("window") for i in window["items"])

    budget = sum(m.token_count for m in Message.objects.filter(context_id=cid, seq__gte=3))
    tokens = mcp.ok(
        "select_context", context_id=cid, selector="token_window", max_tokens=budget + 1
    )
    assert [i["message"]["seq"] for i in tokens["items"]] == [3, 4]
    assert tokens["total_tokens"] == budget

    found = mcp.ok("select_context", context_id=cid, selector="search", query="Lyon", k=5)
    assert {i["message"]["seq"] for i in found["items"]} == {3, 4}

    composite = mcp.ok(
        "select_context",
        context_id=cid,
        selector="composite",
        window={"kind": "window", "k": 1},
        search_k=1,
    )
    last = composite["items"][-1]
    assert last["message"]["seq"] == 3 and last["reason"].startswith("last user message")
    assert any(i["message"]["seq"] == 4 and "search hit" in i["reason"] for i in composite["items"])

    hits = mcp.ok("search_memory", context_id=cid, query="Paris weather", mode="keyword")
    # Any word matches, best first: both words (seq 1) above "Paris" alone (seq 2).
    assert [h["message"]["seq"] for h in hits["hits"]] == [1, 2]
    assert hits["hits"][0]["score"] > hits["hits"][1]["score"]
    assert hits["hits"][0]["rank"] == 1 and "keyword" in hits["hits"][0]["why"]
    anywhere = mcp.ok("search_memory", context_id=cid, query="Paris", k=1)
    assert len(anywhere["hits"]) == 1 and "Paris" in anywhere["hits"][0]["message"]["text"]


def test_long_term_memories_recorded_and_retrieved(mcp):
    context = make_context(keys={"user": "ada", "chat": "9"})
    recorded = mcp.ok(
        "record_memory",
        context_id=context.pk,
        content="Ada prefers tea",
        kind="preference",
        keywords=["tea", "drinks"],
        thinking="asked twice",
    )
    [item] = recorded["items"]
    assert item["created"] is True
    assert item["memory"]["kind"] == "preference" and item["memory"]["recorded_by"].startswith(
        "key:"
    )
    shared = mcp.ok(
        "record_memory",
        scope_keys={"user": "ada"},
        contents=["Ada lives in Paris", "Ada plays chess"],
    )
    assert [i["created"] for i in shared["items"]] == [True, True]
    assert (
        mcp.ok("record_memory", context_id=context.pk, content="Ada prefers tea")["items"][0][
            "created"
        ]
        is False
    )
    assert MemoryRecord.objects.count() == 3

    by_keyword = mcp.ok("retrieve_memories", context_id=context.pk, keywords=["tea"])
    assert [m["content"] for m in by_keyword["items"]] == ["Ada prefers tea"]
    by_query = mcp.ok("retrieve_memories", context_id=context.pk, query="where does Ada live")
    assert "Ada lives in Paris" in [m["content"] for m in by_query["items"]]
    # Another context of the same user sees the shared records, not the context's own.
    other = make_context(keys={"user": "ada", "chat": "10"})
    seen = mcp.ok("retrieve_memories", context_id=other.pk, query="Ada tea chess Paris", limit=10)
    assert {m["content"] for m in seen["items"]} == {"Ada lives in Paris", "Ada plays chess"}


def test_runs_listed_and_read_with_steps_and_tool_calls(mcp):
    context = make_context()
    run = make_run(context=context, steps=4, error_at=(3,))
    runs = mcp.ok("list_runs", context_id=context.pk)
    assert [r["id"] for r in runs["items"]] == [run.pk]
    assert runs["items"][0]["status"] == "success" and runs["items"][0]["error_count"] == 1

    detail = mcp.ok("read_run", run_id=run.pk)
    assert detail["run"]["task"] == "Find the weather in Paris"
    steps = detail["steps"]["items"]
    assert [s["position"] for s in steps] == [1, 2, 3, 4]
    assert steps[0]["kind"] == "task"
    assert steps[2]["error_message"] == "Tool failed at step 3"
    call = steps[1]["tool_calls"][0]
    assert (call["name"], call["arguments"], call["output"]) == (
        "get_weather",
        {"city": "Paris", "step": 1},
        "Sunny, 22C",
    )
    stored = {s.position: s for s in run.steps.all()}
    assert [s["total_tokens"] for s in steps] == [stored[p].total_tokens for p in (1, 2, 3, 4)]

    page = mcp.ok("read_run", run_id=run.pk, steps_limit=2)
    assert [s["position"] for s in page["steps"]["items"]] == [1, 2]
    assert page["steps"]["has_more"] is True
    rest = mcp.ok("read_run", run_id=run.pk, steps_after=page["steps"]["next_cursor"])
    assert [s["position"] for s in rest["steps"]["items"]] == [3, 4]


# --- keys ---------------------------------------------------------------------------------------


def _list_tools_with(server, header: str | None) -> httpx.Response:
    headers = {"Accept": "application/json, text/event-stream"}
    if header is not None:
        headers["Authorization"] = header
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    return httpx.post(server.url + "/mcp", json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("header", [None, "Basic abc", "Bearer"])
def test_no_key_is_401_saying_which_header_to_send(asgi_live_server, header):
    response = _list_tools_with(asgi_live_server, header)
    assert response.status_code == 401
    challenge = response.headers["www-authenticate"]
    # No pointer to OAuth metadata: there is no authorization server to send a client to.
    assert challenge.startswith("Bearer ") and "resource_metadata" not in challenge
    assert "error=" not in challenge  # RFC 6750: no error code when no credentials came
    assert "Authorization: Bearer" in response.json()["error"]["message"]


@pytest.mark.parametrize("token", ["am_000000000000_nope", "not-a-key-at-all"])
def test_a_wrong_key_is_403_saying_the_key_is_wrong(asgi_live_server, token):
    response = _list_tools_with(asgi_live_server, f"Bearer {token}")
    assert response.status_code == 403  # not 401: MCP clients answer a 401 with an OAuth flow
    challenge = response.headers["www-authenticate"]
    assert 'error="invalid_token"' in challenge and "resource_metadata" not in challenge
    assert "API key is wrong or revoked" in response.json()["error"]["message"]


def test_a_revoked_key_cannot_open_a_session(asgi_live_server):
    issued = auth.apikey_create(name="gone", scopes=["read", "write"])
    assert _list_tools_with(asgi_live_server, f"Bearer {issued.secret}").status_code == 200
    auth.apikey_revoke(key=issued.key)
    refused = _list_tools_with(asgi_live_server, f"Bearer {issued.secret}")
    assert refused.status_code == 403
    assert "wrong or revoked" in refused.json()["error"]["message"]
    with pytest.raises(Exception) as caught:  # the SDK raises from its task group
        Session(asgi_live_server, issued.secret).run(lambda s: s.list_tools())
    assert "403" in repr(caught.value) or "Forbidden" in repr(caught.value)


def test_a_key_without_the_scope_gets_a_tool_error_naming_it(asgi_live_server):
    context = make_context(messages=2)
    reader = Session(asgi_live_server, _secret(scopes=("read",)))
    text = reader.error("append_message", context_id=context.pk, role="user", text="hi")
    assert "lacks the 'write' scope" in text
    assert "'write' scope" in reader.error("record_memory", context_id=context.pk, content="x")
    assert "'write' scope" in reader.error("open_context", keys={"user": "x"})
    assert Message.objects.filter(context=context).count() == 2
    assert MemoryRecord.objects.count() == 0
    assert reader.ok("select_context", context_id=context.pk, selector="window", k=1)["count"] == 1

    writer = Session(asgi_live_server, _secret(scopes=("write",)))
    assert "lacks the 'read' scope" in writer.error(
        "select_context", context_id=context.pk, selector="window", k=1
    )
    assert "'read' scope" in writer.error("read_run", run_id=1)
    assert writer.ok("append_message", context_id=context.pk, role="user", text="hi")["created"]

    admin = Session(asgi_live_server, _secret(scopes=("admin",)))
    assert admin.ok("search_memory", context_id=context.pk, query="hi")["hits"]


def test_another_tenants_ids_look_unknown(asgi_live_server):
    mine = make_context(keys={"tenant": "acme", "user": "ada"}, messages=2)
    theirs = make_context(keys={"tenant": "globex", "user": "bob"}, messages=2)
    their_run = make_run(context=theirs, steps=2)
    memories_record(
        scope=memories.Scope(keys={"tenant": "globex"}),
        items=[{"content": "globex secret"}],
        actor=audit.Actor.system("test"),
    )
    acme = Session(asgi_live_server, _secret(context_keys={"tenant": "acme"}))

    unknown = 10**12
    for tool, args in [
        ("select_context", {"selector": "window", "k": 5}),
        ("search_memory", {"query": "message"}),
        ("append_message", {"role": "user", "text": "sneaky"}),
        ("retrieve_memories", {"query": "secret"}),
        ("list_runs", {}),
        ("record_memory", {"content": "sneaky"}),
    ]:
        foreign = acme.error(tool, context_id=theirs.pk, **args)
        absent = acme.error(tool, context_id=unknown, **args)
        assert f"context {theirs.pk} not found" in foreign
        assert foreign.replace(str(theirs.pk), "N") == absent.replace(str(unknown), "N")
    assert f"run {their_run.pk} not found" in acme.error("read_run", run_id=their_run.pk)
    assert "may only use contexts whose keys contain" in acme.error(
        "open_context", keys={"tenant": "globex", "user": "eve"}
    )
    assert "outside this API key's context keys" in acme.error(
        "record_memory", scope_keys={"tenant": "globex"}, content="sneaky"
    )
    assert Message.objects.filter(context=theirs).count() == 2
    assert not MemoryRecord.objects.filter(content="sneaky").exists()
    # Its own tenant works, and recalls nothing of the other tenant's.
    assert acme.ok("select_context", context_id=mine.pk, selector="window", k=5)["count"] == 2
    assert acme.ok("retrieve_memories", context_id=mine.pk, query="secret")["items"] == []


# --- bad arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "says"),
    [
        ("append_message", {"role": "wizard", "text": "x"}, "role"),
        ("append_message", {"role": "user", "text": "nul \x00 byte"}, "NUL"),
        ("append_message", {"role": "user", "text": 42}, "text"),
        ("append_message", {"role": "user", "metadata": {"k": "\x00"}}, "NUL"),
        ("append_message", {"role": "user", "text": "x", "run_id": 10**12}, "not found"),
        ("append_message", {"role": "user", "content": [{"type": "nope"}]}, "content"),
        ("select_context", {"selector": "window"}, "needs k"),
        ("select_context", {"selector": "token_window"}, "needs max_tokens"),
        ("select_context", {"selector": "window", "k": 5000}, "k"),
        (
            "select_context",
            {"selector": "token_window", "max_tokens": 9, "tokenizer": "nope"},
            "nope",
        ),
        ("select_context", {"selector": "composite", "window": {"kind": "moon"}}, "window.kind"),
        ("search_memory", {"query": ""}, "query"),
        ("search_memory", {"query": "x", "mode": "psychic"}, "mode"),
        ("record_memory", {"content": "x", "kind": "gossip"}, "kind"),
        ("record_memory", {"content": ""}, "content"),
        ("retrieve_memories", {"limit": 0}, "limit"),
    ],
)
def test_bad_arguments_are_clear_tool_errors_and_write_nothing(mcp, tool, args, says):
    context = make_context(messages=3)
    text = mcp.error(tool, context_id=context.pk, **args)
    assert says in text, text
    assert Message.objects.filter(context=context).count() == 3
    assert MemoryRecord.objects.count() == 0


def test_a_client_id_with_different_content_is_a_conflict(mcp):
    context = make_context()
    mcp.ok("append_message", context_id=context.pk, role="user", text="hello", client_id="c1")
    text = mcp.error(
        "append_message", context_id=context.pk, role="user", text="hullo", client_id="c1"
    )
    assert "already exists with different content" in text and "hullo" in text
    assert list(Message.objects.filter(context=context).values_list("text", flat=True)) == ["hello"]


def test_wrong_argument_types_and_unknown_ids(mcp):
    assert "context_id" in mcp.error("list_runs", context_id="seven")
    assert "run_id" in mcp.error("read_run", run_id=0)
    assert "run 999999 not found" in mcp.error("read_run", run_id=999999)


def test_a_body_over_the_limit_is_413_and_writes_nothing(asgi_live_server, settings):
    context = make_context()
    headers = {
        "Authorization": f"Bearer {_secret()}",
        "Accept": "application/json, text/event-stream",
    }
    text = "x" * (settings.MAX_REQUEST_BODY_BYTES + 1)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "append_message",
            "arguments": {"context_id": context.pk, "role": "user", "text": text},
        },
    }
    response = httpx.post(asgi_live_server.url + "/mcp", json=body, headers=headers, timeout=60)
    assert response.status_code == 413
    assert not Message.objects.filter(context=context).exists()


def test_a_host_outside_allowed_hosts_is_refused(asgi_live_server):
    response = httpx.post(
        asgi_live_server.url + "/mcp", json={}, headers={"Host": "evil.example"}, timeout=60
    )
    assert response.status_code == 400


# --- malformed bodies and response headers ------------------------------------------------------


def _raw_post(server, body: bytes, secret: str | None = None) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {secret or _secret()}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    return httpx.post(server.url + "/mcp", content=body, headers=headers, timeout=60)


def _append_call(context_id: int, arguments: str) -> bytes:
    return (
        b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": '
        b'{"name": "append_message", "arguments": ' + (arguments % context_id).encode() + b"}}"
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "x": "\xff\xfe"}',
        b"[" * 10_000 + b"]" * 10_000,
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": '
        + b'{"a": ' * 10_000
        + b"1"
        + b"}" * 10_001,
    ],
    ids=["invalid-utf8", "deep-array", "deep-object"],
)
def test_a_body_that_is_not_json_is_a_parse_error(asgi_live_server, body):
    response = _raw_post(asgi_live_server, body)
    assert response.status_code == 400
    answer = response.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    assert answer["error"]["code"] == -32700  # JSON-RPC "Parse error"
    # The server still answers afterwards (the transport was not broken by the bad body).
    listed = _raw_post(asgi_live_server, b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}')
    assert listed.status_code == 200 and listed.json()["result"]["tools"]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_numbers_json_cannot_hold_are_refused_not_made_null(asgi_live_server, number):
    context = make_context()
    arguments = (
        '{"context_id": %d, "role": "user", "text": "hi", "metadata": {"x": ' + number + "}}"
    )
    finite = _raw_post(asgi_live_server, _append_call(context.pk, arguments.replace(number, "1.5")))
    assert finite.status_code == 200 and not finite.json()["result"]["isError"]  # the same call
    Message.objects.filter(context=context).delete()
    response = _raw_post(asgi_live_server, _append_call(context.pk, arguments))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700
    assert not Message.objects.filter(context=context).exists()


def test_mcp_responses_carry_the_site_security_headers(asgi_live_server, client):
    page = client.get("/healthz")
    listed = _raw_post(asgi_live_server, b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}')
    refused = httpx.post(asgi_live_server.url + "/mcp", json={}, timeout=60)  # 401, no key
    bad = _raw_post(asgi_live_server, b"{")
    assert (listed.status_code, refused.status_code, bad.status_code) == (200, 401, 400)
    for response in (listed, refused, bad):
        for header in ("X-Content-Type-Options", "Referrer-Policy", "X-Frame-Options"):
            assert response.headers[header] == page.headers[header], header
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


def test_a_reviewed_keys_proposal_is_not_recalled_and_its_status_is_read(asgi_live_server):
    issued = auth.apikey_create(name="reviewed", scopes=["read", "write"])
    issued.key.memory_review = "proposed"
    issued.key.save(update_fields=["memory_review"])
    mcp = Session(asgi_live_server, issued.secret)
    context = make_context(keys={"user": "ada", "chat": "11"})
    [item] = mcp.ok("record_memory", context_id=context.pk, content="Ada sails")["items"]
    assert item["created"] is True and item["memory"]["status"] == "proposed"
    assert item["near_copy"] is None
    pk = item["memory"]["id"]
    assert mcp.ok("retrieve_memories", context_id=context.pk, query="Ada sails")["items"] == []
    assert mcp.ok("list_memories", context_id=context.pk)["items"] == []
    assert mcp.ok("list_memories")["items"] == []
    status = mcp.ok("memory_status", memory_ids=[pk, 987_654])
    assert [m["status"] for m in status["items"]] == ["proposed"]
    assert status["missing"] == [987_654]
    # A reviewed key cannot change a live memory (that would bypass the review).
    live = MemoryRecord.objects.create(
        context=context, scope_digest="d", content="Ada rows", content_hash="h"
    )
    assert "reviewed" in mcp.error("correct_memory", memory_id=live.pk, content="Ada swims")
