"""Shared fixtures. The database is the real (embedded) PostgreSQL with pgvector."""

import pytest

from memory_app.audit import Actor


@pytest.fixture(scope="session", autouse=True)
def _embedded_database():
    """With no DATABASE_URL the embedded server starts with the session's first test (collecting
    starts nothing) and this process holds it to the end: tests that reach it without Django
    (psycopg, `manage.py` in a subprocess) find it running."""
    from agentmemory_site.embedded_postgres.base import start_embedded_database

    start_embedded_database()


@pytest.fixture(autouse=True)
def _no_indexer_thread(settings):
    """Deferred vectors stay waiting unless a test drains them (or turns the thread on and waits
    for it): a background connection must not outlive a transactional test."""
    settings.AGENTMEMORY_INDEXER_THREAD = False


@pytest.fixture(autouse=True)
def _fresh_model_registry():
    """The registry's per-process cache holds names only a test's rolled-back transaction
    registered: each test starts from what its database says."""
    from memory_app.embeddings import registry

    registry.forget()
    yield
    registry.forget()


@pytest.fixture
def system_actor() -> Actor:
    return Actor.system("test")


@pytest.fixture(scope="session")
def asgi_live_server(django_db_setup):
    """The whole site over real HTTP (uvicorn, ASGI), MCP included; see tests/asgi_server.py."""
    import os

    from django.db import connections

    from tests.asgi_server import AsgiServer

    env = os.environ.copy()
    from agentmemory_site.asgi import application  # sets serving defaults in os.environ

    os.environ.clear()
    os.environ.update(env)  # not for the processes later tests start

    # As under `make run` (agentmemory_site/asgi.py): each ASGI request runs on a thread of its
    # own, whose connection must close with the request. Threads read this when they connect.
    db = connections.settings["default"]
    kept, db["CONN_MAX_AGE"] = db["CONN_MAX_AGE"], 0
    server = AsgiServer(application).start()
    yield server
    server.stop()
    db["CONN_MAX_AGE"] = kept
