"""Dashboard II over HTTP: permissions, CSRF on every POST, and each flow without JavaScript."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from memory_app.audit import Actor
from memory_app.models import ApiKey, AuditEvent, MemoryRecord, Message, Step
from memory_app.services.curation import messages_set_pruned
from memory_app.services.memories import memory_promote
from memory_app.services.messages import message_edit
from memory_app.urls import curation_urlpatterns as urlpatterns
from tests.builders import make_context, make_run, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    context = make_context(messages=6)
    run = make_run(context=context, steps=2)
    message = Message.objects.filter(context=context).order_by("seq").first()
    step = Step.objects.filter(run=run).first()
    Step.objects.filter(pk=step.pk).update(observations="the API answered 42")
    event = AuditEvent.objects.create(
        actor="x", action="prune", target_type="message", target_ids=[message.pk], context=context
    )
    memory, _ = memory_promote(actor=Actor.system("t"), message=message)
    key = ApiKey.objects.create(
        name="k", prefix="abcdefabcdef", secret_hash="0" * 64, scopes=["read"]
    )
    return {
        "context": context,
        "run": run,
        "message": message,
        "step": step,
        "event": event,
        "memory": memory,
        "key": key,
        "user": make_user(role="viewer", username="someone"),
    }


def concrete_urls(world) -> list[str]:
    """Every URL of the curation screens, with real ids."""
    ids = {
        "context_id": world["context"].pk,
        "message_id": world["message"].pk,
        "run_id": world["run"].pk,
        "memory_id": world["memory"].pk,
        "step_id": world["step"].pk,
        "event_id": world["event"].pk,
        "key_id": world["key"].pk,
        "user_id": world["user"].pk,
    }
    urls = []
    for pattern in urlpatterns:
        names = pattern.pattern.converters.keys()
        urls.append(reverse(pattern.name, kwargs={n: ids[n] for n in names}))
    return urls


def client_for(role: str, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(make_user(role=role))
    return client


def test_viewer_gets_403_from_every_curation_url_except_the_read_only_pages(world):
    client = client_for("viewer")
    read_only = {reverse("playground", args=[world["context"].pk]), reverse("memories")}
    # A memory's history is read like the memories page (restoring and undoing are curation).
    read_only.add(reverse("memory-history", args=[world["memory"].pk]))
    for url in concrete_urls(world):
        for method in ("get", "post"):
            status = getattr(client, method)(url, {"ids": [world["message"].pk]}).status_code
            expected = (200 if method == "get" else 405) if url in read_only else 403
            assert status == expected, f"{method} {url}: {status}"
    assert (
        not AuditEvent.objects.exclude(pk=world["event"].pk)
        .exclude(action="memory_promote")
        .exists()
    )


def test_keys_and_purge_are_for_admins_only(world):
    curator, admin = client_for("curator"), client_for("admin")
    for url in (reverse("keys"), reverse("purge")):
        assert curator.get(url).status_code == 403
        assert admin.get(url).status_code == 200
    assert curator.get(reverse("audit")).status_code == 200


def test_every_post_without_the_csrf_token_is_refused(world):
    admin = client_for("admin", enforce_csrf_checks=True)
    for url in concrete_urls(world):
        if "/playground/" in url:
            continue  # GET only: it changes nothing
        response = admin.post(url, {"ids": [world["message"].pk], "pruned": "1"})
        assert response.status_code == 403, f"POST {url} without CSRF token: {response.status_code}"
    assert not Message.objects.filter(pruned_at__isnull=False).exists()
    assert not ApiKey.objects.filter(revoked_at__isnull=False).exists()


def test_prune_selected_then_undo_from_the_audit_then_restore_from_the_pruned_view(world):
    client = client_for("curator")
    ctx = world["context"]
    ids = list(Message.objects.filter(context=ctx).order_by("seq").values_list("pk", flat=True)[:3])
    response = client.post(reverse("curate-prune", args=[ctx.pk]), {"ids": ids, "pruned": "1"})
    assert response.status_code == 302 and "done=" in response["Location"]
    event = AuditEvent.objects.filter(action="prune", context=ctx).latest("id")
    assert sorted(event.target_ids) == ids
    page = client.get(response["Location"])
    assert f'action="/audit/{event.pk}/undo/"' in page.content.decode()
    client.post(reverse("audit-undo", args=[event.pk]))
    assert not Message.objects.filter(pk__in=ids, pruned_at__isnull=False).exists()
    # Prune again, then restore from the pruned view (htmx: the panel comes back in place).
    client.post(reverse("curate-prune", args=[ctx.pk]), {"ids": ids[:1], "pruned": "1"})
    pruned_view = client.get(
        reverse("curate-history", args=[ctx.pk]) + "?view=pruned"
    ).content.decode()
    assert f'id="cm-{ids[0]}"' in pruned_view and f'id="cm-{ids[1]}"' not in pruned_view
    response = client.post(
        reverse("curate-prune", args=[ctx.pk]),
        {"ids": ids[:1], "pruned": "0", "view": "pruned"},
        HTTP_HX_REQUEST="true",
    )
    html = response.content.decode()
    assert response.status_code == 200 and html.lstrip().startswith('<section id="curate-panel"')
    assert Message.objects.get(pk=ids[0]).pruned_at is None


def test_edit_keeps_the_old_text_in_the_audit_and_revert_brings_it_back(world):
    client = client_for("curator")
    m = world["message"]
    old = m.text
    response = client.post(
        reverse("curate-message-edit", args=[m.context_id, m.pk]),
        {"text": "rewritten <b>x</b>", "tags": "a, b"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200 and f'id="cm-{m.pk}"' in response.content.decode()
    assert "rewritten &lt;b&gt;x&lt;/b&gt;" in response.content.decode()
    m.refresh_from_db()
    assert (m.text, m.tags) == ("rewritten <b>x</b>", ["a", "b"])
    event = AuditEvent.objects.filter(action="edit", target_ids=[m.pk]).latest("id")
    audit_html = client.get(reverse("audit") + f"?target=message&target_id={m.pk}").content.decode()
    assert old in audit_html
    client.post(reverse("audit-undo", args=[event.pk]))
    m.refresh_from_db()
    assert m.text == old


def test_bulk_preview_count_equals_what_is_pruned_and_undo_restores_all(world):
    client = client_for("curator")
    ctx = world["context"]
    preview = client.get(
        reverse("curate-bulk", args=[ctx.pk]) + "?role=user", HTTP_HX_REQUEST="true"
    )
    html = preview.content.decode()
    expected = Message.objects.filter(context=ctx, role="user", pruned_at__isnull=True).count()
    assert f'data-testid="preview-count">{expected}<' in html
    assert not Message.objects.filter(context=ctx, pruned_at__isnull=False).exists()
    upto = ctx.last_seq
    response = client.post(
        reverse("curate-bulk-apply", args=[ctx.pk]),
        {"role": "user", "upto_seq": upto, "expected_count": expected},
    )
    assert response.status_code == 302
    event = AuditEvent.objects.get(action="bulk_prune", context=ctx)
    assert (
        len(event.target_ids)
        == expected
        == Message.objects.filter(context=ctx, pruned_at__isnull=False).count()
    )
    client.post(reverse("audit-undo", args=[event.pk]))
    assert not Message.objects.filter(context=ctx, pruned_at__isnull=False).exists()


def test_bulk_apply_with_a_stale_preview_is_refused_with_the_new_preview(world):
    client = client_for("curator")
    ctx = world["context"]
    response = client.post(
        reverse("curate-bulk-apply", args=[ctx.pk]),
        {"role": "user", "upto_seq": ctx.last_seq, "expected_count": 99},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 409 and "preview again" in response.content.decode()
    assert not Message.objects.filter(context=ctx, pruned_at__isnull=False).exists()


def test_bad_input_is_a_clear_400_not_a_500(world):
    client = client_for("admin")
    ctx = world["context"]
    assert (
        client.get(reverse("curate-bulk", args=[ctx.pk]) + "?before_time=yesterday").status_code
        == 400
    )
    assert client.get(reverse("curate-bulk", args=[ctx.pk]) + "?role=robot").status_code == 400
    assert client.post(reverse("curate-prune", args=[ctx.pk]), {"ids": ["x"]}).status_code == 400
    assert client.get(reverse("audit") + "?since=never").status_code == 400
    m = world["message"]
    assert (
        client.post(
            reverse("curate-message-edit", args=[ctx.pk, m.pk]), {"text": "a\x00b"}
        ).status_code
        == 400
    )
    assert (
        client.post(
            reverse("keys"), {"name": "k", "scopes": ["read"], "context_keys": "[1]"}
        ).status_code
        == 400
    )
    assert client.get(reverse("playground", args=[ctx.pk]) + "?k=abc").status_code == 200


def test_step_prune_and_promote_observation(world):
    client = client_for("curator")
    run, step = world["run"], world["step"]
    client.post(reverse("curate-steps-prune", args=[run.pk]), {"ids": [step.pk], "pruned": "1"})
    step.refresh_from_db()
    assert step.pruned_at is not None
    response = client.post(reverse("memory-promote-step", args=[step.pk]))
    record = MemoryRecord.objects.get(source_step=step)
    assert record.content == "the API answered 42" and response["Location"].endswith(
        f"?id={record.pk}"
    )


def test_promote_a_message_then_find_it_by_search_merge_and_archive(world):
    client = client_for("curator")
    ctx = world["context"]
    other = Message.objects.filter(context=ctx).order_by("seq")[1]
    message_edit(message=other, actor=Actor.system("t"), text="user prefers metric units")
    client.post(reverse("memory-promote-message", args=[other.pk]))
    record = MemoryRecord.objects.get(source_message=other)
    html = client.get(reverse("memories") + "?q=metric").content.decode()
    assert f'id="mem-{record.pk}"' in html and f'id="mem-{world["memory"].pk}"' not in html
    client.post(
        reverse("memory-merge"), {"ids": [record.pk, world["memory"].pk], "keep": record.pk}
    )
    world["memory"].refresh_from_db()
    assert (
        world["memory"].archived_at is not None
        and world["memory"].metadata["merged_into"] == record.pk
    )
    client.post(reverse("memory-archive", args=[record.pk]), {"archived": "1"})
    assert (
        f'id="mem-{record.pk}"'
        not in client.get(reverse("memories") + "?q=metric").content.decode()
    )
    assert AuditEvent.objects.filter(action="memory_merge").exists()


def test_admin_creates_a_key_sees_the_secret_once_and_revokes_it(world):
    admin = client_for("admin")
    response = admin.post(
        reverse("keys"),
        {"name": "bot", "scopes": ["read", "write"], "context_keys": '{"tenant": "acme"}'},
    )
    html = response.content.decode()
    key = ApiKey.objects.get(name="bot")
    assert key.context_keys == {"tenant": "acme"} and key.scopes == ["read", "write"]
    assert f"am_{key.prefix}_" in html
    assert f"am_{key.prefix}_" not in admin.get(reverse("keys")).content.decode().replace(
        f"am_{key.prefix}_…", ""
    )
    admin.post(reverse("key-revoke", args=[key.pk]))
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert (
        AuditEvent.objects.filter(
            action__in=["key_create", "key_revoke"], target_ids=[key.pk]
        ).count()
        == 2
    )


@pytest.mark.parametrize("htmx", [False, True])
def test_the_answer_showing_a_new_secret_is_never_stored_by_a_cache(world, htmx):
    admin = client_for("admin")
    headers = {"HX-Request": "true", "HX-Target": "keys-panel"} if htmx else {}
    response = admin.post(reverse("keys"), {"name": "bot", "scopes": ["read"]}, headers=headers)
    assert "am_" in response.content.decode()
    assert "no-store" in response.headers["Cache-Control"]


def test_admin_purge_needs_the_typed_confirmation(world):
    admin = client_for("admin")
    ctx = world["context"]
    m = world["message"]
    messages_set_pruned(context=ctx, ids=[m.pk], pruned=True, actor=Actor.system("t"))
    when = (timezone.localtime() + timezone.timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%S")
    preview = admin.get(reverse("purge") + f"?older_than={when}&context={ctx.pk}").content.decode()
    assert 'data-testid="purge-messages">1<' in preview
    refused = admin.post(
        reverse("purge"), {"older_than": when, "context": ctx.pk, "confirmation": "ok"}
    )
    assert refused.status_code == 400 and Message.objects.filter(pk=m.pk).exists()
    from memory_app.services.curation import PURGE_CONFIRMATION

    done = admin.post(
        reverse("purge"),
        {"older_than": when, "context": ctx.pk, "confirmation": PURGE_CONFIRMATION},
    )
    assert done.status_code == 200 and not Message.objects.filter(pk=m.pk).exists()
    assert AuditEvent.objects.filter(action="purge", target_ids=[m.pk]).exists()
