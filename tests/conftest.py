"""Shared fixtures. The database is the real (embedded) PostgreSQL with pgvector."""

import pytest

from memory_app.logbook import Actor


@pytest.fixture
def system_actor() -> Actor:
    return Actor.system("test")
