"""What the model saw at a step: the stored input, or smolagents' rebuilt one, or "not recorded";
each message in its section by source with its tokens; a line diff against the previous model
call's input; the run's system prompt on the run page."""

from __future__ import annotations

import difflib
import random
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from memory_app import tokens, transcripts
from memory_app.audit import Actor
from memory_app.memories import Scope
from memory_app.models import Run
from memory_app.queries.model_input import line_diff, model_input
from memory_app.services.curation import steps_set_pruned
from memory_app.services.memories import memories_record
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, run_finish, steps_append
from tests.builders import action_step, make_context, make_run, make_user

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
SYSTEM = "You are a careful agent. <b>Never</b> guess."
TASK = "New task:\nFind Ada a tea shop in Kyoto"
MEMORY = "Ada prefers green tea over coffee."
HISTORY = "Earlier we talked about Kyoto's Gion district."
OUTPUT = "I will search <script>alert('x')</script> for shops."


def text(role, value):
    return {"role": role, "content": [{"type": "text", "text": value}]}


FIRST_INPUT = [
    text("system", SYSTEM),
    text("user", TASK),
    # Whitespace differs from the record: the records' hash ignores it, and so does the match.
    text("user", "Ada  prefers green tea\nover coffee."),
    text("user", HISTORY),
]
SECOND_INPUT = [
    *FIRST_INPUT,
    text("assistant", OUTPUT),
    text("tool-call", "Calling tools:\n[{'id': 'call_1', 'function': {'name': 'search'}}]"),
    text("tool-response", "Observation:\nUogashi <i>Kyoto</i>, 2 min away"),
]


@pytest.fixture
def viewer() -> Client:
    client = Client()
    client.force_login(make_user(role="viewer"))
    return client


@pytest.fixture
def stored_run() -> Run:
    """A run whose steps carry the input the framework recorded, in a context whose key subset
    holds a memory and whose history holds a message the second input quotes."""
    context = make_context(keys={"user": "ada", "chat": "kyoto"})
    memories_record(
        scope=Scope(keys={"user": "ada"}), items=[{"content": MEMORY}], actor=Actor.system("t")
    )
    messages_append(context=context, items=[{"role": "user", "text": HISTORY}])
    run, _ = run_create(context=context, task=TASK, system_prompt=SYSTEM, framework="otel")
    steps_append(
        run=run,
        items=[
            {"kind": "task", "task": TASK},
            action_step(1, model_input_messages=FIRST_INPUT),
            action_step(2, model_input_messages=SECOND_INPUT),
        ],
    )
    return run_finish(run=run, status="success")


def counted(messages) -> list[int]:
    return tokens.count_tokens(
        [
            tokens.token_text("\n".join(b["text"] for b in m["content"]), m["content"])
            for m in messages
        ]
    )


def test_a_stored_input_is_sectioned_by_source_with_tokens_per_section(stored_run):
    seen = model_input(run=stored_run, position=3)
    assert seen.origin == "stored" and seen.tokenizer == "cl100k_base"
    assert [(m.role, m.section) for m in seen.messages] == [
        ("system", "system"),
        ("user", "task"),
        ("user", "memory"),
        ("user", "memory"),
        ("assistant", "steps"),
        ("tool-call", "steps"),
        ("tool-response", "tools"),
    ]
    memory = seen.messages[2]
    assert memory.memory_id is not None and memory.message_seq is None
    assert seen.messages[3].message_seq == 1 and seen.messages[3].memory_id is None
    expected = counted(SECOND_INPUT)
    assert [m.tokens for m in seen.messages] == expected
    by_section = {s.key: (s.messages, s.tokens) for s in seen.sections}
    assert by_section == {
        "system": (1, expected[0]),
        "task": (1, expected[1]),
        "memory": (2, expected[2] + expected[3]),
        "steps": (2, expected[4] + expected[5]),
        "tools": (1, expected[6]),
    }
    assert seen.total_tokens == sum(expected)


def test_a_turn_the_run_wrote_itself_is_an_earlier_step_not_a_hit(stored_run):
    follow_up = "Also find a quiet one, please."
    messages_append(
        context=stored_run.context,
        items=[{"role": "user", "text": follow_up, "run_id": stored_run.pk}],
    )
    steps_append(
        run=stored_run,
        items=[action_step(3, model_input_messages=[*SECOND_INPUT, text("user", follow_up)])],
    )
    seen = model_input(run=stored_run, position=4)
    assert [m.section for m in seen.messages[-2:]] == ["tools", "steps"]
    assert seen.messages[-1].message_seq is None
    assert [m.section for m in seen.messages[2:4]] == ["memory", "memory"]


