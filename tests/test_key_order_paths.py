"""What an agent writes as JSON comes back with its keys in the order it wrote them, on every
path: REST (messages one by one and through COPY, runs, steps, tool calls, memories), MCP,
export then import, OTLP traces and transcripts. The values below are ones PostgreSQL's `jsonb`
would reorder (it sorts keys shorter first), so a column that sorted them fails here."""

from __future__ import annotations

import functools
import json

import pytest

from memory_app.models import Context, MemoryRecord, Message, Run, ToolCall
from tests.api_helpers import make_key, new_context
from tests.otlp_queue import map_queued

FLAT = {"query": "cats", "k": 3, "lang": "en"}
NESTED = {
    "query": "cats",
    "filters": {"year": 2024, "by": "me", "tags": [{"zz": 1, "a": 2}]},
    "k": 3,
    "options": [{"lang": "en", "k": 1}, "x", None],
}
VALUES = pytest.param(FLAT, id="flat"), pytest.param(NESTED, id="nested")


def same(got, written) -> None:
    assert json.dumps(got) == json.dumps(written)


def _messages_one_by_one(api, value) -> list:
    cid = new_context(api)
    body = {
        "role": "assistant",
        "text": "calling search",
        "content": [
            {"text": "calling search", "type": "text"},
            {"name": "search", "input": value, "type": "tool_use", "id": "c1"},
        ],
        "metadata": value,
    }
    created = api.post(f"/api/v1/contexts/{cid}/messages", body).json()
    fetched = api.get(f"/api/v1/messages/{created['id']}").json()
    listed = api.get(f"/api/v1/contexts/{cid}/messages").json()["items"][0]
    return [
        (m[field], body[field])
        for m in (created, fetched, listed)
        for field in ("content", "metadata")
    ]


def _messages_through_copy(api, value) -> list:
    """A batch large enough for the COPY write path, which writes the JSON text itself."""
    from memory_app.services.messages import COPY_THRESHOLD

    cid = new_context(api)
    batch = [
        {
            "role": "user",
            "text": f"m{n}",
            "metadata": value,
            "content": [{"text": "x", "type": "text"}],
        }
        for n in range(COPY_THRESHOLD)
    ]
    response = api.post(f"/api/v1/contexts/{cid}/messages/batch", {"messages": batch})
    assert response.status_code == 201, response.content
    last = Message.objects.filter(context_id=cid).order_by("-seq").first()
    fetched = api.get(f"/api/v1/messages/{last.pk}").json()
    return [(fetched["metadata"], value), (fetched["content"], batch[-1]["content"])]


def _run_with_step(api, value) -> tuple[dict, dict]:
    cid = new_context(api)
    run = api.post(f"/api/v1/contexts/{cid}/runs", {"task": "find cats", "metadata": value}).json()
    step = {
        "kind": "action",
        "step_number": 1,
        "model_input_messages": [{"role": "user", "content": [{"text": "cats?", "type": "text"}]}],
        "model_output_message": {"role": "assistant", "tool_calls": [{"arguments": value}]},
        "model_output": value,
        "action_output": value,
        "tool_calls": [{"call_id": "c1", "name": "search", "arguments": value, "output": "3"}],
    }
    response = api.post(f"/api/v1/runs/{run['id']}/steps", {"steps": [step]})
    assert response.status_code == 201, response.content
    finished = api.post(
        f"/api/v1/runs/{run['id']}/finish", {"status": "success", "final_answer": value}
    )
    assert finished.status_code == 200, finished.content
    return run, step


def _runs_api(api, value) -> list:
    run, step = _run_with_step(api, value)
    [stored] = api.get(f"/api/v1/runs/{run['id']}/steps").json()["items"]
    detail = api.get(f"/api/v1/steps/{stored['id']}").json()
    got_run = api.get(f"/api/v1/runs/{run['id']}").json()["run"]
    pairs = [(got_run["metadata"], value), (got_run["final_answer"], value)]
    for got in (stored, detail):
        pairs += [
            (got[field], step[field])
            for field in (
                "model_input_messages",
                "model_output_message",
                "model_output",
                "action_output",
            )
        ]
    pairs.append((detail["tool_calls"][0]["arguments"], value))
    return pairs


