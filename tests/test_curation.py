"""Curation domain: bulk prune by filter, undo from the audit, purge; nothing is lost until
purge."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_app.audit import Actor
from memory_app.errors import Conflict, Invalid
from memory_app.models import AuditEvent, Context, Message, Step
from memory_app.services import curation
from memory_app.services.contexts import context_get_or_create
from memory_app.services.curation import PruneFilter, messages_set_pruned, steps_set_pruned
from memory_app.services.messages import (
    message_edit,
    message_versions,
    messages_append,
    messages_retag,
)
from memory_app.services.runs import run_create, steps_append
from tests.builders import without_their_context

pytestmark = pytest.mark.django_db

_serial = itertools.count()
ACTOR = Actor.system("curator-test")


def make_context(texts: list[tuple[str, str, list[str]]]) -> Context:
    ctx, _ = context_get_or_create(keys={"test": "curation", "n": next(_serial)})
    messages_append(
        context=ctx, items=[{"role": r, "text": t, "tags": tags} for r, t, tags in texts]
    )
    return ctx


def live_ids(ctx: Context) -> set[int]:
    return set(
        Message.objects.filter(context=ctx, pruned_at__isnull=True).values_list("pk", flat=True)
    )


SAMPLE = [
    ("user", "hello weather", ["greet"]),
    ("assistant", "sunny today", []),
    ("user", "weather tomorrow?", ["greet", "q"]),
    ("assistant", "rain", ["q"]),
    ("tool", "forecast api output", []),
]


def test_bulk_preview_counts_what_apply_prunes_and_writes_one_event():
    ctx = make_context(SAMPLE)
    flt = PruneFilter(text="weather")
    preview = curation.bulk_prune_preview(context=ctx, flt=flt)
    assert preview.count == 2
    assert [m.text for m in preview.sample] == ["hello weather", "weather tomorrow?"]
    before_events = AuditEvent.objects.count()
    event = curation.bulk_prune_apply(
        context=ctx, flt=flt, upto_seq=preview.upto_seq, expected_count=preview.count, actor=ACTOR
    )
    assert AuditEvent.objects.count() == before_events + 1
    assert event.action == "bulk_prune" and len(event.target_ids) == preview.count
    assert Message.objects.filter(pk__in=event.target_ids, pruned_at__isnull=False).count() == 2
    assert event.after["filter"] == {"text": "weather"}


def test_bulk_filters_combine_role_tag_and_seq_bounds():
    ctx = make_context(SAMPLE)
    assert (
        curation.bulk_prune_preview(context=ctx, flt=PruneFilter(role="user", tag="q")).count == 1
    )
    assert (
        curation.bulk_prune_preview(context=ctx, flt=PruneFilter(after_seq=2, before_seq=5)).count
        == 2
    )
    future = timezone.now() + timedelta(hours=1)
    assert curation.bulk_prune_preview(context=ctx, flt=PruneFilter(before_time=future)).count == 5
    assert curation.bulk_prune_preview(context=ctx, flt=PruneFilter(after_time=future)).count == 0


def test_bulk_apply_refuses_when_the_set_changed_since_the_preview():
    ctx = make_context(SAMPLE)
    flt = PruneFilter(role="user")
    preview = curation.bulk_prune_preview(context=ctx, flt=flt)
    first = Message.objects.get(context=ctx, seq=1)
    messages_set_pruned(context=ctx, ids=[first.pk], pruned=True, actor=ACTOR)
    with pytest.raises(Conflict):
        curation.bulk_prune_apply(
            context=ctx,
            flt=flt,
            upto_seq=preview.upto_seq,
            expected_count=preview.count,
            actor=ACTOR,
        )
    assert live_ids(ctx) == set(
        Message.objects.filter(context=ctx).exclude(pk=first.pk).values_list("pk", flat=True)
    )


def test_bulk_apply_leaves_messages_appended_after_the_preview_alone():
    ctx = make_context(SAMPLE)
    flt = PruneFilter(role="user")
    preview = curation.bulk_prune_preview(context=ctx, flt=flt)
    late = messages_append(context=ctx, items=[{"role": "user", "text": "late"}]).messages[0]
    event = curation.bulk_prune_apply(
        context=ctx, flt=flt, upto_seq=preview.upto_seq, expected_count=preview.count, actor=ACTOR
    )
    assert late.pk not in event.target_ids and late.pk in live_ids(ctx)


def test_bulk_needs_a_filter_and_validates_input():
    ctx = make_context(SAMPLE)
    with pytest.raises(Invalid):
        curation.bulk_prune_apply(
            context=ctx, flt=PruneFilter(), upto_seq=10, expected_count=5, actor=ACTOR
        )
    with pytest.raises(Invalid):
        PruneFilter(role="robot")
    with pytest.raises(Invalid):
        PruneFilter(before_seq=-1)


def test_undo_of_a_bulk_prune_restores_all_and_cannot_run_twice():
    ctx = make_context(SAMPLE)
    everything = live_ids(ctx)
    flt = PruneFilter(after_seq=0)
    preview = curation.bulk_prune_preview(context=ctx, flt=flt)
    event = curation.bulk_prune_apply(
        context=ctx, flt=flt, upto_seq=preview.upto_seq, expected_count=preview.count, actor=ACTOR
    )
    assert live_ids(ctx) == set()
    undo = curation.audit_undo(event=event, actor=ACTOR)
    assert live_ids(ctx) == everything
    assert undo.action == "restore" and set(undo.target_ids) == everything
    event.refresh_from_db()
    assert event.undone_by_id == undo.pk
    with pytest.raises(Conflict):
        curation.audit_undo(event=event, actor=ACTOR)


def test_undo_of_an_edit_reverts_text_and_tags():
    ctx = make_context(SAMPLE)
    m = Message.objects.get(context=ctx, seq=1)
    message_edit(message=m, actor=ACTOR, text="changed", tags=["x"])
    event = AuditEvent.objects.filter(action="edit", target_ids=[m.pk]).latest("id")
    curation.audit_undo(event=event, actor=ACTOR)
    m.refresh_from_db()
    assert (m.text, m.tags) == ("hello weather", ["greet"])


def test_undo_of_a_restore_prunes_again_and_step_prunes_undo_too():
    ctx = make_context(SAMPLE)
    m = Message.objects.get(context=ctx, seq=2)
    messages_set_pruned(context=ctx, ids=[m.pk], pruned=True, actor=ACTOR)
    _, restore = messages_set_pruned(context=ctx, ids=[m.pk], pruned=False, actor=ACTOR)
    curation.audit_undo(event=restore, actor=ACTOR)
    assert m.pk not in live_ids(ctx)

    run, _ = run_create(context=ctx, task="t")
    step = steps_append(run=run, items=[{"kind": "action", "observations": "obs"}]).steps[0]
    _, prune = steps_set_pruned(run=run, ids=[step.pk], pruned=True, actor=ACTOR)
    curation.audit_undo(event=prune, actor=ACTOR)
    step.refresh_from_db()
    assert step.pruned_at is None


def test_prunes_restores_undos_and_retags_name_the_context_of_the_rows_they_touch():
    """A message's and a step's prune and restore, a bulk prune, their undos, an edit's undo,
    the versions of a message and a retag of messages: every statement on their rows names
    their context (on Citus, their shard alone); they went by id alone."""
    ctx = make_context(SAMPLE)
    first = Message.objects.get(context=ctx, seq=1)
    run, _ = run_create(context=ctx, task="t")
    step = steps_append(run=run, items=[{"kind": "action", "observations": "obs"}]).steps[0]
    flt = PruneFilter(text="weather")
    with CaptureQueriesContext(connection) as queries:
        preview = curation.bulk_prune_preview(context=ctx, flt=flt)
        bulk = curation.bulk_prune_apply(
            context=ctx, flt=flt, upto_seq=preview.upto_seq, expected_count=2, actor=ACTOR
        )
        curation.audit_undo(event=bulk, actor=ACTOR)
        message_edit(message=first, actor=ACTOR, text="changed")
        edit = AuditEvent.objects.filter(action="edit", target_ids=[first.pk]).latest("id")
        curation.audit_undo(event=edit, actor=ACTOR)
        _, prune = steps_set_pruned(run=run, ids=[step.pk], pruned=True, actor=ACTOR)
        curation.audit_undo(event=prune, actor=ACTOR)
        versions = message_versions(context_id=ctx.pk, message_id=first.pk)
        messages_retag(context=ctx, tags_by_id={first.pk: ["marked"]}, actor=ACTOR)
    assert [v["text"] for v in versions] == ["hello weather", "changed", "hello weather"]
    assert live_ids(ctx) == set(Message.objects.filter(context=ctx).values_list("pk", flat=True))
    assert Message.objects.get(pk=first.pk).tags == ["marked"]
    statements = [q["sql"] for q in queries.captured_queries]
    assert sum('UPDATE "memory_app_message"' in s for s in statements) >= 3
    assert without_their_context(statements) == []


def test_events_that_cannot_be_undone_say_so():
    ctx = make_context(SAMPLE)
    event = AuditEvent.objects.create(actor="x", action="purge", target_type="message", context=ctx)
    assert not curation.audit_undoable(event)
    with pytest.raises(Invalid):
        curation.audit_undo(event=event, actor=ACTOR)


def test_purge_needs_the_typed_confirmation_and_an_aware_date():
    ctx = make_context(SAMPLE)
    m = Message.objects.get(context=ctx, seq=1)
    messages_set_pruned(context=ctx, ids=[m.pk], pruned=True, actor=ACTOR)
    with pytest.raises(Invalid):
        curation.pruned_purge(
            older_than=timezone.now(), confirmation="yes", actor=ACTOR, context=ctx
        )
    with pytest.raises(Invalid):
        curation.pruned_purge(
            older_than=timezone.now().replace(tzinfo=None),
            confirmation=curation.PURGE_CONFIRMATION,
            actor=ACTOR,
            context=ctx,
        )
    assert Message.objects.filter(pk=m.pk).exists()


def test_purge_removes_only_old_pruned_items_fixes_counters_and_scrubs_edit_text():
    ctx = make_context(SAMPLE)
    m1, m2 = Message.objects.filter(context=ctx).order_by("seq")[:2]
    message_edit(message=m1, actor=ACTOR, text="secret edit")
    messages_set_pruned(context=ctx, ids=[m1.pk], pruned=True, actor=ACTOR)
    run, _ = run_create(context=ctx, task="t")
    step = steps_append(run=run, items=[{"kind": "action"}, {"kind": "action"}]).steps[0]
    steps_set_pruned(run=run, ids=[step.pk], pruned=True, actor=ACTOR)
    cutoff = timezone.now()
    messages_set_pruned(context=ctx, ids=[m2.pk], pruned=True, actor=ACTOR)  # after the cutoff
    ctx.refresh_from_db()
    count, tokens = ctx.message_count, ctx.token_count
    m1_tokens = Message.objects.get(pk=m1.pk).token_count

    preview = curation.purge_preview(older_than=cutoff, context=ctx)
    assert (preview.messages, preview.steps) == (1, 1)
    events = curation.pruned_purge(
        older_than=cutoff, confirmation=curation.PURGE_CONFIRMATION, actor=ACTOR, context=ctx
    )
    assert {(e.target_type, tuple(e.target_ids)) for e in events} == {
        ("message", (m1.pk,)),
        ("step", (step.pk,)),
    }
    assert (
        not Message.objects.filter(pk=m1.pk).exists() and Message.objects.filter(pk=m2.pk).exists()
    )
    assert not Step.objects.filter(pk=step.pk).exists()
    ctx.refresh_from_db()
    run.refresh_from_db()
    assert (ctx.message_count, ctx.token_count, run.step_count) == (
        count - 1,
        tokens - m1_tokens,
        1,
    )
    assert (
        not AuditEvent.objects.filter(before__text="hello weather")
        .filter(target_ids=[m1.pk])
        .exists()
    )
    assert message_versions(context_id=ctx.pk, message_id=m1.pk) == []


# --- nothing is lost: random sequences of curation actions ------------------------------------

ROLES = ("user", "assistant", "tool")
actions = st.lists(
    st.one_of(
        st.tuples(st.just("prune"), st.lists(st.integers(0, 7), min_size=1, max_size=4)),
        st.tuples(st.just("restore"), st.lists(st.integers(0, 7), min_size=1, max_size=4)),
        st.tuples(
            st.just("edit"),
            st.integers(0, 7),
            st.text(st.characters(blacklist_characters="\x00"), max_size=12),
        ),
        st.tuples(st.just("bulk"), st.sampled_from(ROLES), st.sampled_from(["", "a", "e", "x"])),
        st.tuples(st.just("undo"), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(actions=actions, roles=st.lists(st.sampled_from(ROLES), min_size=8, max_size=8))
def test_no_sequence_of_curation_actions_loses_an_original_text(actions, roles):
    ctx = make_context(
        [(role, f"original {i} {role}", [f"t{i % 3}"]) for i, role in enumerate(roles)]
    )
    originals = {m.pk: m.text for m in Message.objects.filter(context=ctx)}
    ids = sorted(originals)
    for action in actions:
        kind = action[0]
        try:
            if kind in ("prune", "restore"):
                messages_set_pruned(
                    context=ctx,
                    ids=[ids[i] for i in action[1]],
                    pruned=kind == "prune",
                    actor=ACTOR,
                )
            elif kind == "edit":
                message_edit(
                    message=Message.objects.get(pk=ids[action[1]]), actor=ACTOR, text=action[2]
                )
            elif kind == "bulk":
                flt = PruneFilter(role=action[1], text=action[2])
                preview = curation.bulk_prune_preview(context=ctx, flt=flt)
                curation.bulk_prune_apply(
                    context=ctx,
                    flt=flt,
                    upto_seq=preview.upto_seq,
                    expected_count=preview.count,
                    actor=ACTOR,
                )
            else:
                events = list(AuditEvent.objects.filter(context=ctx).order_by("id"))
                undoable = [e for e in events if curation.audit_undoable(e)]
                if undoable:
                    curation.audit_undo(event=undoable[action[1] % len(undoable)], actor=ACTOR)
        except Invalid:
            pass  # a bulk filter that matches nothing: refused, nothing changes

    # Every original text is still recoverable: the message exists (restorable) and its original
    # text is either the current one or a "before" in the audit.
    for pk, text in originals.items():
        assert Message.objects.filter(pk=pk).exists()
        assert text in [v.get("text") for v in message_versions(context_id=ctx.pk, message_id=pk)]
    # ...and restoring everything brings every message back to the agent's view.
    pruned = list(
        Message.objects.filter(context=ctx, pruned_at__isnull=False).values_list("pk", flat=True)
    )
    if pruned:
        messages_set_pruned(context=ctx, ids=pruned, pruned=False, actor=ACTOR)
    assert live_ids(ctx) == set(originals)

    # Until purge: a purge takes what was pruned, and only that.
    messages_set_pruned(context=ctx, ids=ids[:2], pruned=True, actor=ACTOR)
    curation.pruned_purge(
        older_than=timezone.now(),
        confirmation=curation.PURGE_CONFIRMATION,
        actor=ACTOR,
        context=ctx,
    )
    assert set(Message.objects.filter(context=ctx).values_list("pk", flat=True)) == set(ids[2:])


def test_an_edit_with_a_lone_surrogate_is_refused_and_changes_nothing():
    ctx = make_context([("user", "kept as written", [])])
    message = Message.objects.get(context=ctx)
    with pytest.raises(Invalid, match="surrogate"):
        message_edit(message=message, actor=ACTOR, text="half a pair \ud800")
    message.refresh_from_db()
    assert message.text == "kept as written"
    assert not AuditEvent.objects.filter(context=ctx, action="edit").exists()
