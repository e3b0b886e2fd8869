"""AgentMemorySaver, LangGraph's checkpointer on the server: the conformance suite as it ships,
and real StateGraphs run on a thread (resumed, interrupted, forked) whose invocations become
runs with a step per super-step. Against pytest-django's threaded live server."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from memory_app import auth
from memory_app.client import MemoryClient
from memory_app.client.langgraph_checkpoint import AgentMemorySaver
from tests.aio import run_coroutine

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(live_server):
    issued = auth.apikey_create(name="lg", scopes=("read", "write"))
    with MemoryClient(live_server.url, issued.secret, retries=1, backoff=0.01) as mc:
        yield mc


@pytest.mark.slow
def test_conformance_suite_passes_every_capability_the_saver_has(client):
    @checkpointer_test(name="AgentMemorySaver")
    async def saver():
        yield AgentMemorySaver(client, keys={"suite": "conformance"})

    failures: list[str] = []

    def on_result(capability, name, passed, trace):
        if not passed:
            failures.append(f"{capability}.{name}\n{trace}")

    report = run_coroutine(validate(saver, progress=ProgressCallbacks(on_test_result=on_result)))
    assert failures == []
    assert report.passed_all_base()
    base = {"put", "put_writes", "get_tuple", "list", "delete_thread"}
    assert {c for c, r in report.results.items() if r.passed} == base