def _memories(api, value) -> list:
    cid = new_context(api)
    response = api.post(
        "/api/v1/memories", {"context_id": cid, "content": "Ada likes cats", "metadata": value}
    )
    assert response.status_code in (200, 201), response.content
    record = MemoryRecord.objects.get()
    fetched = api.get(f"/api/v1/memories/{record.pk}").json()
    edited = api.patch(f"/api/v1/memories/{record.pk}", {"metadata": value})
    assert edited.status_code == 200, edited.content
    return [(fetched["metadata"], value), (edited.json()["metadata"], value)]


def _semantic_select_walk(api, value) -> list:
    """A semantic search whose walk reads the hits' rows (and the key) in its own statement."""
    import numpy as np
    from django.db import connection
    from django.test.utils import CaptureQueriesContext, override_settings

    from tests.builders import register_models

    register_models(**{"ordered-model": 8})
    cid = new_context(api)
    vectors = np.random.default_rng(7).normal(size=(12, 8)).tolist()
    content = [
        {"text": "x", "type": "text"},
        {"name": "s", "input": value, "type": "tool_use", "id": "c1"},
    ]
    items = [
        {
            "role": "user",
            "text": f"m{n}",
            "metadata": value,
            "content": content,
            "vector": v,
            "vector_model": "ordered-model",
        }
        for n, v in enumerate(vectors)
    ]
    stored = api.post(f"/api/v1/contexts/{cid}/messages/batch", {"messages": items})
    assert stored.status_code == 201, stored.content
    body = {
        "selector": "search",
        "mode": "semantic",
        "k": 3,
        "model": "ordered-model",
        "query_vector": vectors[4],
    }
    with override_settings(AGENTMEMORY_SEARCH_EXACT_THRESHOLD=5):
        for _ in range(2):  # the key verified and the context's size known from here
            assert api.post(f"/api/v1/contexts/{cid}/select", body).status_code == 200
        with CaptureQueriesContext(connection) as queries:
            response = api.post(f"/api/v1/contexts/{cid}/select", body)
    assert response.status_code == 200, response.content
    assert any("JOIN memory_app_message h" in q["sql"] for q in queries.captured_queries)
    hits = [item["message"] for item in response.json()["items"]]
    assert hits and hits[0]["text"] == "m4"
    return [
        (h[field], written)
        for h in hits
        for field, written in [("metadata", value), ("content", content)]
    ]


def _edit_then_undo(api, value) -> list:
    """An operator edits a message's text, then undoes the edit: the metadata the undo puts back
    is the one the audit event kept."""
    from memory_app.audit import Actor
    from memory_app.models import AuditEvent
    from memory_app.services.curation import audit_undo
    from memory_app.services.messages import message_edit

    cid = new_context(api)
    body = {"role": "user", "text": "find cats", "metadata": value}
    created = api.post(f"/api/v1/contexts/{cid}/messages", body).json()
    curator = Actor.system("curator")
    message_edit(message=Message.objects.get(pk=created["id"]), actor=curator, text="find dogs")
    audit_undo(event=AuditEvent.objects.get(action="edit"), actor=curator)
    got = api.get(f"/api/v1/messages/{created['id']}").json()
    assert got["text"] == "find cats"
    return [(got["metadata"], value)]


