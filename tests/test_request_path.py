"""The API's request path: its own middleware chain under ASGI, and its hot paths in database
round trips (a single append, a semantic search)."""

from __future__ import annotations

import select
import threading

import httpx
import numpy as np
import psycopg
import pytest
from django.db import DataError, connection, transaction
from django.test.utils import CaptureQueriesContext

from agentmemory_site import db_pool
from memory_app import auth, scale_out
from memory_app.api import common
from memory_app.errors import NotFound
from memory_app.models import Context, Embedding, Message, MessageSearch
from memory_app.search.semantic import semantic_ranking
from memory_app.services import messages
from memory_app.services.messages import messages_append
from tests.api_helpers import make_key, new_context
from tests.builders import make_context, prepared_plans, register_models

MODEL = "path-model"


def _vector(seed: int) -> list[float]:
    v = np.random.default_rng(seed).normal(size=384)
    return (v / np.linalg.norm(v)).tolist()


@pytest.mark.django_db(transaction=True)
def test_api_requests_skip_the_dashboard_middleware_and_keep_the_headers(asgi_live_server):
    context = make_context(keys={"user": "ada"}, messages=3)
    secret = auth.apikey_create(name="path", scopes=["read", "write"]).secret
    http = httpx.Client(base_url=asgi_live_server.url, timeout=60)
    headers = {"Authorization": f"Bearer {secret}", "Accept-Encoding": "gzip"}
    response = http.get(f"/api/v1/contexts/{context.pk}/messages", headers=headers)
    assert response.status_code == 200 and len(response.json()["items"]) == 3
    # The security headers stay; nothing of a session (no cookie read or set, no Vary on it).
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src" in response.headers["Content-Security-Policy"]
    assert "set-cookie" not in response.headers
    assert "cookie" not in response.headers.get("Vary", "").lower()
    # A write answers through the same chain (no CSRF check on a bearer-key request).
    posted = http.post(
        f"/api/v1/contexts/{context.pk}/messages",
        json={"role": "user", "text": "over ASGI"},
        headers=headers,
    )
    assert posted.status_code == 201 and posted.json()["seq"] == 4
    missing = http.get("/api/v1/contexts")
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    # The dashboard keeps its middleware: the login page sets its CSRF cookie.
    login = http.get("/accounts/login/")
    assert login.status_code == 200 and "csrftoken" in login.headers.get("set-cookie", "")


@pytest.mark.django_db(transaction=True)
def test_api_requests_run_on_a_fixed_pool_of_threads(asgi_live_server):
    secret = auth.apikey_create(name="path", scopes=["read"]).secret
    http = httpx.Client(base_url=asgi_live_server.url, timeout=60)
    headers = {"Authorization": f"Bearer {secret}"}
    before = {t.name for t in threading.enumerate()}
    for _ in range(30):
        assert http.get("/api/v1/contexts", headers=headers).status_code == 200
    made = {t.name for t in threading.enumerate()} - before
    # A thread per request would leave up to 30 here; the pool's threads are reused.
    assert all(name.startswith("api") for name in made), made
    assert len(made) <= 10


def _store(api, n: int = 20) -> int:
    register_models(**{MODEL: 384})
    cid = new_context(api)
    items = [
        {"role": "user", "text": f"m{i}", "vector": _vector(i), "vector_model": MODEL}
        for i in range(n)
    ]
    response = api.post(f"/api/v1/contexts/{cid}/messages/batch", {"messages": items})
    assert response.status_code == 201
    return cid


