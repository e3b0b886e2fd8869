"""Messages over HTTP: append one / batch, idempotency, list cursors, get, edit, prune, restore."""

import pytest

from memory_app.models import AuditEvent, Message
from tests.api_helpers import append, make_key, new_context

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return make_key(scopes=["read", "write"])


@pytest.fixture
def cid(api):
    return new_context(api)


def url(cid, tail=""):
    return f"/api/v1/contexts/{cid}/messages{tail}"


def test_append_assigns_seq_and_stores_every_field(api, cid):
    body = {
        "client_id": "m1",
        "role": "assistant",
        "name": "bot",
        "text": "calling the tool",
        "content": [
            {"type": "text", "text": "calling the tool"},
            {"type": "thinking", "thinking": "hmm"},
            {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_result", "id": "c1", "name": "weather", "output": "sunny", "extra": [1]},
            {"type": "image", "url": "https://example.org/cat.png"},
        ],
        "tags": ["tool", "important"],
        "metadata": {"k": [1, {"x": None}]},
        "source_timestamp": "2025-01-01 10:00:00",
    }
    response = api.post(url(cid), body)
    assert response.status_code == 201
    out = response.json()
    assert out["seq"] == 1
    assert out["token_count"] > 0
    for field in (
        "client_id",
        "role",
        "name",
        "text",
        "content",
        "tags",
        "metadata",
        "source_timestamp",
    ):
        assert out[field] == body[field], field
    assert api.get(f"/api/v1/messages/{out['id']}").json() == out


def test_repeat_with_same_client_id_and_content_returns_stored_with_200_and_writes_nothing(
    api, cid
):
    first = api.post(url(cid), {"client_id": "m1", "role": "user", "text": "hi"})
    again = api.post(url(cid), {"client_id": "m1", "role": "user", "text": "hi"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert Message.objects.count() == 1
    assert api.get(f"/api/v1/contexts/{cid}").json()["last_seq"] == 1


def test_same_client_id_with_different_content_is_409_naming_the_differences(api, cid):
    api.post(url(cid), {"client_id": "m1", "role": "user", "text": "hi"})
    response = api.post(url(cid), {"client_id": "m1", "role": "assistant", "text": "hi"})
    assert response.status_code == 409
    assert response.json()["differences"] == {"role": {"stored": "user", "sent": "assistant"}}


def test_batch_appends_in_order_with_consecutive_seqs(api, cid):
    append(api, cid, text="before")
    body = {"messages": [{"role": "user", "text": f"m{i}", "client_id": f"b{i}"} for i in range(5)]}
    response = api.post(url(cid, "/batch"), body)
    assert response.status_code == 201
    assert [m["seq"] for m in response.json()["messages"]] == [2, 3, 4, 5, 6]
    assert response.json()["created"] == [True] * 5
    again = api.post(url(cid, "/batch"), body)
    assert again.status_code == 200
    assert again.json()["created"] == [False] * 5


def test_batch_is_all_or_nothing_when_one_client_id_conflicts(api, cid):
    append(api, cid, client_id="x", text="stored")
    body = {
        "messages": [
            {"role": "user", "text": "new"},
            {"role": "user", "client_id": "x", "text": "changed"},
        ]
    }
    assert api.post(url(cid, "/batch"), body).status_code == 409
    assert Message.objects.count() == 1


def test_batch_of_1000_is_accepted_and_1001_is_422(api, cid):
    ok = api.post(url(cid, "/batch"), {"messages": [{"role": "user", "text": "x"}] * 1000})
    assert ok.status_code == 201
    assert Message.objects.count() == 1000
    too_many = api.post(url(cid, "/batch"), {"messages": [{"role": "user", "text": "x"}] * 1001})
    assert too_many.status_code == 422
    assert Message.objects.count() == 1000


def test_batch_repeating_a_client_id_is_422(api, cid):
    body = {"messages": [{"role": "user", "client_id": "d"}, {"role": "user", "client_id": "d"}]}
    assert api.post(url(cid, "/batch"), body).status_code == 422


def test_list_pages_forward_with_after_and_backward_with_before(api, cid):
    api.post(
        url(cid, "/batch"), {"messages": [{"role": "user", "text": str(i)} for i in range(10)]}
    )
    first = api.get(url(cid), {"limit": 4}).json()
    assert [m["seq"] for m in first["items"]] == [1, 2, 3, 4]
    assert first["has_more"] and first["next_cursor"] == 4
    second = api.get(url(cid), {"limit": 4, "after": 4}).json()
    assert [m["seq"] for m in second["items"]] == [5, 6, 7, 8]
    last = api.get(url(cid), {"limit": 4, "after": 8}).json()
    assert [m["seq"] for m in last["items"]] == [9, 10] and not last["has_more"]
    back = api.get(url(cid), {"limit": 3, "before": 11}).json()
    assert [m["seq"] for m in back["items"]] == [8, 9, 10]
    assert back["next_cursor"] == 8
    between = api.get(url(cid), {"after": 2, "before": 6}).json()
    assert [m["seq"] for m in between["items"]] == [3, 4, 5]


@pytest.mark.parametrize("limit", [0, 1001])
def test_list_limit_out_of_range_is_422(api, cid, limit):
    assert api.get(url(cid), {"limit": limit}).status_code == 422


def test_prune_hides_from_list_unless_included_and_restore_brings_back_with_audit(api, cid):
    ids = [append(api, cid, text=str(i))["id"] for i in range(3)]
    response = api.post(url(cid, "/prune"), {"ids": ids[:2], "note": "noise"})
    assert response.status_code == 200
    assert response.json()["changed"] == ids[:2]
    assert [m["id"] for m in api.get(url(cid)).json()["items"]] == [ids[2]]
    everything = api.get(url(cid), {"include_pruned": "true"}).json()["items"]
    assert [m["is_pruned"] for m in everything] == [True, True, False]
    assert api.get(f"/api/v1/messages/{ids[0]}").json()["pruned_by"] == f"key:{api.key.prefix}"
    # Pruning again changes nothing and writes no audit event.
    assert api.post(url(cid, "/prune"), {"ids": ids[:2]}).json() == {
        "changed": [],
        "audit_event_id": None,
    }
    restored = api.post(url(cid, "/restore"), {"ids": ids[:1]})
    assert restored.json()["changed"] == ids[:1]
    events = list(
        AuditEvent.objects.order_by("id").values_list("action", "actor", "target_ids", "note")
    )
    actor = f"key:{api.key.prefix}"
    assert events == [("prune", actor, ids[:2], "noise"), ("restore", actor, ids[:1], "")]


def test_prune_and_restore_one_message(api, cid):
    mid = append(api, cid, text="x")["id"]
    assert api.post(f"/api/v1/messages/{mid}/prune").json()["changed"] == [mid]
    assert api.get(f"/api/v1/messages/{mid}").json()["is_pruned"] is True
    assert api.post(f"/api/v1/messages/{mid}/restore", {"note": "oops"}).json()["changed"] == [mid]
    assert api.get(f"/api/v1/messages/{mid}").json()["is_pruned"] is False


def test_prune_with_an_id_of_another_context_is_404_and_changes_nothing(api, cid):
    mine = append(api, cid, text="x")["id"]
    other = append(api, new_context(api, {"other": 1}), text="y")["id"]
    assert api.post(url(cid, "/prune"), {"ids": [mine, other]}).status_code == 404
    assert not Message.objects.filter(pruned_at__isnull=False).exists()


def test_edit_changes_text_tags_metadata_and_audits_before_after(api, cid):
    message = append(api, cid, text="hello", tags=["a"])
    response = api.patch(
        f"/api/v1/messages/{message['id']}",
        {"text": "hello world", "tags": ["b"], "metadata": {"m": 1}},
    )
    assert response.status_code == 200
    out = response.json()
    assert (out["text"], out["tags"], out["metadata"]) == ("hello world", ["b"], {"m": 1})
    assert out["token_count"] > message["token_count"]
    event = AuditEvent.objects.get(action="edit", target_type="message")
    assert event.before["text"] == "hello" and event.after["text"] == "hello world"
    assert event.actor == f"key:{api.key.prefix}"


def test_append_linked_to_a_run_and_a_step_of_this_context(api, cid):
    run = api.post(f"/api/v1/contexts/{cid}/runs", {"task": "t"}).json()
    step = api.post(f"/api/v1/runs/{run['id']}/steps", {"steps": [{"kind": "action"}]}).json()[
        "steps"
    ][0]
    out = append(api, cid, text="x", run_id=run["id"], step_id=step["id"])
    assert (out["run_id"], out["step_id"]) == (run["id"], step["id"])


def test_append_with_a_run_or_step_of_another_context_is_404(api, cid):
    other = new_context(api, {"other": 1})
    run = api.post(f"/api/v1/contexts/{other}/runs", {}).json()
    step = api.post(f"/api/v1/runs/{run['id']}/steps", {"steps": [{"kind": "task"}]}).json()[
        "steps"
    ][0]
    assert api.post(url(cid), {"role": "user", "run_id": run["id"]}).status_code == 404
    assert api.post(url(cid), {"role": "user", "step_id": step["id"]}).status_code == 404
    assert api.post(url(cid), {"role": "user", "step_id": 2**62}).status_code == 404
    assert Message.objects.count() == 0


@pytest.mark.parametrize(
    "body",
    [
        {"role": "wizard"},
        {"role": "user", "text": 12},
        {"role": "user", "text": "a\u0000b"},
        {"role": "user", "metadata": {"k\u0000": 1}},
        {"role": "user", "metadata": {"k": ["\u0000"]}},
        {"role": "user", "content": [{"type": "text", "text": "ok", "extra": "\u0000"}]},
        {"role": "user", "content": [{"type": "video"}]},
        {"role": "user", "tags": ["x" * 201]},
        {"role": "user", "name": "x" * 201},
        {"role": "user", "client_id": "x" * 201},
        {"role": "user", "source_timestamp": "x" * 65},
        {"role": "user", "metadata": []},
        {"role": "user", "run_id": 0},
        {"role": "user", "run_id": 2**63},
        {"text": "no role"},
    ],
)
def test_invalid_message_is_422_and_stores_nothing(api, cid, body):
    response = api.post(url(cid), body)
    assert response.status_code == 422, response.content
    assert "detail" in response.json()
    assert Message.objects.count() == 0


def test_a_large_body_is_parsed_and_answered_with_the_cyclic_gc_paused(api, cid, monkeypatch):
    """limits.BulkBodyGcMiddleware: from GC_PAUSE_MIN_BODY bytes on, parsing, the write and the
    echo run without cyclic collections (their objects are never promoted to the oldest
    generation); small bodies are untouched and the collector is back on afterwards."""
    import gc

    from memory_app.api import app as api_app
    from memory_app.api import limits

    seen: list[bool] = []
    parse = api_app.common.json_loads

    def spy(body):
        seen.append(gc.isenabled())
        return parse(body)

    monkeypatch.setattr(api_app.common, "json_loads", spy)
    text = "x" * 200
    n = limits.GC_PAUSE_MIN_BODY // 200 + 1
    big = api.post(url(cid, "/batch"), {"messages": [{"role": "user", "text": text}] * n})
    assert big.status_code == 201, big.content
    small = api.post(url(cid, "/batch"), {"messages": [{"role": "user", "text": text}]})
    assert small.status_code == 201, small.content
    assert seen == [False, True]
    assert gc.isenabled()
