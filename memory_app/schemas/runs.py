"""Runs, steps and tool calls in and out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, AwareDatetime, Field

from memory_app.models import RunStatus, StepKind
from memory_app.queries.dashboard import MAX_QUERY_CHARS
from memory_app.queries.lists import MAX_LIMIT
from memory_app.queries.runs_table import ORDERS as RUN_ORDERS
from memory_app.schemas.fields import (
    ClientId,
    FinishStatus,
    Int32,
    Int64,
    JsonObject,
    JsonValue,
    PlainIn,
    Seconds,
    Short,
    Text,
    _examples,
)
from memory_app.services.messages import MAX_BATCH

Kind = Literal[tuple(StepKind.values)]  # type: ignore[valid-type]


class RunIn(Schema):
    model_config = _examples(
        {
            "client_id": "run-2025-01-01-a",
            "task": "What's the weather in Paris?",
            "system_prompt": "You are a helpful agent.",
            "agent_name": "weather-bot",
            "framework": "smolagents",
            "metadata": {"model": "gpt-4o"},
        }
    )
    client_id: ClientId | None = None
    task: Text = ""
    system_prompt: Text = ""
    agent_name: Short(200) = ""
    framework: Short(50) = ""
    metadata: JsonObject = Field(default_factory=dict)
    started_at: AwareDatetime | None = None


class RunFinishIn(Schema):
    model_config = _examples({"status": "success", "final_answer": "It is sunny, 21°C."})
    status: FinishStatus
    final_answer: JsonValue = None
    input_tokens: Int64 | None = None
    output_tokens: Int64 | None = None
    total_tokens: Int64 | None = None
    finished_at: AwareDatetime | None = None


RUN_EXAMPLE = {
    "id": 3,
    "context_id": 7,
    "client_id": "run-2025-01-01-a",
    "task": "What's the weather in Paris?",
    "system_prompt": "You are a helpful agent.",
    "agent_name": "weather-bot",
    "framework": "smolagents",
    "status": "running",
    "final_answer": None,
    "input_tokens": None,
    "output_tokens": None,
    "total_tokens": None,
    "started_at": "2025-01-01T10:00:00Z",
    "finished_at": None,
    "duration": None,
    "step_count": 0,
    "error_count": 0,
    "metadata": {},
    "created_at": "2025-01-01T10:00:00Z",
    "updated_at": "2025-01-01T10:00:00Z",
}


class RunOut(Schema):
    model_config = _examples(RUN_EXAMPLE)
    id: int
    context_id: int
    client_id: str | None
    task: str
    system_prompt: str
    agent_name: str
    framework: str
    status: str
    final_answer: Any
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    started_at: datetime | None
    finished_at: datetime | None
    duration: float | None
    step_count: int
    error_count: int
    metadata: Any
    created_at: datetime
    updated_at: datetime


class RunPage(Schema):
    model_config = _examples({"items": [RUN_EXAMPLE], "has_more": False, "next_cursor": None})
    items: list[RunOut]
    has_more: bool
    next_cursor: int | None


RUN_ROW_EXAMPLE = {
    "id": 3,
    "context_id": 7,
    "context_keys": {"user": "ada"},
    "client_id": "run-2025-01-01-a",
    "task": "What's the weather in Paris?",
    "agent_name": "weather-bot",
    "framework": "smolagents",
    "status": "failed",
    "model_names": ["gpt-4o"],
    "started_at": "2025-01-01T10:00:00Z",
    "finished_at": "2025-01-01T10:00:12Z",
    "duration": 12.0,
    "step_count": 4,
    "tool_call_count": 3,
    "error_count": 1,
    "input_tokens": 5200,
    "output_tokens": 310,
    "total_tokens": 5510,
    "cost": 0.0161,
    "created_at": "2025-01-01T10:00:00Z",
    "scores": [{"name": "correct", "kind": "boolean", "value": False, "author": "user:ada"}],
    "labels": ["regression"],
}


class RunScoreOut(Schema):
    name: str
    kind: str
    value: bool | float | str
    author: str


class RunRowOut(Schema):
    """A run as the runs table lists it: no system prompt, final answer or metadata (`GET
    /runs/{id}` has them)."""

    model_config = _examples(RUN_ROW_EXAMPLE)
    id: int
    context_id: int
    context_keys: Any = Field(description="the keys of the run's context")
    client_id: str | None
    task: str
    agent_name: str
    framework: str
    status: str
    model_names: list[str] = Field(
        description="the models its steps and its metadata.model name, sorted"
    )
    started_at: datetime | None
    finished_at: datetime | None
    duration: float | None
    step_count: int
    tool_call_count: int
    error_count: int
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    cost: float | None = Field(
        description="USD: the steps' reported costs, the rest priced from their tokens when "
        "they were written; null when no step's cost is known"
    )
    created_at: datetime
    scores: list[RunScoreOut] = Field(description="the scores on the run itself, by name")
    labels: list[str] = Field(description="the labels on the run itself")

    @staticmethod
    def resolve_labels(run):
        return [label.name for label in run.labels]

    @staticmethod
    def resolve_context_keys(run) -> Any:
        return run.context.keys


class RunRowPage(Schema):
    model_config = _examples(
        {"items": [RUN_ROW_EXAMPLE], "has_more": True, "next_cursor": "WyIyMDI1LTAxLTAxIiwzXQ"}
    )
    items: list[RunRowOut]
    has_more: bool
    next_cursor: str | None = Field(description="pass back as `cursor` for the next page")


RunStatusName = Literal[tuple(RunStatus.values)]  # type: ignore[valid-type]
RunOrder = Literal[tuple(RUN_ORDERS)]  # type: ignore[valid-type]


def _in_utc(value: datetime) -> datetime:
    # PostgreSQL takes offsets up to ±15:59 where Python takes ±23:59: the instant in UTC is
    # what the filter compares, and an instant beyond the calendar's ends is refused here.
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the date and time is out of range") from None


# A date and time with its offset, as the UTC instant it names.
Moment = Annotated[AwareDatetime, AfterValidator(_in_utc)]


class RunTableQuery(Schema):
    """The filters of `GET /runs`, those of the dashboard's runs table."""

    status: list[RunStatusName] = Field(
        default_factory=list, description="any of these statuses (repeat the parameter)"
    )
    has_error: bool = Field(False, description="only runs with at least one erroneous step")
    error: str = Field("", max_length=MAX_QUERY_CHARS, description="text in a step's error")
    model: str = Field("", max_length=200, description="a model the run used")
    keys: str | None = Field(
        None,
        description='JSON object; runs of contexts whose keys contain it, e.g. {"user": "ada"}',
    )
    started_after: Moment | None = Field(None, description="started at or after")
    started_before: Moment | None = Field(None, description="started before")
    min_duration: float | None = Field(None, ge=0, description="seconds")
    min_cost: float | None = Field(None, ge=0, description="USD")
    sort: RunOrder = Field(
        "started", description="started (newest first), oldest, duration or cost (largest first)"
    )
    score: str = Field("", max_length=100, description="runs with a score of this name")
    score_value: str = Field(
        "", max_length=200, description="…whose value is this: true/false, a number, a category"
    )
    score_min: float | None = Field(None, allow_inf_nan=False, description="…at least this")
    score_max: float | None = Field(None, allow_inf_nan=False, description="…at most this")
    label: str = Field("", max_length=100, description="runs with this label")
    cursor: str | None = Field(None, max_length=500, description="the last page's `next_cursor`")
    limit: int = Field(50, ge=1, le=MAX_LIMIT)


