"""A context's history page in the dashboard: each message with the step it belongs to, read on
the context's own rows (the step joined by its id and its context), so the page, its text filter
and a message's prune answer alike on one node and on Citus (`scripts/test_citus.sh`)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from memory_app.models import Message, Step
from memory_app.services.messages import messages_append
from tests.builders import make_context, make_run, make_user


def _stepref(run_id: int, position: int) -> str:
    return reverse("run-step", args=[run_id, position])


@pytest.mark.django_db
def test_the_history_links_each_message_to_its_step_and_a_prune_answers_it_in_place():
    context = make_context(messages=2)
    run = make_run(context=context, steps=3)
    step = Step.objects.get(context=context, run=run, position=2)
    [linked] = messages_append(
        context=context,
        items=[
            {"role": "assistant", "text": "a zebra answer", "run_id": run.pk, "step_id": step.pk}
        ],
    ).messages
    # A step of another context with the same position: never what the message links to.
    make_run(context=make_context(), steps=3)
    client = Client()
    client.force_login(make_user(role="admin"))
    page = client.get(reverse("context", args=[context.pk]))
    assert page.status_code == 200
    assert page.content.decode().count(_stepref(run.pk, 2)) == 1
    filtered = client.get(reverse("context", args=[context.pk]), {"q": "zebra"})
    assert filtered.status_code == 200
    body = filtered.content.decode()
    assert "a zebra answer" in body and _stepref(run.pk, 2) in body and "message 1" not in body
    # The prune answers the message's row as the history shows it, its step link included.
    pruned = client.post(
        reverse("message-prune", args=[context.pk, linked.pk]),
        {"pruned": "1"},
        HTTP_HX_REQUEST="true",
    )
    assert pruned.status_code == 200 and _stepref(run.pk, 2) in pruned.content.decode()
    assert Message.objects.get(pk=linked.pk, context=context).pruned_at is not None
    # A message id under another context's page is not found there.
    other = make_context(messages=1)
    assert (
        client.post(
            reverse("message-prune", args=[other.pk, linked.pk]),
            {"pruned": "0"},
            HTTP_HX_REQUEST="true",
        ).status_code
        == 404
    )