# Committed as served: no test transaction around the request, whose walk then runs in a
# transaction of its own, as the API's requests do.
@pytest.mark.django_db(transaction=True)
def test_a_semantic_search_reads_key_and_context_once_and_the_walk_in_one_go(settings):
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 5  # the HNSW walk
    api = make_key()
    cid = _store(api)
    body = {
        "selector": "search",
        "query": "",
        "mode": "semantic",
        "k": 5,
        "model": MODEL,
        "query_vector": _vector(7),
    }
    # The context's size is known from the first search on (the batch's key read saw it
    # empty: an exact scan), the store's from the second.
    for _ in range(2):
        api.post(f"/api/v1/contexts/{cid}/select", body)
    pipelined = []

    def record(execute, sql, params, many, context):
        if sql not in ("BEGIN", "COMMIT"):
            pipelined.append(connection.connection.info.pipeline_status)
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(record):
        response = api.post(f"/api/v1/contexts/{cid}/select", body)
    assert response.status_code == 200
    assert "m7" in [item["message"]["text"] for item in response.json()["items"]]
    sent = [q["sql"] for q in queries.captured_queries]
    # The walk's own transaction around its settings and itself.
    assert sent[-1] == "COMMIT" and sent.count("BEGIN") == sent.count("COMMIT") == 1, sent
    statements = [sql for sql in sent if sql not in ("BEGIN", "COMMIT")]
    # The key and its context in one statement; the walk's settings; the walk, which reads the
    # hits' rows too: all in one round trip (the key's statement goes first in the walk's
    # pipeline). On Citus the key and the context are two statements (a join of the two is
    # planned in steps there) and the settings SET LOCAL statements (what it passes on to the
    # workers).
    sharded = scale_out.table_is_distributed("memory_app_embedding")
    walked = statements.index(_walk(statements))
    reads = 2 if sharded else 1
    key_sql, settings_sql, walk = statements[:reads], statements[reads:walked], statements[walked]
    assert len(statements) == walked + 1, statements
    assert pipelined[: walked + 1] == [psycopg.pq.PipelineStatus.ON] * (walked + 1), pipelined
    if sharded:
        assert "memory_app_apikey" in key_sql[0] and "memory_app_context" in key_sql[1]
        assert settings_sql and all(s.startswith("SET LOCAL ") for s in settings_sql)
        assert "hnsw.iterative_scan" in " ".join(settings_sql)
    else:
        assert "memory_app_apikey" in key_sql[0] and "memory_app_context" in key_sql[0]
        assert [s[:18] for s in settings_sql] == ["SELECT set_config("]
    assert "JOIN memory_app_message h" in walk
    # The query vector a binary parameter, not a literal. On one node the walk is prepared (its
    # own text logged, placeholders and all) and keeps one generic plan; on Citus it is not.
    if sharded:
        assert "$1::float8[]::vector(384)" in walk
    else:
        assert "%s::float8[]::vector(384)" in walk
        [(_, generic, custom)] = prepared_plans("%nearest AS MATERIALIZED%")
        assert generic >= 1 and custom == 0
    # The hits answer as a read of them by id would (every field, the text as stored).
    [hit] = [i for i in response.json()["items"] if i["message"]["text"] == "m7"]
    assert (
        hit["message"] == api.get(f"/api/v1/contexts/{cid}/messages/{hit['message']['id']}").json()
    )


@pytest.mark.django_db
def test_a_search_reading_its_key_with_the_walk_answers_every_error_as_before(settings):
    """For a key verified before, the walk runs before the key's row is looked at: nothing it
    found goes out unless the key passes, and each error answers as when the key is read first
    (401 before anything else, then 403 and 404 before the search's own 422)."""
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 5
    owner = make_key(context_keys={"user": "ada"})
    cid = _store(owner)
    path = f"/api/v1/contexts/{cid}/select"
    body = {"selector": "search", "mode": "semantic", "k": 3, "model": MODEL}
    good = {**body, "query_vector": _vector(7)}
    wrong_dims = {**body, "query_vector": [0.5, 0.5]}
    assert owner.post(path, good).status_code == 200  # the context's size is known from here
    other = make_key(context_keys={"user": "bob"})
    no_read = make_key(scopes=("write",))
    revoked = make_key()
    # Each key answered once, read first: from then on read with the walk where it may see
    # the context (another tenant's key is read first every time).
    assert [c.post(path, good).status_code for c in (other, no_read, revoked)] == [404, 403, 200]
    auth.apikey_revoke(key=revoked.key)
    forged = type(owner)(owner.secret[:-4] + "abcd")
    # A key string never verified is read before anything else: no walk for it.
    with CaptureQueriesContext(connection) as queries:
        assert forged.post(path, good).status_code == 401
    assert not [q for q in queries.captured_queries if "<=>" in q["sql"]]
    for client, sent, status in [
        (forged, good, 401),
        (forged, wrong_dims, 401),
        (forged, {**good, "k": 0}, 401),  # a body ninja refuses: still the key's 401
        (revoked, good, 401),
        (no_read, good, 403),
        (no_read, wrong_dims, 403),
        (other, good, 404),
        (other, wrong_dims, 404),
        (owner, wrong_dims, 422),
    ]:
        response = client.post(path, sent)
        assert response.status_code == status, (client.secret, sent, response.content)
        assert "items" not in response.json()
    assert "m7" in [i["message"]["text"] for i in owner.post(path, good).json()["items"]]


@pytest.mark.django_db
def test_a_single_append_reads_key_and_context_in_one_statement():
    api = make_key()
    cid = new_context(api)
    with CaptureQueriesContext(connection) as queries:
        response = api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "hi"})
    assert response.status_code == 201 and response.json()["seq"] == 1
    # The process asks once whether the store is distributed (`scale_out`): not the request's.
    statements = [
        q["sql"]
        for q in queries.captured_queries
        if "SAVEPOINT" not in q["sql"] and "pg_dist_partition" not in q["sql"]
    ]
    if scale_out.table_is_distributed("memory_app_context"):
        # Two statements sent together on Citus (a join of the two is planned in steps there).
        assert "memory_app_apikey" in statements[0] and "memory_app_context" in statements[1]
    else:
        assert "memory_app_apikey" in statements[0] and "memory_app_context" in statements[0]
    assert not any(s.startswith('SELECT "memory_app_context"') for s in statements), statements


def _context_reads(queries) -> list[str]:
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and "memory_app_context" in q["sql"]
    ]


