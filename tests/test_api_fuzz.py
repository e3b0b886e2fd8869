"""Fuzz the Agent API against its own OpenAPI schema (schemathesis) with a valid key.

Bounded for CI: a few dozen examples per operation, no deadline. Checks: no 5xx, every status
documented, content type and body matching the documented schema. Integer path ids are often
replaced by ids that exist, so bodies reach the code behind the 404 check.
"""

import random

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from memory_app import auth
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, steps_append

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
OWN_TAGS = ("contexts", "messages", "runs")


def _load_operations() -> dict:
    """Operations of the served schema, keyed by label ("POST /api/v1/contexts").

    Driven with plain hypothesis rather than schemathesis' pytest plugin, whose subtests do not
    run under pytest 9.
    """
    import json

    from django.core.wsgi import get_wsgi_application

    from memory_app.api.app import api

    loaded = schemathesis.openapi.from_dict(json.loads(json.dumps(api.get_openapi_schema())))
    loaded.app = get_wsgi_application()
    loaded = loaded.include(tag=list(OWN_TAGS))
    found = {}
    for result in loaded.get_all_operations():
        operation = result.ok()
        found[operation.label] = operation
    return found


OPERATIONS = _load_operations()


@pytest.fixture
def keep_test_connection():
    """The WSGI app closes the DB connection after each request (as in production); inside a
    test transaction that would drop it. Django's own test client does the same disconnect."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def world(django_db_blocker, keep_test_connection):
    """A key and one of each resource; the ids are swapped into generated paths."""
    with django_db_blocker.unblock():
        issued = auth.apikey_create(name="fuzz", scopes=["admin"])
        context, _ = context_get_or_create(keys={"fuzz": "world"})
        [message] = messages_append(
            context=context, items=[{"role": "user", "text": "hi"}]
        ).messages
        run, _ = run_create(context=context, task="t")
        [step] = steps_append(run=run, items=[{"kind": "action"}]).steps
    return {
        "secret": issued.secret,
        "ids": {
            "context_id": context.pk,
            "message_id": message.pk,
            "run_id": run.pk,
            "step_id": step.pk,
        },
    }


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_api_answers_every_generated_request_as_documented(label, world):
    operation = OPERATIONS[label]
    # schemathesis asks for gzip like requests does, but its WSGI transport does not inflate
    # the answer before checking it against the schema; compression has its own tests.
    headers = {"Authorization": f"Bearer {world['secret']}", "Accept-Encoding": "identity"}

    @given(case=operation.as_strategy())
    @settings(
        max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    def check(case):
        rng = random.Random(repr(case.path_parameters) + repr(case.query))
        for name, value in (case.path_parameters or {}).items():
            if name in world["ids"] and isinstance(value, int) and rng.random() < 0.7:
                case.path_parameters[name] = world["ids"][name]
        case.call_and_validate(headers=headers, checks=CHECKS)

    check()
