"""smolagents interop against the real package: import -> export, transcripts, pruning."""

import copy

import pytest

from memory_app import framework_io, logbook, transcripts
from memory_app.interop import smolagents as smol
from memory_app.models import Step, ToolCall
from tests.smol_agents import AGENTS, jsonable, messages_as_dicts, run_agent

pytestmark = pytest.mark.django_db

KINDS = list(AGENTS)


@pytest.fixture
def context():
    ctx, _ = logbook.context_get_or_create(keys={"user": "ada", "test": "smol"})
    return ctx


def _import(context, agent, client_id="r1"):
    steps = jsonable(agent.memory.get_full_steps())
    run, _ = framework_io.smolagents_run_import(
        context=context, steps=steps, system_prompt=agent.memory.system_prompt.system_prompt, client_id=client_id
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
    expected_in = sum(s.token_usage.input_tokens for s in agent.memory.steps if getattr(s, "token_usage", None))
    assert run.input_tokens == expected_in
    assert steps[-1].is_final_answer
    if kind == "code":
        assert run.final_answer == 1024
        assert steps[2].code_action == "x = 2**10\nprint(x)\nundefined_fn()"
    else:
        assert run.final_answer == "Sunny, 22C"
        call = ToolCall.objects.get(step=steps[2])
        assert (call.call_id, call.name, call.arguments) == ("call_w1", "get_weather", {"location": "Paris", "unit": "C"})
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
    with pytest.raises(logbook.Conflict):
        framework_io.smolagents_run_import(context=context, steps=steps, client_id="r1",
                                           system_prompt=agent.memory.system_prompt.system_prompt)


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
    texts = [m["content"][0]["text"] for m in transcripts.run_messages(run=run) if m["role"] == "tool-call"]
    assert "'arguments': {'location': 'Paris', 'unit': 'C'}" in texts[0]


@pytest.mark.parametrize("summary_mode", [False, True])
def test_pruned_steps_are_left_out_of_the_transcript(context, system_actor, summary_mode):
    agent = run_agent("code")
    run = _import(context, agent)
    failed = run.steps.get(error_type__isnull=False)
    logbook.steps_set_pruned(run=run, ids=[failed.pk], pruned=True, actor=system_actor)
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
    run, _ = logbook.run_create(context=context, client_id="bare", system_prompt="sys")
    items = [smol.step_to_logbook(s) for s in full]
    for item in items:
        item["payload"] = None
    logbook.steps_append(run=run, items=items)
    exported = framework_io.smolagents_run_export(run=run)["steps"]
    assert exported[2]["error"] == full[2]["error"]
    assert exported[2]["tool_calls"] == full[2]["tool_calls"]
    assert exported[3]["action_output"] == 1024
    agent.memory.system_prompt.system_prompt = "sys"
    assert transcripts.run_messages(run=run) == messages_as_dicts(agent.write_memory_to_messages())


@pytest.mark.parametrize("bad", [["not a dict"], [{"nothing": 1}], [{"step_number": 1, "tool_calls": [{"id": "x"}]}]])
def test_malformed_steps_are_rejected_clearly(context, bad):
    with pytest.raises(logbook.Invalid):
        framework_io.smolagents_run_import(context=context, steps=bad, client_id="bad")
