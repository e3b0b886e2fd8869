"""smolagents interop against the real package: import -> export, transcripts, pruning."""

import copy
import json

import pytest

from memory_app import errors, framework_io, transcripts
from memory_app.interop import smolagents as smol
from memory_app.models import Step, ToolCall
from memory_app.services.contexts import context_get_or_create
from memory_app.services.curation import steps_set_pruned
from memory_app.services.runs import run_create, steps_append
from tests.smol_agents import AGENTS, jsonable, messages_as_dicts, run_agent

pytestmark = pytest.mark.django_db

KINDS = list(AGENTS)


@pytest.fixture
def context():
    ctx, _ = context_get_or_create(keys={"user": "ada", "test": "smol"})
    return ctx


def _import(context, agent, client_id="r1"):
    steps = jsonable(agent.memory.get_full_steps())
    run, _ = framework_io.smolagents_run_import(
        context=context,
        steps=steps,
        system_prompt=agent.memory.system_prompt.system_prompt,
        client_id=client_id,
    )
    return run


@pytest.mark.parametrize("kind", KINDS)
def test_import_then_export_gives_back_get_full_steps(context, kind):
    agent = run_agent(kind)
    run = _import(context, agent)
    exported = framework_io.smolagents_run_export(run=run)
    assert exported["steps"] == jsonable(agent.memory.get_full_steps())
    assert exported["system_prompt"] == agent.memory.system_prompt.system_prompt


@pytest.mark.parametrize("kind", KINDS)
def test_import_fills_normalised_columns_and_run_totals(context, kind):
    agent = run_agent(kind)
    run = _import(context, agent)
    steps = list(run.steps.order_by("position"))
    assert [s.kind for s in steps] == ["task", "planning"] + ["action"] * (len(steps) - 2)
    assert run.status == "success"
    assert sum(1 for s in steps if s.error_type) == 1 == run.error_count
    expected_in = sum(
        s.token_usage.input_tokens for s in agent.memory.steps if getattr(s, "token_usage", None)
    )
    assert run.input_tokens == expected_in
    assert steps[-1].is_final_answer
    if kind == "code":
        assert run.final_answer == 1024
        assert steps[2].code_action == "x = 2**10\nprint(x)\nundefined_fn()"
    else:
        assert run.final_answer == "Sunny, 22C"
        call = ToolCall.objects.get(step=steps[2])
        assert (call.call_id, call.name, call.arguments) == (
            "call_w1",
            "get_weather",
            {"location": "Paris", "unit": "C"},
        )
        assert call.output == "Sunny in Paris, 22C"


@pytest.mark.parametrize("kind", KINDS)
def test_import_twice_writes_nothing_new(context, kind):
    agent = run_agent(kind)
    run = _import(context, agent)
    again = _import(context, agent)
    assert again.pk == run.pk
    assert Step.objects.filter(run=run).count() == len(agent.memory.steps)


def test_reimport_with_changed_step_is_a_conflict(context):
    agent = run_agent("code")
    _import(context, agent)
    steps = jsonable(agent.memory.get_full_steps())
    steps[2]["observations"] = "tampered"
    with pytest.raises(errors.Conflict):
        framework_io.smolagents_run_import(
            context=context,
            steps=steps,
            client_id="r1",
            system_prompt=agent.memory.system_prompt.system_prompt,
        )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("summary_mode", [False, True])
def test_transcript_equals_write_memory_to_messages(context, kind, summary_mode):
    agent = run_agent(kind)
    run = _import(context, agent)
    expected = messages_as_dicts(agent.write_memory_to_messages(summary_mode=summary_mode))
    assert transcripts.run_messages(run=run, summary_mode=summary_mode) == expected


def test_tool_call_text_keeps_argument_key_order_despite_jsonb(context):
    agent = run_agent("tool_calling")
    run = _import(context, agent)
    texts = [
        m["content"][0]["text"]
        for m in transcripts.run_messages(run=run)
        if m["role"] == "tool-call"
    ]
    assert "'arguments': {'location': 'Paris', 'unit': 'C'}" in texts[0]


