"""Runs, steps and tool calls over HTTP: create, append steps, finish, read back, idempotency."""

import pytest

from memory_app.models import Step, ToolCall
from tests.api_helpers import make_key, new_context

pytestmark = pytest.mark.django_db

ACTION = {
    "client_id": "s1",
    "kind": "action",
    "step_number": 1,
    "model_input_messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    "model_output_message": {"role": "assistant", "content": "call weather"},
    "model_output": "call weather",
    "code_action": "weather(city='Paris')",
    "observations": "sunny",
    "action_output": {"temp": 21},
    "error_type": "AgentToolCallError",
    "error_message": "retry",
    "start_time": 100.0,
    "end_time": 101.5,
    "input_tokens": 10,
    "output_tokens": 5,
    "is_final_answer": False,
    "payload": {"raw": True},
    "tool_calls": [
        {
            "call_id": "c1",
            "name": "weather",
            "arguments": {"city": "Paris"},
            "output": "sunny",
            "success": True,
            "duration": 0.2,
        },
        {"call_id": "c2", "name": "final_answer", "arguments": "done"},
    ],
}


@pytest.fixture
def api():
    return make_key(scopes=["read", "write"])


@pytest.fixture
def run(api):
    cid = new_context(api)
    body = {
        "client_id": "r1",
        "task": "weather?",
        "system_prompt": "be nice",
        "agent_name": "bot",
        "framework": "smolagents",
        "metadata": {"model": "m"},
    }
    response = api.post(f"/api/v1/contexts/{cid}/runs", body)
    assert response.status_code == 201
    return response.json()


def test_create_run_is_idempotent_by_client_id(api, run):
    cid = run["context_id"]
    same = {
        "client_id": "r1",
        "task": "weather?",
        "system_prompt": "be nice",
        "agent_name": "bot",
        "framework": "smolagents",
        "metadata": {"model": "m"},
    }
    again = api.post(f"/api/v1/contexts/{cid}/runs", same)
    assert again.status_code == 200 and again.json()["id"] == run["id"]
    conflict = api.post(f"/api/v1/contexts/{cid}/runs", same | {"task": "other"})
    assert conflict.status_code == 409
    assert conflict.json()["differences"]["task"] == {"stored": "weather?", "sent": "other"}
    assert api.get(f"/api/v1/contexts/{cid}").json()["run_count"] == 1


def test_steps_with_tool_calls_are_stored_and_read_back(api, run):
    response = api.post(
        f"/api/v1/runs/{run['id']}/steps", {"steps": [{"kind": "task", "task": "weather?"}, ACTION]}
    )
    assert response.status_code == 201
    steps = response.json()["steps"]
    assert [s["position"] for s in steps] == [1, 2]
    action = steps[1]
    assert action["duration"] == 1.5 and action["total_tokens"] == 15
    assert [(t["position"], t["name"], t["arguments"]) for t in action["tool_calls"]] == [
        (1, "weather", {"city": "Paris"}),
        (2, "final_answer", "done"),
    ]
    got = api.get(f"/api/v1/steps/{action['id']}")
    assert got.status_code == 200 and got.json() == action
    for field in (
        "model_input_messages",
        "model_output_message",
        "code_action",
        "action_output",
        "payload",
        "error_type",
    ):
        assert got.json()[field] == ACTION[field]


def test_repeated_steps_return_stored_with_200_and_changed_steps_409(api, run):
    url = f"/api/v1/runs/{run['id']}/steps"
    assert api.post(url, {"steps": [ACTION]}).status_code == 201
    again = api.post(url, {"steps": [ACTION]})
    assert again.status_code == 200 and again.json()["created"] == [False]
    changed = dict(ACTION, tool_calls=[{"name": "weather", "arguments": {"city": "Rome"}}])
    conflict = api.post(url, {"steps": [changed]})
    assert conflict.status_code == 409
    assert "tool_calls" in conflict.json()["differences"]
    assert Step.objects.count() == 1 and ToolCall.objects.count() == 2


def test_get_run_pages_its_steps(api, run):
    api.post(
        f"/api/v1/runs/{run['id']}/steps",
        {"steps": [{"kind": "action", "step_number": i} for i in range(5)]},
    )
    detail = api.get(f"/api/v1/runs/{run['id']}", {"steps_limit": 2}).json()
    assert detail["run"]["step_count"] == 5
    assert [s["position"] for s in detail["steps"]["items"]] == [1, 2]
    assert detail["steps"]["next_cursor"] == 2
    rest = api.get(f"/api/v1/runs/{run['id']}/steps", {"after": 2, "limit": 10}).json()
    assert [s["position"] for s in rest["items"]] == [3, 4, 5] and not rest["has_more"]


def test_finish_sets_status_answer_and_sums_tokens_over_steps(api, run):
    api.post(f"/api/v1/runs/{run['id']}/steps", {"steps": [ACTION, dict(ACTION, client_id="s2")]})
    response = api.post(
        f"/api/v1/runs/{run['id']}/finish", {"status": "success", "final_answer": {"answer": 42}}
    )
    assert response.status_code == 200
    out = response.json()
    assert (out["status"], out["final_answer"], out["total_tokens"]) == (
        "success",
        {"answer": 42},
        30,
    )
    assert out["finished_at"] is not None and out["duration"] is not None


@pytest.mark.parametrize("status", ["running", "done", ""])
def test_finish_with_an_unknown_or_running_status_is_422(api, run, status):
    assert api.post(f"/api/v1/runs/{run['id']}/finish", {"status": status}).status_code == 422


def test_list_runs_of_a_context(api, run):
    page = api.get(f"/api/v1/contexts/{run['context_id']}/runs").json()
    assert [r["id"] for r in page["items"]] == [run["id"]]


@pytest.mark.parametrize(
    "step",
    [
        {"kind": "dream"},
        {"kind": "action", "input_tokens": 2**31},
        {"kind": "action", "step_number": -1},
        {"kind": "action", "start_time": 1e300},
        {"kind": "action", "observations": "\u0000"},
        {"kind": "action", "payload": {"\u0000": 1}},
        {"kind": "action", "error_type": "E" * 201},
        {"kind": "action", "tool_calls": [{"arguments": {}}]},
        {"kind": "action", "tool_calls": [{"name": "x" * 201}]},
        {"kind": "action", "is_final_answer": "perhaps"},
    ],
)
def test_invalid_step_is_422_and_stores_nothing(api, run, step):
    response = api.post(f"/api/v1/runs/{run['id']}/steps", {"steps": [step]})
    assert response.status_code == 422, response.content
    assert Step.objects.count() == 0


def test_run_with_naive_started_at_is_422(api, run):
    response = api.post(
        f"/api/v1/contexts/{run['context_id']}/runs", {"started_at": "2025-01-01T10:00:00"}
    )
    assert response.status_code == 422
