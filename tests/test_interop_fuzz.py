"""Fuzz the framework import endpoints with types swapped: real smolagents and
AgentScope payloads with one to three values, anywhere in them, replaced by a value of another
JSON type. Whatever arrives, the answer is a documented JSON status, never a 5xx."""

import json

import pytest
from agentscope.memory import InMemoryMemory
from agentscope.message import Msg, TextBlock, ToolUseBlock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_app.services.contexts import context_get_or_create
from memory_app.services.runs import run_create
from tests.aio import run_coroutine
from tests.api_helpers import make_key
from tests.builders import backup_file
from tests.smol_agents import jsonable, run_agent

pytestmark = pytest.mark.django_db

# Every JSON type, and the awkward values of each: huge and negative numbers, empty containers,
# numbers as strings (the reported 500), NUL-free text.
swapped = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "1", "1795297221.5", "true", "null", "[]", "{}"]),
    st.text(max_size=8),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["id", "type", "text", "name"]), st.integers(0, 3), max_size=2),
)


def paths(value, prefix=()):
    """Every place in a JSON value: object members and array items, containers included."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*prefix, k))
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((*prefix, i))
            out += paths(v, (*prefix, i))
    return out


def replaced(value, changes):
    value = json.loads(json.dumps(value))
    for path, new in changes:
        target = value
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = new
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change replaced a container on this path
    return value


def _smol_steps():
    return jsonable(run_agent("tool_calling").memory.get_full_steps()[:4])


def _agentscope_state():
    async def build():
        mem = InMemoryMemory()
        await mem.add(Msg("user", "What's the weather in Paris?", "user"))
        await mem.add(
            Msg(
                "Friday",
                [
                    TextBlock(type="text", text="Checking."),
                    ToolUseBlock(
                        type="tool_use", id="c1", name="get_weather", input={"city": "Paris"}
                    ),
                ],
                "assistant",
            ),
            marks=["hint"],
        )
        await mem.update_compressed_summary("<summary>weather</summary>")
        return mem.state_dict()

    return json.loads(json.dumps(run_coroutine(build())))


SMOL_RUN = {"steps": _smol_steps(), "system_prompt": "You are helpful.", "client_id": "fuzz"}
SMOL_LIVE = {"start_index": 1, "steps": SMOL_RUN["steps"]}
AS_STATE = {"state": _agentscope_state(), "replace": False}
AS_ADD = {
    "msgs": [m for m, _ in AS_STATE["state"]["content"]],
    "marks": ["hint"],
    "allow_duplicates": True,
}
AS_MARKS = {"new_mark": "compressed", "old_mark": "hint", "msg_ids": ["a", "b"]}

ENDPOINTS = {
    "smolagents import": (
        "/api/v1/contexts/{context}/smolagents/runs",
        SMOL_RUN,
        {200, 201, 409, 422},
    ),
    "smolagents live steps": ("/api/v1/runs/{run}/smolagents/steps", SMOL_LIVE, {200, 409, 422}),
    "agentscope state": ("/api/v1/contexts/{context}/agentscope/state", AS_STATE, {200, 409, 422}),
    "agentscope add": ("/api/v1/contexts/{context}/agentscope/add", AS_ADD, {200, 409, 422}),
    "agentscope marks": (
        "/api/v1/contexts/{context}/agentscope/update_messages_mark",
        AS_MARKS,
        {200, 422},
    ),
}


_fresh = iter(range(10**9))


def _target(name):
    """The key, a function giving the URL on a new context (and run) for each request, so no
    request is answered from an earlier one's stored rows (an idempotent repeat writes nothing
    and would hide a value the database refuses), the body and the allowed statuses."""
    template, body, allowed = ENDPOINTS[name]
    api = make_key(scopes=["read", "write"])

    def url():
        context, _ = context_get_or_create(keys={"test": "interop-fuzz", "n": next(_fresh)})
        run, _ = run_create(context=context, client_id="live", task="live")
        return template.format(context=context.pk, run=run.pk)

    return api, url, body, allowed


# One of each JSON type, and numbers a column cannot hold.
SWEEP = [None, True, -1, 2**70, 1.5, "x", [], {"x": 1}]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENDPOINTS))
def test_every_typed_field_swapped_for_every_type_is_a_json_answer(name):
    """Systematic: each place outside the free-form model input, each wrong type in turn."""
    api, url, body, allowed = _target(name)
    failures = []
    seen = set()
    for path in paths(body):
        if "model_input_messages" in path:
            continue
        for value in SWEEP:
            response = api.post(url(), replaced(body, [(path, value)]))
            seen.add(response.status_code)
            if response.status_code not in allowed or not response["Content-Type"].startswith(
                "application/json"
            ):
                failures.append((path, value, response.status_code, response.content[:200]))
    assert failures == []
    assert 422 in seen


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENDPOINTS))
def test_swapped_types_never_give_a_server_error(name):
    """Random: one to three swaps anywhere, the model input's depths included."""
    api, url, body, allowed = _target(name)
    where = paths(body)
    # Half the swaps land outside the (deep, free-form) model input, where the typed fields are.
    typed = [p for p in where if "model_input_messages" not in p]
    place = st.one_of(st.sampled_from(typed), st.sampled_from(where))
    seen: set[int] = set()

    @given(changes=st.lists(st.tuples(place, swapped), min_size=1, max_size=3))
    @settings(
        max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    def check(changes):
        response = api.post(url(), replaced(body, changes))
        assert response.status_code in allowed, (
            changes,
            response.status_code,
            response.content[:300],
        )
        assert response["Content-Type"].startswith("application/json"), response.content[:300]
        seen.add(response.status_code)

    check()
    assert 422 in seen  # the swaps did reach the checks


def _backup_lines(api):
    """A real backup of one context: a run with a step and a tool call, a message of that run,
    a context memory from that message and a key-subset memory."""
    from tests.api_helpers import new_context

    cid = new_context(api, {"test": "backup-fuzz"})
    run = api.post(f"/api/v1/contexts/{cid}/runs", {"task": "t", "client_id": "r"}).json()
    step = {
        "kind": "action",
        "step_number": 1,
        "tool_calls": [{"name": "f", "arguments": {"a": 1}}],
    }
    assert api.post(f"/api/v1/runs/{run['id']}/steps", {"steps": [step]}).status_code == 201
    message = api.post(
        f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "hello", "run_id": run["id"]}
    ).json()
    api.post(
        "/api/v1/memories",
        {"context_id": cid, "content": "Ann likes maps", "source_message_id": message["id"]},
    )
    api.post(
        "/api/v1/memories", {"scope_keys": {"test": "backup-fuzz"}, "content": "a subset memory"}
    )
    body = b"".join(api.get("/api/v1/export", {"context_id": cid}).streaming_content)
    *records, trailer = [json.loads(line) for line in body.splitlines()]
    assert trailer["type"] == "trailer"
    return records  # each changed body is signed again (`backup_file`): its lines are the test