def test_the_diff_is_against_the_previous_model_calls_input(stored_run):
    seen = model_input(run=stored_run, position=3)
    assert seen.previous == 2 and seen.previous_origin == "stored"
    added = [d.text for d in seen.diff if d.mark == "+"]
    assert added == [
        "── assistant ──",
        OUTPUT,
        "── tool-call ──",
        "Calling tools:",
        "[{'id': 'call_1', 'function': {'name': 'search'}}]",
        "── tool-response ──",
        "Observation:",
        "Uogashi <i>Kyoto</i>, 2 min away",
    ]
    assert seen.added == 8 and seen.removed == 0
    assert seen.token_change == sum(counted(SECOND_INPUT)) - sum(counted(FIRST_INPUT))
    # Two lines of the unchanged input lead into the change.
    assert [d.mark for d in seen.diff[:3]] == ["@", " ", " "]
    first = model_input(run=stored_run, position=2)
    assert first.previous is None and first.diff is None
    assert "No earlier step" in first.diff_note


def apply(before: list[str], diff) -> list[str]:
    """`before` with the diff's hunks applied, each at the line its header names."""
    out, at = [], 0
    for d in diff:
        if d.mark == "@":
            start = int(re.match(r"@@ -(\d+)", d.text).group(1))
            old = re.match(r"@@ -\d+(,\d+)?", d.text).group(1)
            start = start if old != ",0" else start + 1
            out.extend(before[at : start - 1])
            at = start - 1
        elif d.mark == "+":
            out.append(d.text)
        else:
            assert before[at] == d.text  # an unchanged or removed line is where the header says
            if d.mark == " ":
                out.append(d.text)
            at += 1
    return out + before[at:]


def test_line_diff_is_a_unified_diff_that_turns_one_input_into_the_next():
    rng = random.Random(7)
    for _ in range(400):
        before = [rng.choice("abcdef") for _ in range(rng.randrange(0, 40))]
        after = list(before)
        for _ in range(rng.randrange(0, 5)):
            at = rng.randrange(0, len(after) + 1)
            if after and rng.random() < 0.5:
                del after[min(at, len(after) - 1)]
            else:
                after.insert(at, rng.choice("abcxyz"))
        diff, added, removed = line_diff(before, after)
        assert apply(before, diff) == after
        assert added == sum(d.mark == "+" for d in diff)
        assert removed == sum(d.mark == "-" for d in diff)
        if before == after:
            assert diff == []
        if before[:1] != after[:1]:
            # Nothing in common at the head to skip: exactly difflib's unified diff.
            theirs = list(difflib.unified_diff(before, after, n=2, lineterm=""))[2:]
            assert [d.text if d.mark == "@" else d.mark + d.text for d in diff] == theirs


def test_a_smolagents_step_without_stored_input_is_rebuilt_as_smolagents_would():
    run = make_run(context=make_context(), steps=4, model_input_messages=None)
    # An operator pruned step 2 afterwards: the model saw it all the same.
    steps_set_pruned(
        run=run, ids=[run.steps.get(position=2).pk], pruned=True, actor=Actor.system("t")
    )
    seen = model_input(run=run, position=4)
    assert seen.origin == "rebuilt"
    chat = transcripts.run_messages(run=run, upto_position=3, include_pruned=True)
    assert [(m.role, m.text) for m in seen.messages] == [
        (c["role"], c["content"][0]["text"]) for c in chat
    ]
    assert [m.text for m in seen.messages[:4]] == [
        "You are a careful agent.",
        "New task:\nFind the weather in Paris",
        "I will call a tool (step 1).",
        "Calling tools:\n[{'id': 'call_1', 'type': 'function', 'function': {'name': "
        "'get_weather', 'arguments': {'city': 'Paris', 'step': 1}}}]",
    ]
    assert [m.section for m in seen.messages] == [
        "system",
        "task",
        *["steps", "steps", "tools"] * 2,
    ]
    # The previous call's input is rebuilt the same way; the diff is what step 3 added.
    assert seen.previous == 3 and seen.previous_origin == "rebuilt"
    assert [d.text for d in seen.diff if d.mark == "+"] == [
        "── assistant ──",
        "I will call a tool (step 2).",
        "── tool-call ──",
        "Calling tools:",
        "[{'id': 'call_2', 'type': 'function', 'function': {'name': 'get_weather', "
        "'arguments': {'city': 'Paris', 'step': 2}}}]",
        "── tool-response ──",
        "Observation:",
        "Observation for step 2",
    ]