def _export_then_import(api, value) -> list:
    admin = make_key(scopes=["read", "write", "admin"])
    _messages_one_by_one(api, value)
    _run_with_step(api, value)
    body = b"".join(admin.client.get("/api/v1/export", **admin._headers()).streaming_content)
    Run.objects.all().delete()
    Context.objects.all().delete()
    restored = admin.client.generic(
        "POST", "/api/v1/import", body, content_type="application/x-ndjson", **admin._headers()
    )
    assert restored.status_code == 200, restored.content
    message = Message.objects.get()
    got = api.get(f"/api/v1/messages/{message.pk}").json()
    call = ToolCall.objects.get()
    step = api.get(f"/api/v1/steps/{call.step_id}").json()
    run = api.get(f"/api/v1/runs/{step['run_id']}").json()["run"]
    return [
        (got["metadata"], value),
        (got["content"][1]["input"], value),
        (step["tool_calls"][0]["arguments"], value),
        (step["model_output"], value),
        (run["final_answer"], value),
        (run["metadata"], value),
    ]


def _transcript(api, value) -> list:
    """The smolagents transcript of a run written through the generic API prints the tool call's
    arguments as the agent wrote them."""
    run, _step = _run_with_step(api, value)
    transcript = api.get(f"/api/v1/runs/{run['id']}/messages")
    assert transcript.status_code == 200, transcript.content
    return [(repr(value) in transcript.content.decode(), True)]


def _any_value(value):
    """A JSON value as an OTLP AnyValue: objects as key-value lists, in their order."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    out = AnyValue()
    if isinstance(value, dict):
        for k, v in value.items():
            out.kvlist_value.values.add(key=k).value.CopyFrom(_any_value(v))
    elif isinstance(value, list):
        for v in value:
            out.array_value.values.add().CopyFrom(_any_value(v))
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, str):
        out.string_value = value
    return out  # None: an empty AnyValue


def _structured_body(spans) -> bytes:
    """The export with its JSON text attributes sent as structured values (the GenAI conventions'
    `any` attributes: key-value lists, as an SDK that supports them, or the operation-details
    log event of the latest conventions, sends them)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    request = encode_spans(spans)
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                for kv in span.attributes:
                    if kv.key in ("gen_ai.tool.call.arguments", "gen_ai.output.messages"):
                        kv.value.CopyFrom(_any_value(json.loads(kv.value.string_value)))
    return request.SerializeToString()


def _otlp(api, value, *, split: bool = False, structured: bool = False) -> list:
    """A GenAI-conventions trace whose tool call carries `value` as its arguments; `split`: each
    span in a request of its own, so the run is built from spans stored by earlier requests;
    `structured`: the arguments and the model's output as OTLP key-value lists, not JSON text."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.otel_agents import protobuf_body

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ordered"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("ordered.app")
    ask = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "cats?"}]}])
    call = {"type": "tool_call", "id": "c1", "name": "search", "arguments": value}
    with tracer.start_as_current_span(
        "invoke_agent finder",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.input.messages": ask},
    ):
        with tracer.start_as_current_span(
            "chat",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.input.messages": ask,
                "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [call]}]),
            },
        ):
            pass
        with tracer.start_as_current_span(
            "execute_tool search",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "search",
                "gen_ai.tool.call.id": "c1",
                "gen_ai.tool.call.arguments": json.dumps(value),
                "gen_ai.tool.call.result": "3",
            },
        ):
            pass
    spans = exporter.get_finished_spans()
    for batch in [[span] for span in spans] if split else [spans]:
        response = api.client.generic(
            "POST",
            "/api/v1/traces",
            _structured_body(batch) if structured else protobuf_body(batch),
            content_type="application/x-protobuf",
            **api._headers(),
        )
        assert response.status_code == 200, response.content
    map_queued()
    call = ToolCall.objects.get()
    step = api.get(f"/api/v1/steps/{call.step_id}").json()
    return [(step["tool_calls"][0]["arguments"], value)]


PATHS = {
    "rest-messages": _messages_one_by_one,
    "rest-messages-copy": _messages_through_copy,
    "runs-api": _runs_api,
    "select-semantic-walk": _semantic_select_walk,
    "memories": _memories,
    "export-import": _export_then_import,
    "edit-then-undo": _edit_then_undo,
    "transcript": _transcript,
    "otlp": _otlp,
    "otlp-split": functools.partial(_otlp, split=True),
    "otlp-structured": functools.partial(_otlp, structured=True),
    "otlp-structured-split": functools.partial(_otlp, split=True, structured=True),
}


@pytest.mark.django_db
@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("path", list(PATHS))
def test_json_comes_back_in_the_order_written(path, value):
    api = make_key(scopes=["read", "write"])
    pairs = PATHS[path](api, value)
    assert pairs
    for got, written in pairs:
        same(got, written)


@pytest.mark.django_db
@pytest.mark.parametrize("answer", ["42", "true", "null", '{"b": 1, "a": 2}', '"quoted"', 42, None])
def test_a_string_that_reads_as_json_stays_a_string(answer):
    """The column's JSON is decoded once: a final answer "42" is the string, not the number."""
    api = make_key(scopes=["read", "write"])
    cid = new_context(api)
    run = api.post(f"/api/v1/contexts/{cid}/runs", {"task": "t"}).json()
    api.post(f"/api/v1/runs/{run['id']}/finish", {"status": "success", "final_answer": answer})
    assert Run.objects.get().final_answer == answer
    assert Run.objects.values_list("final_answer", flat=True).get() == answer
    assert api.get(f"/api/v1/runs/{run['id']}").json()["run"]["final_answer"] == answer


