"""The columns the dataset's COPY statements write, table by table, in the order the loader's
rows hold their values."""

from __future__ import annotations

MESSAGE_COLUMNS = (
    "id",
    "context_id",
    "seq",
    "role",
    "name",
    "text",
    "tags",
    "metadata",
    "token_count",
    "tokenizer",
    "source_timestamp",
    "created_at",
    "updated_at",
    "pruned_at",
    "pruned_by",
)
# Steps and tool calls lead with their run's context (the loader prepends it to each row).
STEP_COLUMNS = (
    "context_id",
    "id",
    "run_id",
    "position",
    "kind",
    "step_number",
    "task",
    "plan",
    "model_output",
    "code_action",
    "observations",
    "error_type",
    "error_message",
    "start_time",
    "end_time",
    "duration",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "is_final_answer",
    "pruned_by",
    "created_at",
)
TOOLCALL_COLUMNS = (
    "context_id",
    "id",
    "step_id",
    "position",
    "call_id",
    "name",
    "arguments",
    "output",
    "success",
    "duration",
    "created_at",
)
RUN_COLUMNS = (
    "id",
    "context_id",
    "task",
    "system_prompt",
    "agent_name",
    "framework",
    "status",
    "final_answer",
    "started_at",
    "finished_at",
    "duration",
    "step_count",
    "error_count",
    "last_position",
    "metadata",
    "created_at",
    "updated_at",
)
CONTEXT_COLUMNS = (
    "id",
    "keys",
    "keys_digest",
    "title",
    "metadata",
    "compressed_summary",
    "last_seq",
    "message_count",
    "token_count",
    "run_count",
    "created_at",
    "updated_at",
    "last_activity_at",
)
EMBEDDING_COLUMNS = ("message_id", "context_id", "model", "dimensions", "vector")
EMBEDDING_TYPES = ["int8", "int8", "text", "int4", "vector"]


def copy_sql(table: str, columns: tuple[str, ...], binary: bool = False) -> str:
    return f"COPY {table} ({', '.join(columns)}) FROM STDIN" + (
        " WITH (FORMAT BINARY)" if binary else ""
    )
