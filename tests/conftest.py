"""Shared fixtures. The database is the real (embedded) PostgreSQL with pgvector."""

import pytest

from memory_app.logbook import Actor


@pytest.fixture
def system_actor() -> Actor:
    return Actor.system("test")


@pytest.fixture(scope="session")
def asgi_live_server(django_db_setup):
    """The whole site over real HTTP (uvicorn, ASGI), MCP included; see tests/asgi_server.py."""
    from agentmemory_site.asgi import application
    from tests.asgi_server import AsgiServer

    server = AsgiServer(application).start()
    yield server
    server.stop()
