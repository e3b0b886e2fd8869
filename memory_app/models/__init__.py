"""The domain: contexts, messages, runs, steps, tool calls, memory records, embeddings, audit, keys.

Integrity lives in the database (the constraints and indexes of the modules below), not in
`save()` overrides. Writes go through `memory_app.services`; reads through `memory_app.queries`.
"""

# Django registers a models package's models when it imports this module, and callers import
# them from here: every model and public name of the modules below, so that
# `from memory_app.models import X` reaches any of them.
from memory_app.models.access import ApiKey, AuditEvent
from memory_app.models.checkpoints import Checkpoint, CheckpointBlob, CheckpointWrite
from memory_app.models.contexts import Context, ContextKey
from memory_app.models.embeddings import (
    Embedding,
    EmbeddingModel,
    EmbeddingRetry,
    EmbeddingWaiting,
    MemoryEmbedding,
    MemoryEmbeddingRetry,
    MemoryEmbeddingWaiting,
)
from memory_app.models.memories import MemoryRecord, MemoryVersion, StoreNamespace
from memory_app.models.messages import Message, MessageSearch
from memory_app.models.retention import RetentionKind, RetentionPolicy
from memory_app.models.runs import (
    RUN_COST,
    RUN_DURATION,
    RUN_STARTED,
    Run,
    RunSearch,
    SpanQueue,
    Step,
    ToolCall,
    TraceSpan,
)
from memory_app.models.scores import Comment, Label, ReviewQueue, Score, ScoreKind
from memory_app.models.shared import (
    FTS_CONFIG,
    MemoryKind,
    MemoryOrigin,
    MemoryReview,
    MemoryStatus,
    MessageRole,
    OrderedJSONField,
    RunStatus,
    StepKind,
    keys_digest,
)

__all__ = [
    "FTS_CONFIG",
    "RUN_COST",
    "RUN_DURATION",
    "RUN_STARTED",
    "ApiKey",
    "AuditEvent",
    "Checkpoint",
    "CheckpointBlob",
    "CheckpointWrite",
    "Comment",
    "Context",
    "ContextKey",
    "Embedding",
    "EmbeddingModel",
    "EmbeddingRetry",
    "EmbeddingWaiting",
    "Label",
    "MemoryEmbedding",
    "MemoryEmbeddingRetry",
    "MemoryEmbeddingWaiting",
    "MemoryKind",
    "MemoryOrigin",
    "MemoryRecord",
    "MemoryReview",
    "MemoryStatus",
    "MemoryVersion",
    "StoreNamespace",
    "Message",
    "MessageRole",
    "OrderedJSONField",
    "MessageSearch",
    "RetentionKind",
    "RetentionPolicy",
    "ReviewQueue",
    "Run",
    "RunSearch",
    "RunStatus",
    "Score",
    "ScoreKind",
    "Step",
    "StepKind",
    "ToolCall",
    "SpanQueue",
    "TraceSpan",
    "keys_digest",
]