@pytest.mark.parametrize("summary_mode", [False, True])
def test_pruned_steps_are_left_out_of_the_transcript(context, system_actor, summary_mode):
    agent = run_agent("code")
    run = _import(context, agent)
    failed = run.steps.get(error_type__isnull=False)
    steps_set_pruned(run=run, ids=[failed.pk], pruned=True, actor=system_actor)
    trimmed = copy.copy(agent)
    trimmed.memory = copy.copy(agent.memory)
    trimmed.memory.steps = [s for s in agent.memory.steps if getattr(s, "error", None) is None]
    expected = messages_as_dicts(trimmed.write_memory_to_messages(summary_mode=summary_mode))
    assert transcripts.run_messages(run=run, summary_mode=summary_mode) == expected
    assert all("Error:" not in m["content"][0]["text"] for m in transcripts.run_messages(run=run))


def test_steps_written_without_payload_still_give_smolagents_shapes(context):
    """A run streamed through the generic steps API (no payload) exports and transcribes too."""
    agent = run_agent("code")
    full = jsonable(agent.memory.get_full_steps())
    run, _ = run_create(context=context, client_id="bare", system_prompt="sys")
    items = [smol.step_to_logbook(s) for s in full]
    for item in items:
        item["payload"] = None
    steps_append(run=run, items=items)
    exported = framework_io.smolagents_run_export(run=run)["steps"]
    assert exported[2]["error"] == full[2]["error"]
    assert exported[2]["tool_calls"] == full[2]["tool_calls"]
    assert exported[3]["action_output"] == 1024
    agent.memory.system_prompt.system_prompt = "sys"
    assert transcripts.run_messages(run=run) == messages_as_dicts(agent.write_memory_to_messages())


@pytest.mark.parametrize(
    "bad", [["not a dict"], [{"nothing": 1}], [{"step_number": 1, "tool_calls": [{"id": "x"}]}]]
)
def test_malformed_steps_are_rejected_clearly(context, bad):
    with pytest.raises(errors.Invalid):
        framework_io.smolagents_run_import(context=context, steps=bad, client_id="bad")


# --- wrong types are a clear 422; the run keeps the agent's own clock -----------------


def _swap(steps, path, value):
    """A copy of `steps` with the value at `path` (keys / indexes) replaced."""
    steps = copy.deepcopy(steps)
    target = steps
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return steps


WRONG_TYPES = [
    ((2, "step_number"), "1"),
    ((2, "timing", "start_time"), "1795297221.6"),
    ((2, "timing", "end_time"), [1]),
    ((2, "timing"), "fast"),
    ((2, "token_usage", "input_tokens"), "120"),
    ((2, "token_usage", "output_tokens"), 1.5),
    ((2, "token_usage", "total_tokens"), True),
    ((2, "token_usage"), 135),
    ((2, "step_number"), 2**40),
    ((2, "timing", "start_time"), 1e300),
    ((2, "observations"), {"text": "not a string"}),
    ((2, "error"), "boom"),
    ((2, "is_final_answer"), "no"),
    ((2, "tool_calls", 0, "function", "name"), ["get_weather"]),
    ((2, "tool_calls", 0, "id"), 7),
    ((0, "task"), {"text": "a task"}),
    ((1, "plan"), 3),
]


@pytest.mark.parametrize(("path", "value"), WRONG_TYPES)
def test_a_wrong_type_is_invalid_and_writes_nothing(context, path, value):
    steps = _swap(jsonable(run_agent("tool_calling").memory.get_full_steps()), path, value)
    with pytest.raises(errors.Invalid) as caught:
        framework_io.smolagents_run_import(context=context, steps=steps, client_id="typed")
    assert str(path[-1]) in str(caught.value) or "tool call" in str(caught.value)
    assert not context.runs.exists() and not Step.objects.filter(run__context=context).exists()