@pytest.mark.django_db(transaction=True)
def test_an_append_to_contexts_on_shards_reads_an_unconfined_key_alone(monkeypatch):
    """On a distributed store the context's read is a hop to its worker: an append, whose
    statement finds the context itself, reads an unconfined key alone once the process knows
    it. (On one node the store is taken as distributed: the same statements run there.)"""
    for table in ("memory_app_context", "memory_app_message"):
        if not scale_out.table_is_distributed(table):
            monkeypatch.setitem(scale_out._distributed, table, True)
    monkeypatch.setattr(auth, "_confinements", {})
    api = make_key()
    cid = new_context(api)
    with CaptureQueriesContext(connection) as first:
        response = api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "a"})
    assert response.status_code == 201
    assert _context_reads(first)  # not known yet: read with the context
    size = (api.key.secret_hash, cid)
    seen = common._sizes.get(size)
    with CaptureQueriesContext(connection) as later:
        one = api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "b"})
        batch = api.post(
            f"/api/v1/contexts/{cid}/messages/batch",
            {"messages": [{"role": "user", "text": "c"}, {"role": "user", "text": "d"}]},
        )
    assert (one.status_code, one.json()["seq"]) == (201, 2)
    assert [m["seq"] for m in batch.json()["messages"]] == [3, 4]
    assert _context_reads(later) == [], _context_reads(later)
    # No count was read: the size last seen grows by what was stored, as a read would show.
    assert common._sizes.get(size) == seen + 3
    # A context that does not exist is not found, and nothing is written: one message (the
    # trigger's INSERT), a few (the pipelined path), a large batch (COPY).
    for path, n in (("messages", 1), ("messages/batch", 6), ("messages/batch", 60)):
        items = [{"role": "user", "text": f"x{i}"} for i in range(n)]
        response = api.post(
            f"/api/v1/contexts/999999/{path}", items[0] if n == 1 else {"messages": items}
        )
        assert response.status_code == 404 and "999999" in response.json()["detail"], n
    # Naming a run: the context is what is not found (no run is in a context that is not).
    run = api.post(f"/api/v1/contexts/{cid}/runs", {"task": "t"}).json()["id"]
    response = api.post(
        "/api/v1/contexts/999999/messages", {"role": "user", "text": "x", "run_id": run}
    )
    assert (response.status_code, response.json()["detail"]) == (404, "context 999999 not found")
    assert not Message.objects.filter(context_id=999999).exists()
    # A key confined since is read with the context again: outside its confinement, not found.
    other = new_context(api, {"user": "bob", "chat": "1"})
    auth.ApiKey.objects.filter(pk=api.key.pk).update(context_keys={"user": "bob"})
    assert (
        api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "no"}).status_code
        == 404
    )
    assert (
        api.post(f"/api/v1/contexts/{other}/messages", {"role": "user", "text": "yes"}).status_code
        == 201
    )
    assert Message.objects.filter(context_id=cid).count() == 4
    # Revoked, it writes nowhere.
    auth.apikey_revoke(key=auth.ApiKey.objects.get(pk=api.key.pk))
    assert (
        api.post(f"/api/v1/contexts/{other}/messages", {"role": "user", "text": "x"}).status_code
        == 401
    )


SENT = {
    "role": "assistant",
    "name": "tool-user",
    "text": "line\twith 'quotes' and \\ back",
    "content": [{"type": "text", "text": "é", "z": 1, "a": [1.5, None]}],
    "tags": ["x", "", 'q"uote'],
    "metadata": {"zeta": 1, "alpha": {"b": 2, "a": 1}, "big": 2**70},
    "source_timestamp": "2024-01-01 10:00:00",
    "client_id": "c-1",
}


@pytest.mark.django_db
def test_a_small_append_stores_what_it_was_sent_through_its_own_insert():
    context = make_context()
    result = messages_append(context=context, items=[SENT, {"role": "user", "text": "two"}])
    first, second = result.messages
    assert (first.seq, second.seq) == (1, 2) and first.pk and second.pk == first.pk + 1
    stored = Message.objects.get(pk=first.pk)
    for name, value in SENT.items():
        assert getattr(stored, name) == value, name
    assert list(stored.metadata) == ["zeta", "alpha", "big"]  # key order as written
    assert (stored.created_at, stored.updated_at) == (first.created_at, first.updated_at)
    # A tag longer than its column is refused, as the column refuses it; nothing is written.
    with pytest.raises(DataError), transaction.atomic():
        messages_append(context=context, items=[{"role": "user", "tags": ["t" * 201]}])
    # A NaN (which no JSON text holds) fails the row as it did through the ORM, never null.
    with pytest.raises(DataError), transaction.atomic():
        messages_append(context=context, items=[{"role": "user", "metadata": {"x": float("nan")}}])
    assert Message.objects.filter(context=context).count() == 2
    context.refresh_from_db()
    assert (context.last_seq, context.message_count) == (2, 2)


def _raw_params() -> dict:
    """The test database's connection parameters for a psycopg connection of a test's own."""
    return {k: v for k, v in connection.get_connection_params().items() if k != "context"}