@pytest.mark.slow
def test_backup_import_with_every_field_swapped_for_every_type_is_a_json_answer():
    """POST /import is an import endpoint too: a string for a number (a seq, a timestamp, a
    position) reached the database as an HTML 500, a negative one as a 409 'retry'."""
    from memory_app.models import Context

    api = make_key(scopes=["read", "write", "admin"])
    lines = _backup_lines(api)
    assert [line["type"] for line in lines] == [
        "header",
        "context",
        "run",
        "step",
        "message",
        "memory",
        "memory",
        # An admin key's export carries each memory's history too.
        "memory_version",
        "memory_version",
    ]
    failures, seen = [], set()
    for i, line in enumerate(lines[1:], start=1):
        for path in paths(line):
            for value in SWEEP:
                Context.objects.all().delete()  # a fresh store: nothing is skipped as known
                body = [*lines[:i], replaced(line, [(path, value)]), *lines[i + 1 :]]
                response = api.post("/api/v1/import", raw=backup_file(body))
                seen.add(response.status_code)
                if response.status_code not in {200, 403, 422} or not response[
                    "Content-Type"
                ].startswith("application/json"):
                    failures.append(
                        (line["type"], path, value, response.status_code, response.content[:200])
                    )
    assert failures == []
    assert {200, 422} <= seen
