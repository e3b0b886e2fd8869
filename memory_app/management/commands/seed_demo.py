"""`manage.py seed_demo`: demo data an operator can explore on a first `make run`.

One travel-assistant context with 60 messages and three runs (tool calls, a tool error that the
agent recovers from, planning, a final answer), plus a few smaller contexts for the list. Loaded
once: the demo contexts carry `"demo": true` in their keys and are skipped when present.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand
from django.db import transaction

from memory_app import logbook
from memory_app.models import Context, RunStatus

CITIES = [
    ("Paris", "Sunny, 22C", "the Musée d'Orsay"),
    ("Lisbon", "Clear, 26C", "the Alfama quarter"),
    ("Oslo", "Rain, 9C", "the Munch museum"),
    ("Kyoto", "Cloudy, 18C", "Fushimi Inari at dawn"),
    ("Montreal", "Snow, -4C", "the underground city"),
]


def _conversation() -> list[dict]:
    messages = [
        {"role": "system", "name": "system", "text": "You are Atlas, a concise travel assistant. Use tools for live data."},
    ]
    for i in range(6):
        for city, weather, sight in CITIES:
            if len(messages) >= 60:
                break
            turn = i * len(CITIES)
            messages.append({"role": "user", "name": "ada", "text": f"What should I know before visiting {city}? (question {turn + 1})"})
            messages.append({
                "role": "assistant", "name": "Atlas",
                "text": (
                    f"**{city}** right now: {weather}.\n\n- Don't miss {sight}.\n- Book ahead on weekends.\n\n"
                    "```python\nitinerary = plan_day(city=%r, pace='relaxed')\n```" % city
                ),
                "tags": ["travel", city.lower()],
            })
    return messages[:60]


def _steps_ok(now: float) -> list[dict]:
    return [
        {"kind": "task", "task": "What's the weather in Paris, and what should I pack?"},
        {
            "kind": "planning", "plan": "1. Get the weather for Paris.\n2. Suggest what to pack.",
            "start_time": now, "end_time": now + 0.8, "input_tokens": 310, "output_tokens": 42,
        },
        {
            "kind": "action", "step_number": 1, "model_output": "I will check the weather.",
            "tool_calls": [{"call_id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}, "output": "Sunny, 22C", "success": True, "duration": 0.21}],
            "observations": "Sunny, 22C", "start_time": now + 0.8, "end_time": now + 2.1,
            "input_tokens": 420, "output_tokens": 18,
        },
        {
            "kind": "action", "step_number": 2, "model_output": "Light clothes and sunglasses.",
            "tool_calls": [{"call_id": "call_2", "name": "final_answer", "arguments": {"answer": "Sunny, 22C: pack light clothes and sunglasses."}}],
            "observations": "Sunny, 22C: pack light clothes and sunglasses.", "is_final_answer": True,
            "start_time": now + 2.1, "end_time": now + 3.0, "input_tokens": 470, "output_tokens": 25,
        },
    ]


def _steps_with_error(now: float) -> list[dict]:
    return [
        {"kind": "task", "task": "Compare the weather in Oslo and Kyoto."},
        {
            "kind": "action", "step_number": 1, "model_output": "Checking Oslo first.",
            "code_action": "oslo = get_weather(city='Oslo')\nprint(oslo)",
            "tool_calls": [{"call_id": "call_2", "name": "python_interpreter", "arguments": "oslo = get_weather(city='Oslo')\nprint(oslo)", "output": "Rain, 9C", "success": True}],
            "observations": "Execution logs:\nRain, 9C\nLast output from code snippet:\nNone",
            "start_time": now, "end_time": now + 1.4, "input_tokens": 512, "output_tokens": 40,
        },
        {
            "kind": "action", "step_number": 2, "model_output": "Now Kyoto.",
            "code_action": "kyoto = get_weather(town='Kyoto')",
            "tool_calls": [{"call_id": "call_3", "name": "python_interpreter", "arguments": "kyoto = get_weather(town='Kyoto')", "success": False}],
            "error_type": "AgentExecutionError",
            "error_message": "Code execution failed at line 'kyoto = get_weather(town='Kyoto')' due to: TypeError: get_weather() got an unexpected keyword argument 'town'",
            "start_time": now + 1.4, "end_time": now + 2.9, "input_tokens": 640, "output_tokens": 31,
        },
        {
            "kind": "action", "step_number": 3, "model_output": "Retrying with the right argument.",
            "code_action": "kyoto = get_weather(city='Kyoto')\nfinal_answer(f'Oslo: Rain, 9C; Kyoto: {kyoto}')",
            "tool_calls": [{"call_id": "call_4", "name": "python_interpreter", "arguments": "kyoto = get_weather(city='Kyoto')\nfinal_answer(f'Oslo: Rain, 9C; Kyoto: {kyoto}')", "output": "Oslo: Rain, 9C; Kyoto: Cloudy, 18C", "success": True}],
            "observations": "Execution logs:\nLast output from code snippet:\nOslo: Rain, 9C; Kyoto: Cloudy, 18C",
            "action_output": "Oslo: Rain, 9C; Kyoto: Cloudy, 18C", "is_final_answer": True,
            "start_time": now + 2.9, "end_time": now + 4.6, "input_tokens": 780, "output_tokens": 52,
        },
    ]


class Command(BaseCommand):
    help = "Load demo contexts, messages and runs (once)."

    @transaction.atomic
    def handle(self, *args, **options):
        if Context.objects.filter(keys__demo=True).exists():
            self.stdout.write("demo data already present")
            return
        context, _ = logbook.context_get_or_create(
            keys={"demo": True, "user": "ada", "chat": "trip-planning"}, title="Ada plans a trip"
        )
        logbook.messages_append(context=context, items=_conversation())
        now = time.time() - 3600
        for task_steps, status, answer, agent, framework in [
            (_steps_ok(now), RunStatus.SUCCESS, "Sunny, 22C: pack light clothes and sunglasses.", "Atlas", "smolagents"),
            (_steps_with_error(now + 600), RunStatus.SUCCESS, "Oslo: Rain, 9C; Kyoto: Cloudy, 18C", "Atlas-code", "smolagents"),
        ]:
            run, _ = logbook.run_create(
                context=context, task=task_steps[0]["task"], agent_name=agent, framework=framework,
                system_prompt="You are an expert assistant who can solve any task using tools.",
            )
            logbook.steps_append(run=run, items=task_steps)
            logbook.run_finish(run=run, status=status, final_answer=answer)
        run, _ = logbook.run_create(context=context, task="Find a hotel in Lisbon under 150 EUR.", agent_name="Atlas", framework="smolagents")
        logbook.steps_append(run=run, items=[{"kind": "task", "task": "Find a hotel in Lisbon under 150 EUR."}])

        for user, chat, text in [("bob", "1", "Remind me to renew my passport."), ("ada", "support", "My booking code is ZX81.")]:
            ctx, _ = logbook.context_get_or_create(keys={"demo": True, "user": user, "chat": chat})
            logbook.messages_append(context=ctx, items=[
                {"role": "user", "name": user, "text": text},
                {"role": "assistant", "name": "Atlas", "text": "Noted."},
            ])
        self.stdout.write(self.style.SUCCESS("demo data loaded"))
