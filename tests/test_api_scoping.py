"""Key scopes × endpoints, and tenant isolation: each tenant × the other's ids answers 404."""

import pytest

from memory_app.models import Message, Run, Step
from tests.api_helpers import make_key

pytestmark = pytest.mark.django_db

# (name, method, path template, body, scope needed). Templates use ids of one tenant's world.
ENDPOINTS = [
    ("context_create", "POST", "/api/v1/contexts", lambda w: {"keys": w["keys"]}, "write"),
    ("context_list", "GET", "/api/v1/contexts", None, "read"),
    ("context_get", "GET", "/api/v1/contexts/{context}", None, "read"),
    ("context_update", "PATCH", "/api/v1/contexts/{context}", lambda w: {"title": "t"}, "write"),
    (
        "message_append",
        "POST",
        "/api/v1/contexts/{context}/messages",
        lambda w: {"role": "user", "text": "x"},
        "write",
    ),
    (
        "message_batch",
        "POST",
        "/api/v1/contexts/{context}/messages/batch",
        lambda w: {"messages": [{"role": "user"}]},
        "write",
    ),
    ("message_list", "GET", "/api/v1/contexts/{context}/messages", None, "read"),
    ("message_get", "GET", "/api/v1/messages/{message}", None, "read"),
    ("message_edit", "PATCH", "/api/v1/messages/{message}", lambda w: {"text": "edited"}, "write"),
    (
        "messages_prune",
        "POST",
        "/api/v1/contexts/{context}/messages/prune",
        lambda w: {"ids": [w["message"]]},
        "write",
    ),
    (
        "messages_restore",
        "POST",
        "/api/v1/contexts/{context}/messages/restore",
        lambda w: {"ids": [w["message"]]},
        "write",
    ),
    ("message_prune", "POST", "/api/v1/messages/{message}/prune", None, "write"),
    ("message_restore", "POST", "/api/v1/messages/{message}/restore", None, "write"),
    ("run_create", "POST", "/api/v1/contexts/{context}/runs", lambda w: {"task": "t"}, "write"),
    ("run_list", "GET", "/api/v1/contexts/{context}/runs", None, "read"),
    ("run_get", "GET", "/api/v1/runs/{run}", None, "read"),
    ("step_list", "GET", "/api/v1/runs/{run}/steps", None, "read"),
    (
        "steps_append",
        "POST",
        "/api/v1/runs/{run}/steps",
        lambda w: {"steps": [{"kind": "action"}]},
        "write",
    ),
    ("run_finish", "POST", "/api/v1/runs/{run}/finish", lambda w: {"status": "success"}, "write"),
    ("step_get", "GET", "/api/v1/steps/{step}", None, "read"),
    # The same by-id routes under their context (routed to one shard on a distributed store).
    ("ctx_message_get", "GET", "/api/v1/contexts/{context}/messages/{message}", None, "read"),
    (
        "ctx_message_edit",
        "PATCH",
        "/api/v1/contexts/{context}/messages/{message}",
        lambda w: {"text": "edited"},
        "write",
    ),
    (
        "ctx_message_prune",
        "POST",
        "/api/v1/contexts/{context}/messages/{message}/prune",
        None,
        "write",
    ),
    (
        "ctx_message_restore",
        "POST",
        "/api/v1/contexts/{context}/messages/{message}/restore",
        None,
        "write",
    ),
    ("ctx_run_get", "GET", "/api/v1/contexts/{context}/runs/{run}", None, "read"),
    ("ctx_step_list", "GET", "/api/v1/contexts/{context}/runs/{run}/steps", None, "read"),
    (
        "ctx_steps_append",
        "POST",
        "/api/v1/contexts/{context}/runs/{run}/steps",
        lambda w: {"steps": [{"kind": "action"}]},
        "write",
    ),
    (
        "ctx_run_finish",
        "POST",
        "/api/v1/contexts/{context}/runs/{run}/finish",
        lambda w: {"status": "success"},
        "write",
    ),
    ("ctx_step_get", "GET", "/api/v1/contexts/{context}/steps/{step}", None, "read"),
]
IDS = ("context", "message", "run", "step")


def build_world(client, keys: dict) -> dict:
    context = client.post("/api/v1/contexts", {"keys": keys}).json()["id"]
    message = client.post(
        f"/api/v1/contexts/{context}/messages", {"role": "user", "text": "hi"}
    ).json()["id"]
    run = client.post(f"/api/v1/contexts/{context}/runs", {"task": "t"}).json()["id"]
    step = client.post(f"/api/v1/runs/{run}/steps", {"steps": [{"kind": "task"}]}).json()["steps"][
        0
    ]["id"]
    return {"keys": keys, "context": context, "message": message, "run": run, "step": step}


def call(client, endpoint, world):
    _, method, template, body, _ = endpoint
    path = template.format(**{k: world[k] for k in IDS})
    if method == "GET":
        return client.get(path)
    return client.send(method, path, body(world) if body else None)


@pytest.fixture
def admin():
    return make_key(scopes=["admin"], name="admin")


@pytest.fixture
def world(admin):
    return build_world(admin, {"tenant": "acme", "chat": "1"})


