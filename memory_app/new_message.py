"""A message on its way in: the one typed shape every writer builds (REST and MCP schemas,
framework adapters, scripts) and the write path stores as it is. Pure Python, so the framework
mappings can build it without Django."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The fields a repeat of a client id must match to be the same message.
MESSAGE_FIELDS = (
    "role",
    "name",
    "text",
    "content",
    "tags",
    "metadata",
    "run_id",
    "step_id",
    "source_timestamp",
)


@dataclass(slots=True, kw_only=True)
class NewMessage:
    """A message on its way in, one typed shape from the request schema to the stored row: the
    REST and MCP schemas, the framework adapters and imports build it, and the write path reads
    it as it is (repeat check, seq allocation, INSERT or COPY, client vector)."""

    role: str
    name: str = ""
    text: str = ""
    content: list[dict[str, Any]] | None = None
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    run_id: int | None = None
    step_id: int | None = None
    source_timestamp: str = ""
    client_id: str | None = None
    # Not among MESSAGE_FIELDS: a repeat that differs only in key order is the same message.
    key_order: Any = None
    vector: Any = None  # a list of numbers or a numpy array, checked by client_vectors
    vector_model: str | None = None

    def __post_init__(self) -> None:
        # Absent and empty are one value in the row, so a repeat compares equal either way.
        self.name = self.name or ""
        self.text = self.text or ""
        self.tags = list(self.tags or ())
        self.metadata = self.metadata or {}
        self.source_timestamp = self.source_timestamp or ""
        self.client_id = self.client_id or None
