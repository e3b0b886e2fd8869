"""Embedding providers behind one small interface, and the queue of items waiting for vectors.

Writes never wait for a provider: they only enqueue pending `Embedding` rows (vector NULL) that
`manage.py embed_worker` fills in.
"""

from __future__ import annotations

from django.conf import settings

from memory_app.models import Embedding, Message


def active_model_name() -> str | None:
    """The model name new items are queued for, or None when no provider is configured."""
    if settings.AGENTMEMORY_EMBEDDING_PROVIDER == "none":
        return None
    return settings.AGENTMEMORY_EMBEDDING_MODEL or settings.AGENTMEMORY_EMBEDDING_PROVIDER


def enqueue_messages(messages: list[Message]) -> None:
    model = active_model_name()
    if model is None or not messages:
        return
    Embedding.objects.bulk_create(
        [Embedding(message=m, context_id=m.context_id, model=model) for m in messages if m.text],
        ignore_conflicts=True,
    )


def requeue_message(message: Message) -> None:
    """The text changed: every stored vector of this message is stale."""
    Embedding.objects.filter(message=message).update(vector=None, embedded_at=None, attempts=0, next_attempt_at=None)
    enqueue_messages([message])