@pytest.mark.parametrize(("path", "value"), WRONG_TYPES[:5])
def test_wrong_types_answer_json_422_on_both_smolagents_endpoints(db, path, value):
    from tests.api_helpers import make_key, new_context

    api = make_key()
    cid = new_context(api, {"test": "smol-types"})
    steps = jsonable(run_agent("tool_calling").memory.get_full_steps())
    response = api.post(
        f"/api/v1/contexts/{cid}/smolagents/runs", {"steps": _swap(steps, path, value)}
    )
    assert response.status_code == 422, response.content
    assert response["Content-Type"].startswith("application/json")
    assert path[-1] in str(response.json()["detail"])
    run = api.post(f"/api/v1/contexts/{cid}/runs", {"task": "live"}).json()
    live = api.post(
        f"/api/v1/runs/{run['id']}/smolagents/steps",
        {"start_index": 1, "steps": _swap(steps, path, value)},
    )
    assert live.status_code == 422, live.content
    assert Step.objects.filter(run_id=run["id"]).count() == 0


def test_an_imported_run_keeps_the_agents_start_time_and_duration(context):
    agent = run_agent("tool_calling")
    steps = jsonable(agent.memory.get_full_steps())
    # Pretend the agent ran an hour ago for 42.5 seconds: its steps say so.
    base = steps[1]["timing"]["start_time"] - 3600
    timed = [s for s in steps if isinstance(s.get("timing"), dict)]
    for i, s in enumerate(timed):
        s["timing"] = {
            "start_time": base + 10 * i,
            "end_time": base + 10 * i + 2.5,
            "duration": 2.5,
        }
    timed[-1]["timing"] = {"start_time": base + 40, "end_time": base + 42.5, "duration": 2.5}
    run, _ = framework_io.smolagents_run_import(context=context, steps=steps, client_id="clock")
    run.refresh_from_db()
    assert run.started_at.timestamp() == pytest.approx(base, abs=1e-3)
    assert run.finished_at.timestamp() == pytest.approx(base + 42.5, abs=1e-3)
    assert run.duration == pytest.approx(42.5, abs=1e-3)


# --- key order survives jsonb ------------------------------------------------------


def _without_model_input(steps):
    return [{k: v for k, v in s.items() if k != "model_input_messages"} for s in steps]


@pytest.mark.parametrize("kind", KINDS)
def test_export_gives_back_every_key_in_its_original_order(context, kind):
    agent = run_agent(kind)
    run = _import(context, agent)
    exported = framework_io.smolagents_run_export(run=run)["steps"]
    original = jsonable(agent.memory.get_full_steps())
    # Compared as text, so order counts (model input aside: smolagents rebuilds it every step).
    assert json.dumps(_without_model_input(exported)) == json.dumps(_without_model_input(original))


def test_multi_argument_and_nested_tool_arguments_keep_their_order(context):
    arguments = {"query": "hotels", "k": 3, "filters": {"zeta": True, "alpha": [{"yy": 1, "x": 2}]}}
    step = {
        "step_number": 1,
        "timing": {"start_time": 1795297221.5, "end_time": 1795297222.0, "duration": 0.5},
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": arguments}}
        ],
        "error": None,
        "model_output": None,
        "observations": "3 hotels",
        "is_final_answer": False,
    }
    run, _ = framework_io.smolagents_run_import(
        context=context,
        steps=[{"task": "find hotels", "task_images": None}, step],
        client_id="args",
    )
    # The tool call's own row keeps the order too (the logbook and the API read it).
    assert json.dumps(ToolCall.objects.get(step__run=run).arguments) == json.dumps(arguments)
    # Nothing beside the payload is needed to give it back.
    assert "key_order" not in (Step.objects.get(run=run, step_number=1).payload["_agentmemory"])
    exported = framework_io.smolagents_run_export(run=run)["steps"][1]
    assert json.dumps(exported) == json.dumps(step)