def test_a_pooled_connection_that_just_served_skips_the_check_unless_the_server_closed_it(
    tmp_path,
):
    params = _raw_params()
    with (
        psycopg.connect(**params, autocommit=True) as conn,
        psycopg.connect(**params, autocommit=True) as other,
    ):
        trace = tmp_path / "protocol.trace"
        with trace.open("w") as out:
            conn.pgconn.trace(out.fileno())
            db_pool.mark_idle(conn)
            db_pool.check_connection(conn)  # given back just now: nothing is sent
            out.flush()
            assert trace.read_text() == ""
            # Given back longer ago: the empty query goes out and is answered.
            conn._agentmemory_idle_since -= db_pool.RECENT_SECONDS + 1
            db_pool.check_connection(conn)
            conn.pgconn.untrace()
        assert "Query" in trace.read_text()
        # Closed by the server since it was given back: its socket turns readable, and the
        # check sees the connection is gone.
        db_pool.mark_idle(conn)
        other.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        assert select.select([conn.pgconn.socket], [], [], 10)[0]
        with pytest.raises(psycopg.OperationalError):
            db_pool.check_connection(conn)


@pytest.mark.django_db
def test_rows_read_without_the_orm_hold_the_json_the_orm_reads():
    """`db.from_row` (the window, the hits, the key and its context) decodes JSON columns with
    orjson, and with the field's own decoder what orjson refuses: the same values either way."""
    context = make_context()
    odd = {"huge": 2**70 + 1, "low": -(2**63), "x": [-0.0, 1e-7, "é😀"], "id": "1" * 19}
    sent = {**SENT, "metadata": odd, "content": {"z": {"b": 2**64, "a": None}, "far": 1.5e300}}
    [message] = messages_append(context=context, items=[sent]).messages
    with connection.cursor() as cursor:
        # A number beyond a double's range, as JSON text of the column can hold it.
        cursor.execute(
            "UPDATE memory_app_message SET content = replace(content::text, '1.5e+300', '1e400')"
            "::json WHERE id = %s",
            [message.pk],
        )
    read, stored = _read_without_the_orm(message.pk), Message.objects.get(pk=message.pk)
    for field in ("content", "metadata", "key_order", "tags", "created_at"):
        assert getattr(read, field) == getattr(stored, field), field
    assert read.metadata["huge"] == 2**70 + 1 and type(read.metadata["huge"]) is int
    assert read.metadata["low"] == -(2**63) and type(read.metadata["low"]) is int
    assert read.content["far"] == float("inf")
    assert list(read.content) == list(stored.content) and repr(read.metadata) == repr(
        stored.metadata
    )
    # Nothing orjson reads otherwise: decoded by it, the same values in the same key order.
    plain = {"zeta": [-0.0, 1e-7, 0.1, 5e-324], "alpha": {"é😀": None, "b": True}, "n": 2**63}
    item = {**SENT, "metadata": plain, "client_id": "c-2"}
    [other] = messages_append(context=context, items=[item]).messages
    read, stored = _read_without_the_orm(other.pk), Message.objects.get(pk=other.pk)
    assert repr(read.metadata) == repr(stored.metadata) == repr(plain)
    assert repr(read.content) == repr(stored.content)


@pytest.mark.django_db
def test_a_row_read_without_the_orm_is_built_by_the_model_when_something_listens():
    """With a post_init listener on the model, `db.from_row` builds the instance as the ORM
    does (the listener sees it); without one, straight into its fields: the same values."""
    from django.db.models.signals import post_init

    [message] = messages_append(context=make_context(), items=[SENT]).messages
    quick = _read_without_the_orm(message.pk)
    seen = []

    def listener(instance, **kwargs):
        seen.append(instance)

    post_init.connect(listener, sender=Message)
    try:
        built = _read_without_the_orm(message.pk)
    finally:
        post_init.disconnect(listener, sender=Message)
    assert seen == [built]
    assert {f.attname: getattr(built, f.attname) for f in Message._meta.concrete_fields} == {
        f.attname: getattr(quick, f.attname) for f in Message._meta.concrete_fields
    }


def _read_without_the_orm(pk: int) -> Message:
    """A message read as the hot paths read it: its columns, then `db.from_row`."""
    from memory_app import db

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {db.select_columns(Message, 'm')} FROM memory_app_message m WHERE m.id = %s",  # noqa: S608
            [pk],
        )
        return db.from_row(Message, cursor.fetchone())


@pytest.mark.django_db
def test_a_foreign_or_unknown_context_is_still_not_found():
    owner = make_key(context_keys={"tenant": "a"})
    other = make_key(context_keys={"tenant": "b"})
    cid = new_context(owner, {"tenant": "a", "chat": "1"})
    assert owner.get(f"/api/v1/contexts/{cid}/messages").status_code == 200
    assert other.get(f"/api/v1/contexts/{cid}/messages").status_code == 404
    assert owner.get("/api/v1/contexts/999999/messages").status_code == 404
    assert make_key(scopes=("read",)).post(
        f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "x"}
    ).status_code in (403, 404)


