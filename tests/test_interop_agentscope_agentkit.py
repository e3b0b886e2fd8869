"""AgentScope 1.x state dicts (real package) and AgentKit tool input, through the database."""

import json

import pytest
from agentscope.memory import InMemoryMemory
from agentscope.message import Msg, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock

from memory_app import errors, framework_io, transcripts
from memory_app.interop import agentkit
from memory_app.models import Message
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, steps_append
from tests.aio import run_coroutine

pytestmark = pytest.mark.django_db


def real_memory_state():
    """A state dict written by the real AgentScope 1.x InMemoryMemory (as in as1_demo.py)."""

    async def build():
        user = Msg("user", "What's the weather in Paris?", "user")
        asst = Msg(
            "Friday",
            [
                ThinkingBlock(type="thinking", thinking="Need the weather tool."),
                ToolUseBlock(
                    type="tool_use",
                    id="call_abc123",
                    name="get_weather",
                    input={"city": "Paris", "unit": "C"},
                ),
            ],
            "assistant",
        )
        tool = Msg(
            "system",
            [
                ToolResultBlock(
                    type="tool_result",
                    id="call_abc123",
                    name="get_weather",
                    output=[TextBlock(type="text", text="Sunny, 22C")],
                )
            ],
            "system",
        )
        final = Msg(
            "Friday",
            [TextBlock(type="text", text="It's sunny and 22C in Paris.")],
            "assistant",
            metadata={"structured": {"temp_c": 22}},
        )
        mem = InMemoryMemory()
        await mem.add([user, asst, tool])
        await mem.add(final, marks=["important", "hint"])
        await mem.add(user, allow_duplicates=True)  # the same id twice, as AgentScope allows
        await mem.update_compressed_summary("<summary>User asked about Paris weather.</summary>")
        return mem.state_dict()

    return json.loads(json.dumps(run_coroutine(build())))


@pytest.fixture
def context():
    ctx, _ = context_get_or_create(keys={"user": "ada", "test": "agentscope"})
    return ctx


def test_marks_format_round_trip_equals_input(context, system_actor):
    state = real_memory_state()
    framework_io.agentscope_state_import(context=context, state=state, actor=system_actor)
    context.refresh_from_db()
    assert framework_io.agentscope_state_export(context=context, fmt="marks") == state
    assert context.compressed_summary == state["_compressed_summary"]


def test_legacy_format_round_trip_equals_input(context, system_actor):
    legacy = {"content": [msg for msg, _ in real_memory_state()["content"]]}
    framework_io.agentscope_state_import(context=context, state=legacy, actor=system_actor)
    assert framework_io.agentscope_state_export(context=context, fmt="legacy") == legacy


def test_import_maps_id_marks_blocks_and_timestamp(context, system_actor):
    state = real_memory_state()
    framework_io.agentscope_state_import(context=context, state=state, actor=system_actor)
    rows = list(Message.objects.filter(context=context).order_by("seq"))
    first_id = state["content"][0][0]["id"]
    assert [r.client_id for r in rows][0] == first_id
    assert rows[-1].client_id == f"{first_id}#dup1"
    assert rows[3].tags == ["important", "hint"]
    assert rows[1].content[1] == {
        "type": "tool_use",
        "id": "call_abc123",
        "name": "get_weather",
        "input": {"city": "Paris", "unit": "C"},
    }
    assert rows[2].role == "system" and rows[2].content[0]["type"] == "tool_result"
    assert rows[0].source_timestamp == state["content"][0][0]["timestamp"]
    assert rows[3].text == "It's sunny and 22C in Paris."


def test_import_twice_changes_nothing(context, system_actor):
    state = real_memory_state()
    framework_io.agentscope_state_import(context=context, state=state, actor=system_actor)
    before = list(Message.objects.filter(context=context).values())
    result = framework_io.agentscope_state_import(context=context, state=state, actor=system_actor)
    assert result == {"created": 0, "pruned": 0}
    assert list(Message.objects.filter(context=context).values()) == before


def test_exported_state_loads_into_the_real_memory(context, system_actor):
    state = real_memory_state()
    framework_io.agentscope_state_import(context=context, state=state, actor=system_actor)
    mem = InMemoryMemory()
    mem.load_state_dict(framework_io.agentscope_state_export(context=context))
    assert mem.state_dict() == state


def test_replace_prunes_what_the_new_state_drops(context, system_actor):
    state = real_memory_state()
    framework_io.agentscope_state_import(context=context, state=state, actor=system_actor)
    smaller = {"_compressed_summary": "", "content": state["content"][:2]}
    result = framework_io.agentscope_state_import(
        context=context, state=smaller, actor=system_actor, replace=True
    )
    assert result == {"created": 0, "pruned": 3}
    context.refresh_from_db()
    assert framework_io.agentscope_state_export(context=context) == smaller


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"no": "content"},
        {"content": [1]},
        {"content": [{"id": "x", "name": "n", "role": "robot", "content": "hi"}]},
    ],
)
def test_bad_state_dicts_are_rejected(context, system_actor, bad):
    with pytest.raises(errors.Invalid):
        framework_io.agentscope_state_import(context=context, state=bad, actor=system_actor)


TRICKY_IDS = ["a", "a#dup1", "a#dup2", "a%23dup1", "%", "%25", "#", "#dup1", "b#c", "a"]


