"""Domain errors: what the writes, reads and searches raise, and the API, MCP tools and dashboard
map to HTTP statuses (the REST map is in `memory_app.api.app`). No Django or project imports, so any
module may raise them."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """Base for errors the API and views map to HTTP statuses."""


class NotFound(DomainError):
    """Unknown, or not visible to the caller (the two look alike): 404."""


class Conflict(DomainError):
    """A client id already stored with other content: 409, naming the fields that differ."""

    def __init__(self, message: str, differences: dict[str, Any] | None = None):
        super().__init__(message)
        self.differences = differences or {}


class LegalHold(Conflict):
    """A legal hold keeps the record: a purge or erasure that would delete it is refused (409),
    naming the held records and why they are held."""


class Invalid(DomainError):
    """Input the domain refuses: 422."""


class FilterNotComparable(Invalid):
    """A store filter's comparison met a stored value `float()` cannot read: LangGraph's
    `InMemoryStore` raises `python_error` (TypeError or ValueError) there; so does the client."""

    def __init__(self, message: str, python_error: str):
        super().__init__(message)
        self.python_error = python_error


class Forbidden(DomainError):
    """The caller is known but may not do this (an API key's scope or confinement): 403."""


class KeysNotAllowed(DomainError):
    """Spans name a context outside the API key's confinement."""


class ProviderUnavailable(Invalid):
    """No provider can produce vectors here (provider `none`, or the extra is not installed)."""


class DimensionMismatch(Invalid):
    """A vector's length differs from the dimensions its model already has."""


class UnregisteredModel(Invalid):
    """A vector under a model name no operator registered (the message lists the registered)."""


class SemanticUnavailable(Invalid):
    """Semantic search was asked for with no provider and no query vector."""


class ProviderDown(DomainError):
    """The configured provider could not embed the query right now (503 at the API)."""


class ProviderError(Exception):
    """The provider could not embed this batch (down, timeout, bad answer); retried later."""


class UnknownTokenizer(ValueError):
    """The tokenizer name is not one this server can load offline."""


class BackupFormatError(ValueError):
    """A line that is not part of an agentmemory backup."""


class BodyTooLarge(Exception):
    """A request body streamed without a length read past its limit (413)."""

    def __init__(self, limit: int, setting: str) -> None:
        super().__init__(f"request body is over the limit of {limit} bytes ({setting})")


def differences(stored: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    return {k: {"stored": stored[k], "sent": sent[k]} for k in sent if stored.get(k) != sent[k]}