@pytest.mark.django_db(transaction=True)
def test_the_walk_goes_out_with_its_transaction_in_one_round_trip(settings):
    """Outside a transaction: BEGIN, the settings, the walk and COMMIT all in one pipeline."""
    settings.AGENTMEMORY_SEARCH_EXACT_THRESHOLD = 5
    api = make_key()
    cid = _store(api)
    seen = []

    def record(execute, sql, params, many, context):
        seen.append((sql.split()[0], connection.connection.info.pipeline_status))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        hits, path = semantic_ranking(
            context_id=cid, model=MODEL, vector=_vector(3), limit=5, context_size=20
        )
    assert path == "hnsw" and hits[0][0] and len(hits) == 5
    on = psycopg.pq.PipelineStatus.ON
    # (A first search reads the store's size before: cached afterwards.) On Citus the settings
    # are SET LOCAL statements, one a setting.
    begin = len(seen) - 1 - [kind for kind, _ in seen][::-1].index("BEGIN")
    settings_sent = [kind for kind, _ in seen[begin + 1 : -2]]
    assert settings_sent and settings_sent in (["SELECT"], ["SET"] * len(settings_sent)), seen
    sent = [("BEGIN", on), *[(kind, on) for kind in settings_sent], ("WITH", on)]
    assert seen[begin:] == [*sent, ("COMMIT", on)], seen
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # A failing walk rolls its transaction back: the connection is usable at once.
    with pytest.raises(Exception), connection.execute_wrapper(_fail_walk):
        semantic_ranking(context_id=cid, model=MODEL, vector=_vector(3), limit=5, context_size=20)
    assert connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_sort')")
        assert cursor.fetchone()[0] == "on"  # SET LOCAL's values ended with the transaction


def _walk(statements: list[str]) -> str:
    return next(s for s in statements if "<=>" in s)


def _fail_walk(execute, sql, params, many, context):
    if sql.lstrip().startswith("WITH"):
        sql = "SELECT 1/0"
        params = None
    return execute(sql, params, many, context)


@pytest.mark.django_db
def test_a_batch_answers_ids_and_seqs_unless_asked_for_the_whole_messages():
    api = make_key()
    cid = new_context(api)
    batch = f"/api/v1/contexts/{cid}/messages/batch"
    body = {
        "messages": [
            {"role": "user", "text": "a", "client_id": "c1"},
            {"role": "assistant", "text": "b"},
        ]
    }
    short = api.post(batch, body)
    assert short.status_code == 201
    first, second = short.json()["messages"]
    assert first == {"id": first["id"], "seq": 1, "client_id": "c1"}
    assert second == {"id": second["id"], "seq": 2, "client_id": None}
    assert short.json()["created"] == [True, True]
    # The whole stored messages, as before, when asked: a repeat answers the stored ones.
    full = api.post(batch + "?return=full", {"messages": body["messages"][:1]})
    assert full.status_code == 200
    [stored] = full.json()["messages"]
    assert (stored["id"], stored["text"], stored["role"]) == (first["id"], "a", "user")
    assert "token_count" in stored and full.json()["created"] == [False]
    assert api.post(batch + "?return=everything", body).status_code == 422


@pytest.mark.django_db(transaction=True)
def test_an_append_outside_a_transaction_is_one_statement_and_stores_what_it_was_sent():
    context = make_context()
    with CaptureQueriesContext(connection) as queries:
        result = messages_append(context=context, items=[SENT, {"role": "user", "text": "two"}])
    # The repeats' check (the items carry a client id), then the whole append in one statement:
    # an INSERT whose rows take their seqs from the table's trigger, which updates the counters
    # and writes the full-text rows.
    # The process asks once whether the store is distributed (`scale_out`): not the append's.
    statements = [
        " ".join(q["sql"].split())
        for q in queries.captured_queries
        if "pg_dist_partition" not in q["sql"]
    ]
    assert len(statements) == 2, statements
    assert statements[1].startswith("INSERT INTO memory_app_message (context_id, seq,")
    assert "VALUES ($1, NULL," in statements[1] or "VALUES (%s, NULL," in statements[1]
    first, second = result.messages
    assert (first.seq, second.seq) == (1, 2) and second.pk > first.pk
    stored = Message.objects.get(pk=first.pk)
    for name, value in SENT.items():
        assert getattr(stored, name) == value, name
    assert list(stored.metadata) == ["zeta", "alpha", "big"]  # key order as written
    assert (stored.created_at, stored.updated_at) == (first.created_at, first.updated_at)
    assert stored.token_count == first.token_count > 0
    context.refresh_from_db()
    assert (context.last_seq, context.search_seq, context.message_count) == (2, 2, 2)
    assert context.token_count == first.token_count + second.token_count
    # Its full-text rows are written with it: keyword search finds it by index at once.
    assert (
        MessageSearch.objects.filter(context_id=context.pk, search_vector__isnull=False).count()
        == 2
    )
    # A repeat of the client id answers the stored message and writes nothing.
    again = messages_append(context=context, items=[SENT])
    assert again.created == [False] and again.messages[0].pk == first.pk
    # A tag longer than its column and a NaN are refused as before; nothing is written.
    with pytest.raises(DataError):
        messages_append(context=context, items=[{"role": "user", "tags": ["t" * 201]}])
    with pytest.raises(DataError):
        messages_append(context=context, items=[{"role": "user", "metadata": {"x": float("nan")}}])
    context.refresh_from_db()
    assert (context.last_seq, context.message_count) == (2, 2)
    assert Message.objects.filter(context=context).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_small_append_is_prepared_once_on_its_connection():
    context = make_context()
    for n in (1, 1, 2, 1):
        items = [{"role": "user", "text": f"m{i}"} for i in range(n)]
        messages_append(context=context, items=items)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE %s",
            ["INSERT INTO memory_app_message (context_id, seq,%"],
        )
        prepared = [row[0] for row in cursor.fetchall()]
    # One statement a number of rows, each parsed once, then executed by name (on Citus the
    # append is sent unprepared).
    sharded = scale_out.table_is_distributed(Message._meta.db_table)
    assert len(prepared) == (0 if sharded else 2), prepared
    assert Message.objects.filter(context=context).count() == 5