@pytest.mark.django_db
def test_filters_on_the_ordered_columns_still_mean_what_they_mean_on_jsonb():
    """The columns keep the text; lookups read them as jsonb (containment, keys, equality)."""
    api = make_key(scopes=["read", "write"])
    _messages_one_by_one(api, NESTED)
    assert Message.objects.filter(metadata__contains={"k": 3, "filters": {"by": "me"}}).count() == 1
    assert Message.objects.filter(metadata__filters__year=2024).count() == 1
    assert Message.objects.filter(metadata__has_key="options").count() == 1
    assert Message.objects.filter(metadata=dict(reversed(NESTED.items()))).count() == 1
    assert Message.objects.filter(metadata__contains={"k": 4}).count() == 0
    assert Message.objects.filter(content__0__type="text").count() == 1
    assert Message.objects.filter(metadata__isnull=False).count() == 1
    assert Message.objects.values_list("metadata__filters__year", flat=True).get() == 2024
    assert Message.objects.values_list("metadata__query", flat=True).get() == "cats"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", VALUES)
def test_mcp_gives_back_what_it_was_given_in_order(asgi_live_server, value):
    from tests.test_mcp import Session, _secret

    mcp = Session(asgi_live_server, _secret())
    cid = mcp.ok("open_context", keys={"user": "ada", "chat": "mcp"})["context"]["id"]
    content = [{"name": "search", "input": value, "type": "tool_use", "id": "c1"}]
    appended = mcp.ok(
        "append_message", context_id=cid, role="assistant", content=content, metadata=value
    )
    same(appended["message"]["metadata"], value)
    same(appended["message"]["content"], content)
    [selected] = mcp.ok("select_context", context_id=cid, selector="window", k=5)["items"]
    same(selected["message"]["metadata"], value)
    same(selected["message"]["content"], content)
    mcp.ok("record_memory", content="Ada likes cats", context_id=cid, metadata=value)
    [memory] = mcp.ok("list_memories", context_id=cid)["items"]
    same(memory["metadata"], value)
    # What the HTTP API reads of it is the same text.
    message = Message.objects.get()
    api = make_key(scopes=["read", "write"])
    same(api.get(f"/api/v1/messages/{message.pk}").json()["metadata"], value)
    # A run written over HTTP, read over MCP.
    run, _step = _run_with_step(api, value)
    read = mcp.ok("read_run", run_id=run["id"])
    same(read["run"]["metadata"], value)
    same(read["run"]["final_answer"], value)
    [step] = read["steps"]["items"]
    same(step["model_output"], value)
    same(step["action_output"], value)