def test_any_msg_id_round_trips_and_distinct_ids_never_collide(context, system_actor):
    """Ids that look like the storage's own copy suffix or its escapes come back exactly, the
    repeat of "a" included."""

    async def build():
        mem = InMemoryMemory()
        for i, mid in enumerate(TRICKY_IDS):
            msg = Msg("user", f"message {i}", "user")
            msg.id = mid
            await mem.add(msg, allow_duplicates=True)
        return mem.state_dict()

    state = json.loads(json.dumps(run_coroutine(build())))
    framework_io.agentscope_state_import(context=context, state=state, actor=system_actor)
    assert framework_io.agentscope_state_export(context=context) == state
    client_ids = list(Message.objects.filter(context=context).values_list("client_id", flat=True))
    assert len(set(client_ids)) == len(TRICKY_IDS)
    # Importing the same state again writes nothing: every copy finds its own client id.
    assert framework_io.agentscope_state_import(
        context=context, state=state, actor=system_actor
    ) == {
        "created": 0,
        "pruned": 0,
    }


def test_a_plain_id_added_after_its_lookalike_is_kept_and_deleted_alone(context, system_actor):
    def msg(mid, text):
        return {"id": mid, "name": "user", "role": "user", "content": text, "metadata": {}}

    framework_io.agentscope_add(context=context, msgs=[msg("x#dup1", "lookalike")])
    added = framework_io.agentscope_add(context=context, msgs=[msg("x", "plain")])
    assert len(added) == 1  # it used to be taken for the lookalike's "first copy" and dropped
    framework_io.agentscope_add(context=context, msgs=[msg("x", "again")])  # known id: skipped
    ids = [m["id"] for m, _ in framework_io.agentscope_entries(context=context)]
    assert ids == ["x#dup1", "x"]
    assert framework_io.agentscope_delete(context=context, msg_ids=["x"], actor=system_actor) == 1
    assert [m["id"] for m, _ in framework_io.agentscope_entries(context=context)] == ["x#dup1"]


def test_an_id_too_long_to_store_escaped_is_invalid(context):
    long_id = "#" * 100  # 300 characters once escaped
    with pytest.raises(errors.Invalid):
        framework_io.agentscope_add(
            context=context, msgs=[{"id": long_id, "name": "u", "role": "user", "content": "hi"}]
        )
    assert not Message.objects.filter(context=context).exists()


# --- AgentKit (frameworks.md §4, verified output of the real project) --------------------------

EXPECTED_A_JSON = (
    '{"chat_history": [{"content": "Which Led Zeppelin albums are in the store?", '
    '"additional_kwargs": {}, "type": "human", "example": false}, '
    '{"content": "There are 14 albums.\\naction: show_table\\nsignal: done", '
    '"additional_kwargs": {}, "type": "ai", "example": false}], '
    '"latest_human_message": "And which of them sold the most?", '
    '"user_settings": {"data": {"theme": "dark"}, "version": 3}, "intermediate_steps": {}}'
)
EXPECTED_A_QUERY = (
    "\nChat history: \nHuman: Which Led Zeppelin albums are in the store?\nAI: There are 14 "
    "albums.Latest user question: And which of them sold the most?"
)
EXPECTED_B_QUERY = (
    "\nIntermediate tool outputs: sql_tool: Physical Graffiti: 120 units\npdf_tool: bio..."
    "Latest user question: And which of them sold the most?"
)


def _zeppelin_context():
    ctx, _ = context_get_or_create(keys={"test": "agentkit"})
    ctx.metadata = {"user_settings": {"data": {"theme": "dark"}, "version": 3}}
    ctx.save()
    messages_append(
        context=ctx,
        items=[
            {"role": "user", "text": "Which Led Zeppelin albums are in the store?"},
            {"role": "assistant", "text": "There are 14 albums.\naction: show_table\nsignal: done"},
            {"role": "user", "text": "And which of them sold the most?"},
        ],
    )
    return ctx


def test_tool_input_matches_agentkit_json_and_query_exactly():
    tool_input = transcripts.context_tool_input(context=_zeppelin_context())
    assert json.dumps(tool_input) == EXPECTED_A_JSON
    assert agentkit.standard_query_format(tool_input) == EXPECTED_A_QUERY


def test_tool_input_with_run_tool_outputs_matches_agentkit():
    ctx = _zeppelin_context()
    run, _ = run_create(context=ctx, task="sales")
    steps_append(
        run=run,
        items=[
            {
                "kind": "action",
                "step_number": 1,
                "tool_calls": [
                    {"name": "sql_tool", "output": "Physical Graffiti: 120 units"},
                    {"name": "entertainer_tool", "output": "joke"},
                    {"name": "pdf_tool", "output": "bio..."},
                ],
            }
        ],
    )
    ctx.metadata = {}
    ctx.save()
    tool_input = transcripts.context_tool_input(context=ctx, run=run)
    assert tool_input == {
        "chat_history": [],
        "latest_human_message": "And which of them sold the most?",
        "user_settings": None,
        "intermediate_steps": {
            "sql_tool": "Physical Graffiti: 120 units",
            "entertainer_tool": "joke",
            "pdf_tool": "bio...",
        },
    }
    assert agentkit.standard_query_format(tool_input) == EXPECTED_B_QUERY