@pytest.mark.django_db(transaction=True)
def test_an_append_of_more_messages_counts_them_once_and_one_behind_on_full_text_waits(
    monkeypatch,
):
    """More than a few messages go by the statement that updates the counters once (on one
    node; the pipelined path on Citus); a context whose full-text rows are behind gets none from
    an append (the indexer writes them), and its counters move all the same."""
    context = make_context()
    texts = [f"message {i} about otters" for i in range(messages.ONE_STATEMENT_MAX + 2)]
    with CaptureQueriesContext(connection) as queries:
        result = messages_append(
            context=context, items=[{"role": "user", "text": t} for t in texts]
        )
    # (The process asks once whether the store is distributed: not the append's.)
    statements = [
        " ".join(q["sql"].split())
        for q in queries.captured_queries
        if "pg_dist_partition" not in q["sql"]
    ]
    if not scale_out.table_is_distributed("memory_app_message"):
        assert len(statements) == 1 and statements[0].startswith("WITH c AS ( UPDATE"), statements
    assert [m.seq for m in result.messages] == list(range(1, len(texts) + 1))
    assert [m.text for m in Message.objects.filter(context=context).order_by("seq")] == texts
    context.refresh_from_db()
    assert (context.last_seq, context.search_seq, context.message_count) == (6, 6, 6)
    # Behind on full text (as a large batch leaves it until the indexer runs): an append of one
    # message, by the trigger, writes no full-text row and wakes the indexer, which the trigger
    # tells (the caller's copy of the context, read before, says caught up).
    woken = []
    monkeypatch.setattr(messages, "_wake_indexer", lambda: woken.append(True))
    Context.objects.filter(pk=context.pk).update(search_seq=3)
    MessageSearch.objects.filter(context_id=context.pk, seq__gt=3).delete()
    [one] = messages_append(context=context, items=[{"role": "user", "text": "late"}]).messages
    assert one.seq == 7 and woken == [True]
    context.refresh_from_db()
    assert (context.last_seq, context.search_seq, context.message_count) == (7, 3, 7)
    assert not MessageSearch.objects.filter(context_id=context.pk, seq__gt=3).exists()
    # Caught up again, an append writes its own row and wakes nothing.
    Context.objects.filter(pk=context.pk).update(search_seq=7)
    messages_append(context=context, items=[{"role": "user", "text": "on time"}])
    assert woken == [True]
    assert MessageSearch.objects.filter(context_id=context.pk, seq=8).exists()


@pytest.mark.django_db(transaction=True)
def test_an_append_to_a_context_gone_meanwhile_is_not_found_and_writes_nothing():
    context = make_context()
    Context.objects.filter(pk=context.pk).delete()
    for _ in range(3):
        with pytest.raises(NotFound):
            messages_append(context=context, items=[{"role": "user", "text": "into nothing"}])
    assert not Message.objects.filter(context_id=context.pk).exists()
    # Each failure was the statement's first execution by name on the connection: none of the
    # three is left prepared on the server.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] == 0