def test_what_cannot_be_rebuilt_honestly_is_not_recorded():
    context = make_context()
    run, _ = run_create(context=context, task="t", framework="agentscope")
    steps_append(
        run=run, items=[{"kind": "task", "task": "t"}, action_step(1, model_input_messages=None)]
    )
    assert model_input(run=run, position=1).reason.startswith("a task step is not a model call")
    other = model_input(run=run, position=2)
    assert other.origin == "none" and not other.messages
    assert "agentscope gives no rule to rebuild it" in other.reason
    smol = make_run(context=context, steps=2, model_input_messages=None)
    steps_append(
        run=smol,
        items=[
            {"kind": "planning", "plan": "1. look", "model_input_messages": None},
            action_step(2, model_input_messages=None, error_type="AgentMaxStepsError"),
        ],
    )
    assert "planning call from prompt templates" in model_input(run=smol, position=3).reason
    assert "reached its step limit" in model_input(run=smol, position=4).reason
    assert model_input(run=smol, position=9) is None


def test_the_model_input_panel_shows_sections_and_an_escaped_marked_diff(viewer, stored_run):
    url = f"/runs/{stored_run.pk}/steps/3/model-input/"
    html = viewer.get(url, **HX).content.decode()
    assert html.lstrip().startswith('<div id="model-input-3" class="model-input">')
    rows = re.findall(
        r'<tr class="mi-section-(\w+)[^"]*"><th scope="row">[^<]+</th>'
        r'<td class="num">(\d+)</td><td class="num">(\d+)</td>',
        html,
    )
    expected = counted(SECOND_INPUT)
    assert rows == [
        ("system", "1", str(expected[0])),
        ("task", "1", str(expected[1])),
        ("memory", "2", str(expected[2] + expected[3])),
        ("steps", "2", str(expected[4] + expected[5])),
        ("tools", "1", str(expected[6])),
    ]
    assert f'<td class="num mi-total">{sum(expected)}</td>' in html
    assert "Changes since step 2" in html
    # Added lines carry a visible "+" (not colour alone); agent text stays text.
    assert (
        '<ins class="ins"><span class="mark">+</span>'
        "I will search &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; for shops.</ins>"
    ) in html
    assert "<script>alert" not in html and "<i>Kyoto" not in html and "<b>Never" not in html
    seen = model_input(run=stored_run, position=3)
    assert f'href="/memories/?id={seen.messages[2].memory_id}"' in html
    assert f'href="/contexts/{stored_run.context_id}/?seq=1#m-1"' in html
    # A removed line is marked "−".
    steps_append(run=stored_run, items=[action_step(3, model_input_messages=FIRST_INPUT[:2])])
    html = viewer.get(f"/runs/{stored_run.pk}/steps/4/model-input/", **HX).content.decode()
    assert '<del class="del"><span class="mark">−</span>' + HISTORY.replace("'", "&#x27;") in html


def test_a_step_without_input_says_not_recorded(viewer):
    run, _ = run_create(context=make_context(), task="t", framework="agentscope")
    steps_append(run=run, items=[action_step(1, model_input_messages=None)])
    html = viewer.get(f"/runs/{run.pk}/steps/1/model-input/", **HX).content.decode()
    assert "<b>Not recorded:</b>" in html and "mi-sections" not in html


def test_the_run_page_shows_the_system_prompt_and_loads_no_model_input(viewer, stored_run):
    with CaptureQueriesContext(connection) as queries:
        html = viewer.get(f"/runs/{stored_run.pk}/steps/3/").content.decode()
    assert '<details class="system-prompt"><summary>System prompt' in html
    assert "You are a careful agent. &lt;b&gt;Never&lt;/b&gt; guess." in html
    # The logbook reads no step's model input: the panel loads it when opened.
    assert not [q for q in queries.captured_queries if "model_input_messages" in q["sql"]]
    assert f'hx-get="/runs/{stored_run.pk}/steps/3/model-input/?step=' in html
    # Stepping under htmx swaps the logbook only: the header (and its prompt) is not re-sent.
    html = viewer.get(f"/runs/{stored_run.pk}/steps/2/", **HX).content.decode()
    assert "system-prompt" not in html
