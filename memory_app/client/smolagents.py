"""smolagents adapters: a step callback that streams a live run, and rehydration of a stored run.

Use:

    recorder = RunRecorder(client, context_id)
    agent = ToolCallingAgent(tools=[...], model=model, step_callbacks=[recorder])
    with recorder:                 # marks the run failed if agent.run raises
        agent.run("What's the weather in Paris?")

    agent.memory.steps = load_steps(client, run_id)   # then agent.run(task, reset=False)
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from memory_app.client.client import MemoryClient


def _jsonable(step_dict: dict) -> dict:
    # observations_images are raw PIL bytes: not JSON and not rebuildable (no size or mode).
    return json.loads(json.dumps(step_dict, default=lambda _: None))


class RunRecorder:
    """A smolagents step callback: each step reaches the server as soon as it completes.

    Registered as `step_callbacks=[recorder]` it is called for every ActionStep; it then also
    sends the task and planning steps that came before (they are in `agent.memory.steps`). The
    run is created at the first step and marked finished when a final answer (or the max-steps
    error) arrives; used as a context manager it marks the run failed when the agent raises.
    """

    def __init__(
        self,
        client: MemoryClient,
        context_id: int,
        *,
        agent_name: str = "",
        run_client_id: str | None = None,
    ):
        self.client = client
        self.context_id = context_id
        self.agent_name = agent_name
        self.run_client_id = run_client_id
        self.run_id: int | None = None
        self._sent: set[int] = set()  # id() of each step object sent
        self._start: int | None = None
        self._finished = False

    def __call__(self, memory_step, agent=None) -> None:
        from smolagents.memory import ActionStep, TaskStep

        if agent is None:
            return
        steps = agent.memory.steps
        # The current run starts at the last TaskStep (earlier ones belong to reset=False history).
        start = (
            max(i for i, s in enumerate(steps) if isinstance(s, TaskStep))
            if any(isinstance(s, TaskStep) for s in steps)
            else 0
        )
        if self._start is not None and start != self._start:
            self._reset_for_new_run()
        self._start = start
        pending = [s for s in steps[start:] if id(s) not in self._sent]
        if memory_step is not None and id(memory_step) not in self._sent | {id(s) for s in pending}:
            if hasattr(memory_step, "dict") and type(memory_step).__name__ != "FinalAnswerStep":
                pending.append(memory_step)
        if self.run_id is None:
            self._create_run(agent)
        if pending:
            self.client.append_smolagents_steps(
                self.run_id,
                steps=[_jsonable(s.dict()) for s in pending],
                start_index=len(self._sent) + 1,
            )
            self._sent.update(id(s) for s in pending)
        if isinstance(memory_step, ActionStep) and not self._finished:
            error = getattr(memory_step, "error", None)
            if type(error).__name__ == "AgentMaxStepsError":
                self._finish("max_steps_error", memory_step.action_output)
            elif memory_step.is_final_answer:
                self._finish("success", _final_answer(memory_step))

    def _create_run(self, agent) -> None:
        self.run_client_id = self.run_client_id or f"smol-{uuid.uuid4().hex}"
        run = self.client.create_run(
            self.context_id,
            client_id=self.run_client_id,
            task=getattr(agent, "task", "") or "",
            system_prompt=agent.memory.system_prompt.system_prompt,
            agent_name=self.agent_name or getattr(agent, "name", "") or "",
            framework="smolagents",
        )
        self.run_id = run["id"]

    def _finish(self, status: str, final_answer: Any = None) -> None:
        self.client.finish_run(
            self.run_id,
            status=status,
            final_answer=_jsonable({"a": final_answer})["a"],
            context_id=self.context_id,
        )
        self._finished = True

    def _reset_for_new_run(self) -> None:
        self.run_id, self.run_client_id, self._sent, self._finished = None, None, set(), False

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and self.run_id is not None and not self._finished:
            self._finish("failed", None)


def _final_answer(step) -> Any:
    if step.action_output is not None:
        return step.action_output
    for call in step.tool_calls or []:
        if call.name == "final_answer":
            args = call.arguments
            return args.get("answer") if isinstance(args, dict) and "answer" in args else args
    return None


def steps_from_dicts(step_dicts: list[dict[str, Any]], *, logger=None) -> list:
    """Rebuild smolagents memory steps from `get_full_steps()`-shaped dicts.

    The rebuilt steps' `dict()` equals the stored dicts, except for what smolagents cannot take
    back: images (stored as raw bytes) and the model's provider-specific `raw` response.
    """
    from smolagents.memory import TaskStep
    from smolagents.monitoring import AgentLogger, LogLevel

    logger = logger or AgentLogger(level=LogLevel.OFF)
    steps = []
    for d in step_dicts:
        if "step_number" in d:
            steps.append(_action_step(d, logger))
        elif "plan" in d:
            steps.append(_planning_step(d))
        elif "task" in d:
            steps.append(TaskStep(task=d["task"]))
    return steps


def _action_step(d: dict[str, Any], logger):
    from smolagents.memory import ActionStep, ToolCall

    return ActionStep(
        step_number=d["step_number"],
        timing=_timing(d.get("timing")),
        model_input_messages=[_message(m) for m in d["model_input_messages"]]
        if d.get("model_input_messages")
        else None,
        tool_calls=[
            ToolCall(
                name=tc["function"]["name"],
                arguments=tc["function"]["arguments"],
                id=tc["id"],
            )
            for tc in d.get("tool_calls") or []
        ]
        or None,
        error=_error(d.get("error"), logger),
        model_output_message=_message(d.get("model_output_message")),
        model_output=d.get("model_output"),
        code_action=d.get("code_action"),
        observations=d.get("observations"),
        action_output=d.get("action_output"),
        token_usage=_usage(d.get("token_usage")),
        is_final_answer=bool(d.get("is_final_answer")),
    )


def _planning_step(d: dict[str, Any]):
    from smolagents.memory import PlanningStep

    return PlanningStep(
        model_input_messages=[_message(m) for m in d.get("model_input_messages") or []],
        model_output_message=_message(d.get("model_output_message")),
        plan=d["plan"],
        timing=_timing(d.get("timing")),
        token_usage=_usage(d.get("token_usage")),
    )


def _timing(d):
    from smolagents.monitoring import Timing

    return (
        Timing(start_time=d["start_time"], end_time=d.get("end_time"))
        if d
        else Timing(start_time=0.0)
    )


def _usage(d):
    from smolagents.monitoring import TokenUsage

    return (
        TokenUsage(input_tokens=d["input_tokens"], output_tokens=d["output_tokens"]) if d else None
    )


def _message(d):
    from smolagents.models import ChatMessage

    if d is None:
        return None
    return ChatMessage.from_dict(
        dict(d), raw=d.get("raw"), token_usage=_usage(d.get("token_usage"))
    )


def _error(d, logger):
    """The stored error as the smolagents error class it names (AgentError when it names none)."""
    from smolagents import utils

    if not d:
        return None
    cls = getattr(utils, d.get("type") or "", None)
    if not (isinstance(cls, type) and issubclass(cls, utils.AgentError)):
        cls = utils.AgentError
    return cls(d.get("message", ""), logger)


def load_steps(client: MemoryClient, run_id: int, *, logger=None) -> list:
    """The stored run's steps as smolagents objects: `agent.memory.steps = load_steps(...)`."""
    return steps_from_dicts(client.export_smolagents_run(run_id)["steps"], logger=logger)


def import_run(
    client: MemoryClient, context_id: int, agent, *, client_id: str | None = None
) -> dict:
    """Store a finished agent's memory (`get_full_steps()` + system prompt) in one call."""
    return client.import_smolagents_run(
        context_id,
        steps=[_jsonable(s) for s in agent.memory.get_full_steps()],
        system_prompt=agent.memory.system_prompt.system_prompt,
        client_id=client_id,
    )