class ToolCallIn(PlainIn):
    call_id: Short(200) = ""
    name: Annotated[Short(200), Field(min_length=1)]
    arguments: JsonValue = None
    output: Text | None = None
    success: bool | None = None
    duration: Seconds | None = None


class StepIn(PlainIn):
    client_id: ClientId | None = None
    kind: Kind
    step_number: Int32 | None = None
    task: Text | None = None
    plan: Text | None = None
    model_input_messages: JsonValue = None
    model_output_message: JsonValue = None
    model_output: JsonValue = None
    code_action: Text | None = None
    observations: Text | None = None
    action_output: JsonValue = None
    error_type: Short(200) | None = None
    error_message: Text | None = None
    start_time: Seconds | None = None
    end_time: Seconds | None = None
    duration: Seconds | None = None
    # Halved range: the server adds input + output when total is missing.
    input_tokens: Annotated[int, Field(ge=0, le=2**30 - 1)] | None = None
    output_tokens: Annotated[int, Field(ge=0, le=2**30 - 1)] | None = None
    total_tokens: Int32 | None = None
    model: Short(200) = Field("", description="the model that wrote this step, e.g. gpt-4o")
    cost: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] | None = Field(
        None, description="what the step's model calls cost, in USD, if the agent knows"
    )
    is_final_answer: bool = False
    payload: JsonValue = Field(None, description="the framework's own step dict, kept verbatim")
    tool_calls: list[ToolCallIn] = Field(default_factory=list, max_length=1000)

    def to_item(self) -> dict[str, Any]:
        return self.model_dump()


STEP_IN_EXAMPLE = {
    "client_id": "run-a/step-1",
    "kind": "action",
    "step_number": 1,
    "model_output": "I will call the weather tool.",
    "tool_calls": [{"call_id": "call_1", "name": "weather", "arguments": {"city": "Paris"}}],
    "observations": "sunny, 21°C",
    "start_time": 1735725600.0,
    "end_time": 1735725601.5,
    "input_tokens": 120,
    "output_tokens": 30,
}


class StepsIn(PlainIn):
    model_config = _examples({"steps": [STEP_IN_EXAMPLE]})
    steps: list[StepIn] = Field(min_length=1, max_length=MAX_BATCH)


class ToolCallOut(Schema):
    id: int
    position: int
    call_id: str
    name: str
    arguments: Any
    output: str | None
    success: bool | None
    duration: float | None


