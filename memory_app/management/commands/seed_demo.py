"""`manage.py seed_demo`: demo data an operator can explore on a first `make run`.

One travel-assistant context with 60 messages and three runs (tool calls, a tool error that the
agent recovers from, planning, a final answer); an AgentScope-style conversation whose assistant
turns call tools (tool_use / tool_result blocks, one turn with nothing but a tool call, a long
tool output); a support chat with a corrected message and a pruned one (so the audit log has
something to show and undo); a few small contexts for the list; and long-term memories: shared
by every chat of a user, kept for one context, and one promoted from a message. Loaded once: the
demo contexts carry `"demo": true` in their keys and are skipped when present.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand
from django.db import transaction

from memory_app import memories
from memory_app.audit import Actor
from memory_app.models import Context, Message, RunStatus
from memory_app.services.contexts import context_get_or_create
from memory_app.services.curation import messages_set_pruned
from memory_app.services.memories import memories_record, memory_promote
from memory_app.services.messages import message_edit, messages_append
from memory_app.services.runs import run_create, run_finish, steps_append

SEED = Actor.system("seed_demo")

CITIES = [
    ("Paris", "Sunny, 22C", "the Musée d'Orsay"),
    ("Lisbon", "Clear, 26C", "the Alfama quarter"),
    ("Oslo", "Rain, 9C", "the Munch museum"),
    ("Kyoto", "Cloudy, 18C", "Fushimi Inari at dawn"),
    ("Montreal", "Snow, -4C", "the underground city"),
]


def _conversation() -> list[dict]:
    messages = [
        {
            "role": "system",
            "name": "system",
            "text": "You are Atlas, a concise travel assistant. Use tools for live data.",
        },
    ]
    for i in range(6):
        for city, weather, sight in CITIES:
            if len(messages) >= 60:
                break
            turn = i * len(CITIES)
            messages.append(
                {
                    "role": "user",
                    "name": "ada",
                    "text": f"What should I know before visiting {city}? (question {turn + 1})",
                }
            )
            messages.append(
                {
                    "role": "assistant",
                    "name": "Atlas",
                    "text": (
                        f"**{city}** right now: {weather}.\n\n- Don't miss {sight}.\n"
                        "- Book ahead on weekends.\n\n"
                        "```python\nitinerary = plan_day(city=%r, pace='relaxed')\n```" % city
                    ),
                    "tags": ["travel", city.lower()],
                }
            )
    return messages[:60]


def _steps_ok(now: float) -> list[dict]:
    return [
        {"kind": "task", "task": "What's the weather in Paris, and what should I pack?"},
        {
            "kind": "planning",
            "plan": "1. Get the weather for Paris.\n2. Suggest what to pack.",
            "start_time": now,
            "end_time": now + 0.8,
            "input_tokens": 310,
            "output_tokens": 42,
        },
        {
            "kind": "action",
            "step_number": 1,
            "model_output": "I will check the weather.",
            "tool_calls": [
                {
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": {"city": "Paris"},
                    "output": "Sunny, 22C",
                    "success": True,
                    "duration": 0.21,
                }
            ],
            "observations": "Sunny, 22C",
            "start_time": now + 0.8,
            "end_time": now + 2.1,
            "input_tokens": 420,
            "output_tokens": 18,
        },
        {
            "kind": "action",
            "step_number": 2,
            "model_output": "Light clothes and sunglasses.",
            "tool_calls": [
                {
                    "call_id": "call_2",
                    "name": "final_answer",
                    "arguments": {"answer": "Sunny, 22C: pack light clothes and sunglasses."},
                }
            ],
            "observations": "Sunny, 22C: pack light clothes and sunglasses.",
            "is_final_answer": True,
            "start_time": now + 2.1,
            "end_time": now + 3.0,
            "input_tokens": 470,
            "output_tokens": 25,
        },
    ]


def _steps_with_error(now: float) -> list[dict]:
    return [
        {"kind": "task", "task": "Compare the weather in Oslo and Kyoto."},
        {
            "kind": "action",
            "step_number": 1,
            "model_output": "Checking Oslo first.",
            "code_action": "oslo = get_weather(city='Oslo')\nprint(oslo)",
            "tool_calls": [
                {
                    "call_id": "call_2",
                    "name": "python_interpreter",
                    "arguments": "oslo = get_weather(city='Oslo')\nprint(oslo)",
                    "output": "Rain, 9C",
                    "success": True,
                }
            ],
            "observations": "Execution logs:\nRain, 9C\nLast output from code snippet:\nNone",
            "start_time": now,
            "end_time": now + 1.4,
            "input_tokens": 512,
            "output_tokens": 40,
        },
        {
            "kind": "action",
            "step_number": 2,
            "model_output": "Now Kyoto.",
            "code_action": "kyoto = get_weather(town='Kyoto')",
            "tool_calls": [
                {
                    "call_id": "call_3",
                    "name": "python_interpreter",
                    "arguments": "kyoto = get_weather(town='Kyoto')",
                    "success": False,
                }
            ],
            "error_type": "AgentExecutionError",
            "error_message": (
                "Code execution failed at line 'kyoto = get_weather(town='Kyoto')' due to: "
                "TypeError: get_weather() got an unexpected keyword argument 'town'"
            ),
            "start_time": now + 1.4,
            "end_time": now + 2.9,
            "input_tokens": 640,
            "output_tokens": 31,
        },
        {
            "kind": "action",
            "step_number": 3,
            "model_output": "Retrying with the right argument.",
            "code_action": (
                "kyoto = get_weather(city='Kyoto')\nfinal_answer(f'Oslo: Rain, 9C; Kyoto: {kyoto}')"
            ),
            "tool_calls": [
                {
                    "call_id": "call_4",
                    "name": "python_interpreter",
                    "arguments": (
                        "kyoto = get_weather(city='Kyoto')\n"
                        "final_answer(f'Oslo: Rain, 9C; Kyoto: {kyoto}')"
                    ),
                    "output": "Oslo: Rain, 9C; Kyoto: Cloudy, 18C",
                    "success": True,
                }
            ],
            "observations": (
                "Execution logs:\nLast output from code snippet:\n"
                "Oslo: Rain, 9C; Kyoto: Cloudy, 18C"
            ),
            "action_output": "Oslo: Rain, 9C; Kyoto: Cloudy, 18C",
            "is_final_answer": True,
            "start_time": now + 2.9,
            "end_time": now + 4.6,
            "input_tokens": 780,
            "output_tokens": 52,
        },
    ]


class Command(BaseCommand):
    help = "Load demo contexts, messages and runs (once)."

    @transaction.atomic
    def handle(self, *args, **options):
        if Context.objects.filter(keys__demo=True).exists():
            self.stdout.write("demo data already present")
            return
        context, _ = context_get_or_create(
            keys={"demo": True, "user": "ada", "chat": "trip-planning"}, title="Ada plans a trip"
        )
        messages_append(context=context, items=_conversation())
        now = time.time() - 3600
        for task_steps, status, answer, agent, framework in [
            (
                _steps_ok(now),
                RunStatus.SUCCESS,
                "Sunny, 22C: pack light clothes and sunglasses.",
                "Atlas",
                "smolagents",
            ),
            (
                _steps_with_error(now + 600),
                RunStatus.SUCCESS,
                "Oslo: Rain, 9C; Kyoto: Cloudy, 18C",
                "Atlas-code",
                "smolagents",
            ),
        ]:
            run, _ = run_create(
                context=context,
                task=task_steps[0]["task"],
                agent_name=agent,
                framework=framework,
                system_prompt="You are an expert assistant who can solve any task using tools.",
            )
            steps_append(run=run, items=task_steps)
            run_finish(run=run, status=status, final_answer=answer)
        run, _ = run_create(
            context=context,
            task="Find a hotel in Lisbon under 150 EUR.",
            agent_name="Atlas",
            framework="smolagents",
        )
        steps_append(
            run=run, items=[{"kind": "task", "task": "Find a hotel in Lisbon under 150 EUR."}]
        )

        for user, chat, text in [
            ("bob", "1", "Remind me to renew my passport."),
            ("ada", "support", "My booking code is ZX81."),
        ]:
            ctx, _ = context_get_or_create(keys={"demo": True, "user": user, "chat": chat})
            messages_append(
                context=ctx,
                items=[
                    {"role": "user", "name": user, "text": text},
                    {"role": "assistant", "name": "Atlas", "text": "Noted."},
                ],
            )
        tools_ctx = self._tool_conversation()
        self._support_chat()
        self._memories(trip=context, tools=tools_ctx)
        self.stdout.write(self.style.SUCCESS("demo data loaded"))

    def _tool_conversation(self) -> Context:
        """AgentScope-style turns: content blocks with tool_use / tool_result next to the text."""
        ctx, _ = context_get_or_create(
            keys={"demo": True, "user": "ada", "chat": "kyoto", "framework": "agentscope"},
            title="Ada checks Kyoto (tool calls)",
        )
        forecast = "\n".join(
            f"2026-04-{day:02d} {hour:02d}:00  Kyoto  {12 + (hour % 9)}C  "
            f"{'rain' if day % 3 == 0 else 'clear'}"
            for day in range(1, 18)
            for hour in range(0, 24)
        )[:24000]
        call = {
            "type": "tool_use",
            "id": "call_k1",
            "name": "get_weather",
            "input": {"city": "Kyoto", "days": 3},
        }
        result = {
            "type": "tool_result",
            "id": "call_k1",
            "name": "get_weather",
            "output": "Cloudy, 18C; rain on Thursday",
        }
        call2 = {
            "type": "tool_use",
            "id": "call_k2",
            "name": "hourly_forecast",
            "input": {"city": "Kyoto", "days": 17},
        }
        result2 = {
            "type": "tool_result",
            "id": "call_k2",
            "name": "hourly_forecast",
            "output": forecast,
        }
        text = "Cloudy at 18C for now; take an umbrella on Thursday."
        messages_append(
            context=ctx,
            items=[
                {
                    "role": "system",
                    "name": "system",
                    "text": "You are Friday, a helpful assistant with weather tools.",
                },
                {
                    "role": "user",
                    "name": "ada",
                    "text": "What's the weather in Kyoto this week?",
                    "content": [{"type": "text", "text": "What's the weather in Kyoto this week?"}],
                },
                # Nothing but a tool call: the dashboard shows the call and counts its tokens.
                {"role": "assistant", "name": "Friday", "text": "", "content": [call]},
                {"role": "system", "name": "system", "text": "", "content": [result]},
                {
                    "role": "assistant",
                    "name": "Friday",
                    "text": text,
                    "content": [{"type": "text", "text": text}],
                },
                {"role": "user", "name": "ada", "text": "And hour by hour for the next weeks?"},
                {
                    "role": "assistant",
                    "name": "Friday",
                    "text": "Fetching the hourly forecast.",
                    "content": [{"type": "text", "text": "Fetching the hourly forecast."}, call2],
                },
                {"role": "system", "name": "system", "text": "", "content": [result2]},
                {
                    "role": "assistant",
                    "name": "Friday",
                    "text": "Mostly clear; rain every third day.",
                    "tags": ["summary"],
                },
            ],
        )
        return ctx

    def _support_chat(self) -> None:
        """A support chat an operator has curated: an edited message and a pruned one."""
        ctx, _ = context_get_or_create(
            keys={"demo": True, "tenant": "acme", "user": "carol", "chat": "ticket-4711"},
            title="Carol's refund request",
        )
        rows = messages_append(
            context=ctx,
            items=[
                {
                    "role": "user",
                    "name": "carol",
                    "text": "Hi, I was charged twice for order A-1043.",
                },
                {
                    "role": "assistant",
                    "name": "Helper",
                    "text": (
                        "Sorry about that! Let me look.\n"
                        "I can see two charges of 49 EUR on 12 March."
                    ),
                },
                {
                    "role": "user",
                    "name": "carol",
                    "text": "My card number is 4111 1111 1111 1111 if you need it.",
                },
                {
                    "role": "assistant",
                    "name": "Helper",
                    "text": (
                        "No need for the card number. I have refunded one charge.\n"
                        "It reaches your account in 3 to 5 days."
                    ),
                },
                {"role": "user", "name": "carol", "text": "Thanks!", "tags": ["resolved"]},
            ],
        ).messages
        # The card number leaves every transcript (restorable from the audit log)...
        messages_set_pruned(
            context=ctx, ids=[rows[2].pk], pruned=True, actor=SEED, note="card number"
        )
        # ...and the answer is corrected: the audit keeps the old text beside the new one.
        message_edit(
            message=rows[3],
            actor=SEED,
            text=(
                "No need for the card number. I have refunded one charge of 49 EUR.\n"
                "It reaches your account in 3 to 5 days."
            ),
        )

    def _memories(self, *, trip: Context, tools: Context) -> None:
        memories_record(
            scope=memories.Scope(keys={"demo": True, "user": "ada"}),
            actor=SEED,
            thinking="Learned across Ada's chats.",
            items=[
                {
                    "content": "Ada prefers window seats and trains over short flights.",
                    "kind": "preference",
                    "keywords": ["travel", "seats"],
                },
                {"content": "Ada is vegetarian.", "kind": "fact", "keywords": ["food"]},
                {
                    "content": "Ada travels with a carry-on only.",
                    "kind": "preference",
                    "keywords": ["luggage"],
                },
            ],
        )
        memories_record(
            scope=memories.Scope(context=trip),
            actor=SEED,
            items=[
                {
                    "content": "Trip planned for late April: Paris, then Lisbon.",
                    "kind": "task",
                    "keywords": ["itinerary"],
                }
            ],
        )
        memories_record(
            scope=memories.Scope(context=tools),
            actor=SEED,
            items=[
                {
                    "content": "get_weather takes city=..., not town=...",
                    "kind": "tool",
                    "keywords": ["get_weather"],
                }
            ],
        )
        answer = Message.objects.filter(context=tools, tags__contains=["summary"]).first()
        if answer is not None:
            memory_promote(actor=SEED, message=answer, kind="fact")