@pytest.mark.parametrize(
    "scopes", [["read"], ["write"], ["admin"], ["read", "write"]], ids="+".join
)
@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e[0] for e in ENDPOINTS])
def test_scope_matrix(world, scopes, endpoint):
    client = make_key(scopes=scopes)
    response = call(client, endpoint, world)
    allowed = endpoint[4] in scopes or "admin" in scopes
    if allowed:
        assert response.status_code in (200, 201), response.content
    else:
        assert response.status_code == 403, response.content
        assert endpoint[4] in response.json()["detail"]


@pytest.fixture
def tenants(admin):
    acme = make_key(scopes=["read", "write"], context_keys={"tenant": "acme"}, name="acme")
    globex = make_key(scopes=["read", "write"], context_keys={"tenant": "globex"}, name="globex")
    return {
        "acme": (acme, build_world(acme, {"tenant": "acme", "user": "ada"})),
        "globex": (globex, build_world(globex, {"tenant": "globex", "user": "bob"})),
    }


ID_ENDPOINTS = [e for e in ENDPOINTS if "{" in e[2]]


@pytest.mark.parametrize("me,other", [("acme", "globex"), ("globex", "acme")])
@pytest.mark.parametrize("endpoint", ID_ENDPOINTS, ids=[e[0] for e in ID_ENDPOINTS])
def test_a_tenant_gets_404_for_every_id_of_the_other_tenant(tenants, me, other, endpoint):
    client, _ = tenants[me]
    _, their_world = tenants[other]
    before = (
        Message.objects.filter(context_id=their_world["context"]).count(),
        Run.objects.count(),
    )
    response = call(client, endpoint, their_world)
    assert response.status_code == 404, response.content
    assert (
        Message.objects.filter(context_id=their_world["context"]).count(),
        Run.objects.count(),
    ) == before


@pytest.mark.parametrize("me", ["acme", "globex"])
@pytest.mark.parametrize("endpoint", ID_ENDPOINTS, ids=[e[0] for e in ID_ENDPOINTS])
def test_a_tenant_reaches_its_own_ids(tenants, me, endpoint):
    client, mine = tenants[me]
    assert call(client, endpoint, mine).status_code in (200, 201)


def test_a_tenant_lists_only_its_own_contexts(tenants, admin):
    acme, acme_world = tenants["acme"]
    ids = [c["id"] for c in acme.get("/api/v1/contexts").json()["items"]]
    assert ids == [acme_world["context"]]
    everything = [c["id"] for c in admin.get("/api/v1/contexts").json()["items"]]
    assert len(everything) == 2


def test_a_tenant_cannot_create_a_context_outside_its_keys(tenants):
    acme, _ = tenants["acme"]
    assert (
        acme.post("/api/v1/contexts", {"keys": {"tenant": "globex", "user": "eve"}}).status_code
        == 403
    )
    assert acme.post("/api/v1/contexts", {"keys": {"user": "eve"}}).status_code == 403
    assert (
        acme.post("/api/v1/contexts", {"keys": {"tenant": "acme", "user": "eve"}}).status_code
        == 201
    )


def test_a_tenant_cannot_prune_the_other_tenants_message_through_its_own_context(tenants):
    acme, acme_world = tenants["acme"]
    _, globex_world = tenants["globex"]
    response = acme.post(
        f"/api/v1/contexts/{acme_world['context']}/messages/prune",
        {"ids": [globex_world["message"]]},
    )
    assert response.status_code == 404
    assert not Message.objects.filter(pruned_at__isnull=False).exists()


@pytest.mark.parametrize(
    "endpoint", [e for e in ENDPOINTS if e[0].startswith("ctx_")], ids=lambda e: e[0]
)
def test_a_route_under_another_context_of_the_same_tenant_is_404(admin, world, endpoint):
    """The context in the path is checked, not only the key's reach: an id under a context
    it does not belong to is not found, and nothing changes."""
    other = admin.post("/api/v1/contexts", {"keys": {"tenant": "acme", "chat": "2"}}).json()
    steps_before = Step.objects.filter(run_id=world["run"]).count()
    response = call(admin, endpoint, {**world, "context": other["id"]})
    assert response.status_code == 404, response.content
    assert Step.objects.filter(run_id=world["run"]).count() == steps_before
    assert Message.objects.get(pk=world["message"]).text == "hi"


@pytest.mark.parametrize(
    "old,new",
    [
        ("/api/v1/messages/{message}", "/api/v1/contexts/{context}/messages/{message}"),
        ("/api/v1/runs/{run}", "/api/v1/contexts/{context}/runs/{run}"),
        ("/api/v1/runs/{run}/steps", "/api/v1/contexts/{context}/runs/{run}/steps"),
        ("/api/v1/steps/{step}", "/api/v1/contexts/{context}/steps/{step}"),
    ],
)
def test_a_route_by_id_alone_still_answers_and_names_its_successor(admin, world, old, new):
    ids = {k: world[k] for k in IDS}
    answer = admin.get(old.format(**ids))
    assert answer.status_code == 200
    assert answer.headers["Deprecation"] == "true"
    successor = new.format(**ids)
    assert answer.headers["Link"] == f'<{successor}>; rel="successor-version"'
    routed = admin.get(successor)
    assert routed.status_code == 200
    assert "Deprecation" not in routed.headers
    assert routed.json() == answer.json()