STEP_EXAMPLE = {
    "id": 11,
    "run_id": 3,
    "position": 1,
    "client_id": "run-a/step-1",
    "kind": "action",
    "step_number": 1,
    "task": None,
    "plan": None,
    "model_input_messages": None,
    "model_output_message": None,
    "model_output": "I will call the weather tool.",
    "code_action": None,
    "observations": "sunny, 21°C",
    "action_output": None,
    "error_type": None,
    "error_message": None,
    "start_time": 1735725600.0,
    "end_time": 1735725601.5,
    "duration": 1.5,
    "input_tokens": 120,
    "output_tokens": 30,
    "total_tokens": 150,
    "is_final_answer": False,
    "payload": None,
    "pruned_at": None,
    "pruned_by": "",
    "created_at": "2025-01-01T10:00:01Z",
    "tool_calls": [
        {
            "id": 5,
            "position": 1,
            "call_id": "call_1",
            "name": "weather",
            "arguments": {"city": "Paris"},
            "output": None,
            "success": None,
            "duration": None,
        }
    ],
}


class StepOut(Schema):
    model_config = _examples(STEP_EXAMPLE)
    id: int
    run_id: int
    position: int
    client_id: str | None
    kind: str
    step_number: int | None
    task: str | None
    plan: str | None
    model_input_messages: Any
    model_output_message: Any
    model_output: Any
    code_action: str | None
    observations: str | None
    action_output: Any
    error_type: str | None
    error_message: str | None
    start_time: float | None
    end_time: float | None
    duration: float | None
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    model: str = ""
    cost: float | None = None
    is_final_answer: bool
    payload: Any
    pruned_at: datetime | None
    pruned_by: str
    created_at: datetime
    tool_calls: list[ToolCallOut]

    @staticmethod
    def resolve_tool_calls(obj) -> list:
        return list(obj.tool_calls.all())


class StepsAppendOut(Schema):
    model_config = _examples({"steps": [STEP_EXAMPLE], "created": [True]})
    steps: list[StepOut]
    created: list[bool]


class StepPage(Schema):
    model_config = _examples({"items": [STEP_EXAMPLE], "has_more": False, "next_cursor": None})
    items: list[StepOut]
    has_more: bool
    next_cursor: int | None = Field(None, description="position to pass as `after`")


class RunDetailOut(Schema):
    """A run with the first page of its steps; page on with GET /runs/{id}/steps?after=..."""

    model_config = _examples(
        {
            "run": RUN_EXAMPLE,
            "steps": {"items": [STEP_EXAMPLE], "has_more": False, "next_cursor": None},
        }
    )
    run: RunOut
    steps: StepPage


COMPARED_STEP_EXAMPLE = {
    "position": 3,
    "kind": "action",
    "tools": ["browse"],
    "tokens": 612,
    "cost": 0.0021,
    "duration": 1.4,
    "error_type": None,
}
COMPARED_RUN_EXAMPLE = {
    "id": 3,
    "context_id": 7,
    "status": "success",
    "step_count": 4,
    "error_count": 0,
    "total_tokens": 5510,
    "cost": 0.0161,
    "duration": 12.0,
}


class ComparedStepOut(Schema):
    position: int
    kind: str
    tools: list[str] = Field(description="the names of the tools it called, in order")
    tokens: int | None
    cost: float | None = Field(description="USD, as reported or priced from its tokens")
    duration: float | None
    error_type: str | None


class ComparedRowOut(Schema):
    a: ComparedStepOut | None = Field(description="run a's step (null: only run b has one here)")
    b: ComparedStepOut | None
    differences: list[Literal["missing", "kind", "tool", "arguments", "output", "error"]] = Field(
        description="how the two steps differ; empty when they called the same tools with the "
        "same arguments (as JSON values) and got the same outputs and errors"
    )
    tokens_delta: int | None = Field(description="b − a; null when either is unknown")
    cost_delta: float | None
    duration_delta: float | None


class ComparedRunOut(Schema):
    id: int
    context_id: int
    status: str
    step_count: int
    error_count: int
    total_tokens: int | None
    cost: float | None
    duration: float | None


class RunComparisonOut(Schema):
    """Run `a` (the baseline) against run `b`: their steps aligned, the first row that differs,
    the totals' differences (b − a)."""

    model_config = _examples(
        {
            "a": COMPARED_RUN_EXAMPLE,
            "b": {**COMPARED_RUN_EXAMPLE, "id": 4, "status": "failed", "error_count": 1},
            "first_divergence": 2,
            "tokens_delta": 300,
            "cost_delta": 0.0009,
            "duration_delta": -1.5,
            "rows": [
                {
                    "a": {**COMPARED_STEP_EXAMPLE, "tools": ["fetch"]},
                    "b": COMPARED_STEP_EXAMPLE,
                    "differences": ["tool"],
                    "tokens_delta": 0,
                    "cost_delta": 0.0,
                    "duration_delta": 0.2,
                }
            ],
        }
    )
    a: ComparedRunOut
    b: ComparedRunOut
    first_divergence: int | None = Field(description="index in `rows` of the first that differs")
    tokens_delta: int | None
    cost_delta: float | None
    duration_delta: float | None
    rows: list[ComparedRowOut]
