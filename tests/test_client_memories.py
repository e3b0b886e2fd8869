"""The Python client's long-term memory tools against a live server, and its retry/backoff
against a local stand-in server that fails on purpose."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from memory_app import auth
from memory_app.client import ApiError, MemoryClient, ServerUnreachable
from memory_app.client.agentscope import ServerLongTermMemory
from memory_app.client.smolagents import import_run
from memory_app.models import AuditEvent, MemoryRecord, Message, Run, Step
from tests.aio import run_coroutine
from tests.smol_agents import run_agent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def secret(live_server):
    return auth.apikey_create(name="test", scopes=("read", "write")).secret


@pytest.fixture
def client(live_server, secret):
    with MemoryClient(live_server.url, secret, retries=1, backoff=0.01) as mc:
        yield mc


def text_of(response) -> str:
    [block] = response.content
    return block["text"]


def run(coro):
    return run_coroutine(coro)


# --- AgentScope long-term memory tools over HTTP -------------------------------------------------


def test_record_to_memory_and_retrieve_from_memory_with_a_limit_per_keyword(client):
    ctx = client.context(keys={"user": "ada", "chat": "1"})
    ltm = ServerLongTermMemory(client, ctx["id"])
    recorded = run(
        ltm.record_to_memory(
            thinking="the user told me",
            content=["Ada drinks green tea", "Ada drinks black tea", "Ada lives in Paris"],
        )
    )
    assert "3 new" in text_of(recorded)
    stored = MemoryRecord.objects.filter(context_id=ctx["id"])
    assert stored.count() == 3 and {r.thinking for r in stored} == {"the user told me"}
    # One request for the three: one audit event recording them together.
    assert AuditEvent.objects.filter(action="record", target_type="memoryrecord").count() == 1

    again = run(ltm.record_to_memory(thinking="again", content=["Ada lives in  Paris"]))
    assert "0 new, 1 already known" in text_of(again) and stored.count() == 3

    one_each = text_of(run(ltm.retrieve_from_memory(keywords=["tea", "Paris"], limit=1)))
    lines = one_each.splitlines()
    assert len(lines) == 2 and "tea" in lines[0] and lines[1] == "Ada lives in Paris"
    both_teas = text_of(run(ltm.retrieve_from_memory(keywords=["tea"], limit=5))).splitlines()
    assert sorted(both_teas) == ["Ada drinks black tea", "Ada drinks green tea"]
    assert text_of(run(ltm.retrieve_from_memory(keywords=["chess"]))) == ""


def test_key_subset_memories_are_recalled_from_another_context_of_that_user(client):
    chat1 = client.context(keys={"user": "ada", "chat": "1"})
    chat2 = client.context(keys={"user": "ada", "chat": "2"})
    bob = client.context(keys={"user": "bob"})
    run(
        ServerLongTermMemory(
            client, chat1["id"], kind="preference", scope_keys={"user": "ada"}
        ).record_to_memory(thinking="", content=["Ada prefers window seats"])
    )
    found = client.retrieve_memories(context_id=chat2["id"], keywords=["window"])["items"]
    assert [(i["content"], i["kind"], i["scope_keys"]) for i in found] == [
        ("Ada prefers window seats", "preference", {"user": "ada"})
    ]
    assert (
        text_of(run(ServerLongTermMemory(client, bob["id"]).retrieve_from_memory(["window"]))) == ""
    )


def test_a_reviewed_keys_proposals_are_not_recalled_until_a_curator_approves_them(live_server):
    from agentscope.message import Msg

    from memory_app.audit import Actor
    from memory_app.services.memory_review import proposals_approve
    from tests.builders import make_user

    issued = auth.apikey_create(name="reviewed", scopes=("read", "write"))
    issued.key.memory_review = "proposed"
    issued.key.save(update_fields=["memory_review"])
    with MemoryClient(live_server.url, issued.secret, retries=0) as mc:
        ctx = mc.context(keys={"user": "ada", "chat": "reviewed"})
        ltm = ServerLongTermMemory(mc, ctx["id"])
        recorded = text_of(run(ltm.record_to_memory(thinking="", content=["Ada drinks green tea"])))
        assert "1 new" in recorded and "1 waiting for review" in recorded
        assert text_of(run(ltm.retrieve_from_memory(keywords=["tea"]))) == ""
        assert run(ltm.retrieve(Msg("user", "green tea", "user"))) == ""
        [proposal] = MemoryRecord.objects.filter(context_id=ctx["id"])
        proposals_approve([proposal.pk], actor=Actor.for_user(make_user(role="curator")))
        assert text_of(run(ltm.retrieve_from_memory(keywords=["tea"]))) == "Ada drinks green tea"
        assert run(ltm.retrieve(Msg("user", "green tea", "user"))) == "Ada drinks green tea"


def test_tool_errors_come_back_as_text_with_the_server_detail(client):
    ctx = client.context(keys={"user": "ada"})
    ltm = ServerLongTermMemory(client, ctx["id"])
    bad_limit = text_of(run(ltm.retrieve_from_memory(keywords=["tea"], limit=0)))
    assert bad_limit.startswith("Error retrieving memory: 422") and "limit" in bad_limit
    gone = text_of(run(ServerLongTermMemory(client, 10**9).record_to_memory("", ["x"])))
    assert gone.startswith("Error recording memory: 404")


# --- retries and backoff -----------------------------------------------------------------------


class StandIn:
    """A local HTTP server answering 503 to the first `failures` requests, then forwarding each
    request to `upstream` (the live server) and relaying its answer."""

    def __init__(self, upstream: str, failures: int):
        self.upstream = upstream
        self.failures = failures
        self.seen: list[tuple[str, str, bytes]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stand_in.seen.append((self.command, self.path, body))
                if len(stand_in.seen) <= stand_in.failures:
                    self._send(503, json.dumps({"detail": "warming up, try again"}).encode())
                    return
                forwarded = httpx.request(
                    self.command,
                    stand_in.upstream + self.path,
                    content=body,
                    headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
                )
                self._send(forwarded.status_code, forwarded.content)

            def _send(self, status: int, payload: bytes):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = _handle

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_a_write_with_a_client_id_is_retried_through_two_503s_and_stored_once(
    live_server, client, secret
):
    ctx = client.context(keys={"user": "ada", "chat": "retry"})
    with StandIn(live_server.url, failures=2) as stand_in:
        with MemoryClient(stand_in.url, secret, retries=3, backoff=0.001) as flaky:
            message = flaky.append_message(ctx["id"], role="user", text="hello", client_id="m-1")
    assert message["text"] == "hello"
    assert len(stand_in.seen) == 3
    assert {json.loads(body)["client_id"] for _, _, body in stand_in.seen} == {"m-1"}
    assert Message.objects.filter(context_id=ctx["id"]).count() == 1


def test_giving_up_on_503_raises_with_the_server_detail(live_server, secret):
    with StandIn(live_server.url, failures=100) as stand_in:
        with MemoryClient(stand_in.url, secret, retries=2, backoff=0.001) as flaky:
            with pytest.raises(ApiError) as caught:
                flaky.record_memory(context_id=1, content="x")
    assert caught.value.status == 503 and caught.value.detail == "warming up, try again"
    assert "warming up" in str(caught.value)
    assert len(stand_in.seen) == 3  # the first try and two retries


def test_a_refused_connection_is_retried_then_raises_server_unreachable():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with MemoryClient(f"http://127.0.0.1:{port}", "am_x", retries=3, backoff=0.001) as mc:
        with pytest.raises(ServerUnreachable) as caught:
            mc.append_message(1, role="user", text="hi", client_id="m-1")
    assert "no answer after 4 attempts" in str(caught.value)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert time.monotonic() - started < 5


# --- exactly-once writes through a dropped answer ------------------------------------------------


class DropsOneAnswer(httpx.BaseTransport):
    """Sends each request to the real server; for the first POST after `arm()`, reads the server's
    answer and throws it away, raising ReadError as a connection cut after the commit would."""

    def __init__(self):
        self.inner = httpx.HTTPTransport()
        self.armed = False
        self.bodies: list[bytes] = []

    def arm(self) -> None:
        self.armed, self.bodies = True, []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method == "POST" and self.armed:
            self.bodies.append(request.content)
            if len(self.bodies) == 1:
                response.read()
                response.close()
                raise httpx.ReadError(
                    "connection reset after the request was sent", request=request
                )
        return response

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def dropping(live_server, secret):
    transport = DropsOneAnswer()
    with MemoryClient(live_server.url, secret, retries=2, backoff=0.001, transport=transport) as mc:
        yield mc, transport


def _sent_twice(transport: DropsOneAnswer) -> list[dict]:
    """The two attempts' bodies: the first (answer dropped) and the retry."""
    first, retry = (json.loads(b) for b in transport.bodies)
    assert first == retry  # the retry repeats the write, client ids included
    return first


