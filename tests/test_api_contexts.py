"""Contexts over HTTP: get-or-create by keys, get, list with key filters and cursors, update."""

import pytest

from memory_app.models import AuditEvent, Context
from tests.api_helpers import make_key, new_context

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return make_key(scopes=["read", "write"])


def test_post_creates_then_returns_the_same_context_for_the_same_keys_in_any_order(api):
    first = api.post("/api/v1/contexts", {"keys": {"user": "ada", "chat": "42"}, "title": "Ada"})
    again = api.post(
        "/api/v1/contexts", {"keys": {"chat": "42", "user": "ada"}, "title": "ignored"}
    )
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["title"] == "Ada"
    assert Context.objects.count() == 1


def test_get_returns_the_context(api):
    cid = new_context(api, {"user": "ada"})
    response = api.get(f"/api/v1/contexts/{cid}")
    assert response.status_code == 200
    assert response.json()["keys"] == {"user": "ada"}


def test_get_unknown_context_is_404_json(api):
    response = api.get("/api/v1/contexts/999999999")
    assert response.status_code == 404
    assert "not found" in response.json()["detail"]


def test_list_filters_by_key_containment(api):
    ada = {new_context(api, {"user": "ada", "chat": str(i)}) for i in range(3)}
    new_context(api, {"user": "bob", "chat": "1"})
    response = api.get("/api/v1/contexts", {"keys": '{"user": "ada"}'})
    assert response.status_code == 200
    assert {c["id"] for c in response.json()["items"]} == ada


def test_list_pages_with_a_cursor_without_overlap_or_gap(api):
    ids = [new_context(api, {"n": i}) for i in range(7)]
    seen, cursor = [], None
    while True:
        params = {"limit": 3} | ({"after": cursor} if cursor is not None else {})
        page = api.get("/api/v1/contexts", params).json()
        seen += [c["id"] for c in page["items"]]
        if not page["has_more"]:
            assert page["next_cursor"] is None
            break
        cursor = page["next_cursor"]
    assert seen == sorted(ids)


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", '"x"', '{"a": "\\u0000"}'])
def test_list_with_a_keys_filter_that_is_not_a_json_object_is_422(api, bad):
    assert api.get("/api/v1/contexts", {"keys": bad}).status_code == 422


def test_patch_updates_title_and_metadata_and_audits_with_the_key(api):
    cid = new_context(api)
    response = api.patch(f"/api/v1/contexts/{cid}", {"title": "New", "metadata": {"a": 1}})
    assert response.status_code == 200
    assert response.json()["title"] == "New"
    assert response.json()["metadata"] == {"a": 1}
    event = AuditEvent.objects.get(target_type="context", action="edit")
    assert event.actor == f"key:{api.key.prefix}"
    assert event.api_key_id == api.key.pk
    assert event.before["title"] == ""


def test_patch_title_longer_than_the_column_is_422(api):
    cid = new_context(api)
    assert api.patch(f"/api/v1/contexts/{cid}", {"title": "x" * 501}).status_code == 422
    assert api.patch(f"/api/v1/contexts/{cid}", {"title": "x" * 500}).status_code == 200


def test_empty_keys_are_422(api):
    assert api.post("/api/v1/contexts", {"keys": {}}).status_code == 422


def test_pruned_messages_are_left_out_of_the_context_counts(api):
    cid = new_context(api, {"user": "ada", "chat": "counts"})
    texts = ["one short", "two words here", "three of them now", "four is the longest of all"]
    posted = api.post(
        f"/api/v1/contexts/{cid}/messages/batch?return=full",
        {"messages": [{"role": "user", "text": t} for t in texts]},
    ).json()
    items = posted["messages"]
    tokens = [m["token_count"] for m in items]
    pruned = api.post(f"/api/v1/contexts/{cid}/messages/{items[1]['id']}/prune", {})
    assert pruned.status_code == 200, pruned.text
    got = api.get(f"/api/v1/contexts/{cid}").json()
    assert (got["message_count"], got["token_count"]) == (3, sum(tokens) - tokens[1])
    listed = api.get("/api/v1/contexts", params={"keys": '{"chat": "counts"}'}).json()["items"]
    assert [(c["message_count"], c["token_count"]) for c in listed] == [
        (3, sum(tokens) - tokens[1])
    ]
    again = api.post("/api/v1/contexts", {"keys": {"user": "ada", "chat": "counts"}}).json()
    assert (again["message_count"], again["token_count"]) == (3, sum(tokens) - tokens[1])


def test_a_context_without_messages_is_counted_without_reading_its_messages(
    api, django_assert_num_queries
):
    """A context holding no message has nothing pruned: its counts come from its own row (a new
    context's answer reads no message), while one holding messages still has them summed."""
    from memory_app.queries.lists import with_live_counts

    empty = Context.objects.get(pk=new_context(api, {"user": "ada", "chat": "empty"}))
    full = Context.objects.get(pk=new_context(api, {"user": "ada", "chat": "full"}))
    api.post(f"/api/v1/contexts/{full.pk}/messages", {"role": "user", "text": "hi"})
    full.refresh_from_db()
    with django_assert_num_queries(0):
        with_live_counts([empty])
    assert (empty.live_count, empty.live_tokens, empty.pruned_count) == (0, 0, 0)
    with django_assert_num_queries(1):
        with_live_counts([empty, full])
    assert (full.live_count, full.pruned_count) == (1, 0)