@pytest.mark.django_db(transaction=True)
def test_an_append_whose_full_text_row_fails_keeps_the_message_and_marks_the_row():
    api = make_key()
    cid = new_context(api)
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE memory_app_messagesearch ADD CONSTRAINT poisoned_vector"
            " CHECK (NOT search_vector @@ to_tsquery('english', 'nightshade'))"
        )
    try:
        response = api.post(
            f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "a nightshade note"}
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE memory_app_messagesearch DROP CONSTRAINT poisoned_vector")
    assert response.status_code == 201 and response.json()["seq"] == 1
    assert Message.objects.get(pk=response.json()["id"]).text == "a nightshade note"
    marked = MessageSearch.objects.get(context_id=cid, seq=1)
    assert marked.search_vector is None and "poisoned_vector" in marked.error
    ok = api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": "fine"})
    assert ok.status_code == 201 and ok.json()["seq"] == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "texts, sharded",
    [(1, False), (1, True), (messages.ONE_STATEMENT_MAX + 2, False)],
    ids=["trigger", "trigger-as-on-citus", "statement"],
)
def test_an_append_queues_its_messages_for_the_configured_model(
    settings, monkeypatch, texts, sharded
):
    """Through the trigger's INSERT (a few messages; the queue's rows from a CTE after it on one
    node, on Citus from a trigger, for the model its transaction names) and the one-statement
    CTE (more) alike."""
    if sharded:
        monkeypatch.setitem(scale_out._distributed, "memory_app_message", True)
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "openai"
    settings.AGENTMEMORY_EMBEDDING_MODEL = "queued-model"
    context = make_context()
    items = [{"role": "user", "text": f"embed me {i}"} for i in range(texts)]
    result = messages_append(context=context, items=[*items, {"role": "user"}])
    queued = Embedding.objects.filter(context_id=context.pk).order_by("message_id")
    # A message without text has nothing to embed.
    assert [(e.message_id, e.model, e.vector) for e in queued] == [
        (m.pk, "queued-model", None) for m in result.messages[:texts]
    ]
    # The model is named for that transaction only: with none configured, the same
    # connection's next append queues nothing.
    settings.AGENTMEMORY_EMBEDDING_PROVIDER = "none"
    [later] = messages_append(
        context=context, items=[{"role": "user", "text": "no model"}]
    ).messages
    assert later.pk and not Embedding.objects.filter(message_id=later.pk).exists()
    assert queued.count() == texts


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body, expected, read",
    [
        (
            {"selector": "search", "query": "river otters", "mode": "keyword", "k": 3},
            [0, 1, 2],
            ("websearch_to_tsquery", "FROM memory_app_message x"),
        ),
        ({"selector": "window", "k": 2}, [2, 3], ("ORDER BY m.seq DESC LIMIT",)),
        (
            {"selector": "token_window", "max_tokens": 9, "semantics": "plain"},
            [2, 3],
            ("ORDER BY m.seq DESC LIMIT",),
        ),
    ],
    ids=["keyword", "window", "token_window"],
)
def test_a_selection_in_one_read_reads_its_key_with_it(body, expected, read):
    """A keyword search on a small context (ranked, its hits read, in one statement), the
    window (one statement) and a token window answered by its first read take a key verified
    before, and its context, in the same round trip; nothing goes out before the key has
    passed, and errors answer as before."""
    api = make_key(context_keys={"user": "ada"})
    cid = new_context(api, keys={"user": "ada", "thread": "t"})
    texts = ["otters hold hands", "the river otter", "a quiet river", "nothing here"]
    for text in texts:
        response = api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": text})
        assert response.status_code == 201
    # The scale-out probe, once per process and table, is not the request's (the window asks
    # it of the messages).
    sharded = scale_out.table_is_distributed("memory_app_context")
    scale_out.table_is_distributed("memory_app_message")
    pipelined = []

    def record(execute, sql, params, many, context):
        if "SAVEPOINT" not in sql and "memory_app_search_chars" not in sql:
            pipelined.append(connection.connection.info.pipeline_status)
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(record):
        response = api.post(f"/api/v1/contexts/{cid}/select", body)
    assert response.status_code == 200
    items = response.json()["items"]
    # In the prompt's order (oldest first), as a selector answers.
    assert [i["message"]["text"] for i in items] == [texts[i] for i in expected]
    statements = [
        q["sql"]
        for q in queries.captured_queries
        if "SAVEPOINT" not in q["sql"] and "memory_app_search_chars" not in q["sql"]
    ]
    # The key and its context, then the selection's one read: all in one round trip. On Citus
    # the key and the context are two statements (the context's filtered by the key's
    # confinement, verified by the appends above).
    reads = 2 if sharded else 1
    assert len(statements) == reads + 1, statements
    assert "memory_app_apikey" in statements[0] and "memory_app_context" in statements[reads - 1]
    assert all(part in statements[reads] for part in read), statements[reads]
    assert pipelined == [psycopg.pq.PipelineStatus.ON] * (reads + 1), pipelined
    # The hits answer as a read of them by id would (every field, the text as stored).
    for item in items:
        message = item["message"]
        assert message == api.get(f"/api/v1/contexts/{cid}/messages/{message['id']}").json()
    # The selection's rows go out only once the key has passed, with the errors as before.
    other = make_key(context_keys={"user": "bob"})
    no_read = make_key(scopes=("write",))
    path = f"/api/v1/contexts/{cid}/select"
    assert [c.post(path, body).status_code for c in (other, no_read)] == [404, 403]
    # A key verified on a context of its own is still read first on one it may not see: no
    # search runs on another tenant's messages (its timing would tell something of them).
    bobs = new_context(other, keys={"user": "bob", "thread": "b"})
    assert other.post(f"/api/v1/contexts/{bobs}/select", body).status_code == 200
    with CaptureQueriesContext(connection) as queries:
        assert other.post(path, body).status_code == 404
    assert not [q for q in queries.captured_queries if read[0] in q["sql"]], queries
    assert any("memory_app_apikey" in q["sql"] for q in queries.captured_queries), queries
    revoked = make_key()
    assert revoked.post(path, body).status_code == 200
    auth.apikey_revoke(key=revoked.key)
    for client, status in [(other, 404), (no_read, 403), (revoked, 401)]:
        response = client.post(path, body)
        assert response.status_code == status, (client.secret, response.content)
        assert "items" not in response.json()