def test_a_message_without_client_id_is_stored_once_when_the_answer_is_dropped(dropping):
    mc, transport = dropping
    ctx = mc.context(keys={"user": "ada", "chat": "dropped"})
    transport.arm()
    message = mc.append_message(ctx["id"], role="user", text="hello")
    assert list(Message.objects.filter(context_id=ctx["id"]).values_list("text", flat=True)) == [
        "hello"
    ]
    sent = _sent_twice(transport)
    assert sent["client_id"] and message["client_id"] == sent["client_id"]


def test_a_batch_without_client_ids_is_stored_once_when_the_answer_is_dropped(dropping):
    mc, transport = dropping
    ctx = mc.context(keys={"user": "ada", "chat": "dropped-batch"})
    given = [
        {"role": "user", "text": "one"},
        {"role": "assistant", "text": "two", "client_id": "mine"},
        {"role": "user", "text": "three"},
    ]
    transport.arm()
    out = mc.append_messages(ctx["id"], given)
    stored = Message.objects.filter(context_id=ctx["id"]).order_by("seq")
    assert [m.text for m in stored] == ["one", "two", "three"]
    ids = [m["client_id"] for m in _sent_twice(transport)["messages"]]
    assert ids[1] == "mine" and ids[0] and ids[2] and len(set(ids)) == 3
    assert [m["client_id"] for m in out["messages"]] == ids
    assert "client_id" not in given[0]  # the caller's dicts are left as they were