@pytest.mark.django_db(transaction=True)
def test_a_key_read_prepared_before_a_migration_answers_503_once_then_reads_again():
    """The key's statement is prepared on the connection. A migration that changes a column it
    reads, applied while the server runs, makes PostgreSQL refuse it on that connection for
    good ("cached plan must not change result type"): the request answers 503 with
    Retry-After, the connection is dropped, and the next request prepares it anew. So for the
    key read alone (a list) and the key read deferred into a selection's round trip."""
    client = make_key()
    cid = new_context(client)
    requests = [
        lambda: client.get(f"/api/v1/contexts/{cid}/messages"),
        lambda: client.post(f"/api/v1/contexts/{cid}/select", {"selector": "window", "k": 5}),
    ]
    assert [request().status_code for request in requests] == [200, 200]
    other = psycopg.connect(**_raw_params(), autocommit=True)
    other.execute("SET lock_timeout = '10s'")  # a stray lock fails the test, never hangs it
    try:
        for length, request in zip((201, 200), requests, strict=True):
            other.execute(f"ALTER TABLE memory_app_apikey ALTER COLUMN name TYPE varchar({length})")
            refused = request()
            assert refused.status_code == 503 and refused["Retry-After"], refused.content
            again = request()
            assert again.status_code == 200, again.content
    finally:
        if connection.connection is not None:  # its statements were prepared on the change
            connection.connection.close()
        connection.close()
        other.execute("ALTER TABLE memory_app_apikey ALTER COLUMN name TYPE varchar(200)")
        other.close()


@pytest.mark.django_db(transaction=True)
def test_the_window_read_runs_on_one_plan_that_walks_the_live_messages_index(system_actor):
    """On one node the window's read is prepared and planned once for any context and k (its
    generic plan): an index of the context's messages walked newest first under the limit, no
    sort (on a large store the live messages' index, which holds no pruned row; on this small
    one the planner may walk the (context, seq) index instead); the answers are the last k live
    messages whatever k. On Citus it is sent unprepared."""
    from memory_app.selectors import WindowSpec, select
    from memory_app.services.curation import messages_set_pruned

    contexts = []
    for n in (30, 7):
        context = make_context()
        stored = messages_append(
            context=context, items=[{"role": "user", "text": f"m{i}"} for i in range(n)]
        ).messages
        messages_set_pruned(context=context, ids=[stored[-2].pk], pruned=True, actor=system_actor)
        contexts.append((context, [m.pk for m in stored if m.pk != stored[-2].pk]))
    for k in (1, 5, 20, 40):
        for context, live in contexts:
            got = [item.message.pk for item in select(context=context, spec=WindowSpec(k=k)).items]
            assert got == live[-k:]
    # Over the API, as a request runs (outside a transaction): the window and a token window,
    # the second of each with the key read in the same round trip (verified by the first).
    api = make_key()
    cid = new_context(api)
    for text in ("one", "two", "three"):
        assert api.post(f"/api/v1/contexts/{cid}/messages", {"role": "user", "text": text})
    window = {"selector": "window", "k": 2}
    tokens = {"selector": "token_window", "max_tokens": 50, "semantics": "plain"}
    for body in (window, tokens, window, tokens):
        response = api.post(f"/api/v1/contexts/{cid}/select", body)
        assert response.status_code == 200
        texts = [item["message"]["text"] for item in response.json()["items"]]
        assert texts == (["two", "three"] if body is window else ["one", "two", "three"])
    prepared = prepared_plans(
        "%FROM memory_app_message m WHERE m.context_id = $1 AND m.pruned_at IS NULL%"
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('plan_cache_mode')")
        assert cursor.fetchone()[0] == "auto"  # the setting ended with the read's round trip
    if scale_out.table_is_distributed("memory_app_message"):
        assert prepared == []
        return
    [(statement, generic, custom)] = prepared
    assert (generic, custom) == (12, 0)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("EXPLAIN (GENERIC_PLAN, COSTS OFF) " + statement)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert plan.startswith("Limit") and "Sort" not in plan, plan
    assert (
        "Index Scan using message_live_recent_idx" in plan
        or "Index Scan Backward using message_context_seq_unique" in plan
    ), plan


@pytest.mark.django_db(transaction=True)
def test_a_prepared_read_that_fails_leaves_no_statement_behind():
    """psycopg forgets a prepared statement whose first run failed, the server keeps it: a
    read failing again and again on one connection would leave one more each time. A failed
    prepared read drops the connection's prepared statements (the next reads prepare theirs
    anew), and answers its error as before."""
    from memory_app import pipelines
    from memory_app.selectors import _NEWEST_SQL

    context = make_context()
    for _ in range(3):
        with pytest.raises(DataError):  # LIMIT must not be negative
            pipelines.read_rows(_NEWEST_SQL, [context.pk, -1], prepared=True, generic=True)
    assert prepared_plans("%ORDER BY m.seq DESC LIMIT $2%") == []
    assert pipelines.read_rows(_NEWEST_SQL, [context.pk, 5], prepared=True, generic=True) == []