def test_a_run_and_its_steps_without_client_ids_are_stored_once_when_the_answer_is_dropped(
    dropping,
):
    mc, transport = dropping
    ctx = mc.context(keys={"user": "ada", "chat": "dropped-run"})
    transport.arm()
    run = mc.create_run(ctx["id"], task="weather")
    assert Run.objects.filter(context_id=ctx["id"]).count() == 1
    assert _sent_twice(transport)["client_id"] == run["client_id"]
    transport.arm()
    mc.append_steps(
        run["id"], [{"kind": "task", "task": "weather"}, {"kind": "action", "step_number": 1}]
    )
    assert Step.objects.filter(run_id=run["id"]).count() == 2
    assert all(s["client_id"] for s in _sent_twice(transport)["steps"])


def test_a_smolagents_import_without_client_id_is_stored_once_when_the_answer_is_dropped(dropping):
    mc, transport = dropping
    ctx = mc.context(keys={"user": "ada", "chat": "dropped-import"})
    agent = run_agent("tool_calling")
    transport.arm()
    out = import_run(mc, ctx["id"], agent)
    assert list(Run.objects.filter(context_id=ctx["id"]).values_list("pk", flat=True)) == [
        out["run_id"]
    ]
    assert _sent_twice(transport)["client_id"]


def test_each_write_gets_a_client_id_of_its_own(live_server, secret):
    with MemoryClient(live_server.url, secret) as mc:
        ctx = mc.context(keys={"user": "ada", "chat": "fresh-ids"})
        first = mc.append_message(ctx["id"], role="user", text="same")
        second = mc.append_message(ctx["id"], role="user", text="same")
    assert first["client_id"] != second["client_id"] and first["seq"] + 1 == second["seq"]
