"""A backup either goes back whole or not at all: the trailer that ends every export is
recomputed on import (a copy cut short, a line changed or dropped is a 422 that writes nothing),
a restored context's counters come from its rows, and POST /api/v1/import streams a body far
larger than the API's request-body limit under a limit of its own."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import RequestFactory, override_settings
from django.test.client import ClientHandler

from memory_app.models import Context, MemoryRecord, Message, Run, keys_digest
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, steps_append
from tests.api_helpers import make_key
from tests.builders import BACKUP_HEADER, backup_file, signed_backup

pytestmark = pytest.mark.django_db

KEYS = {"user": "ada", "chat": "whole"}


def _fill(messages: int, *, text_size: int = 40) -> Context:
    ctx, _ = context_get_or_create(keys=KEYS, title="Whole")
    run, _ = run_create(context=ctx, client_id="run-1", task="t")
    steps_append(run=run, items=[{"kind": "task", "task": "t", "payload": {"task": "t"}}])
    for start in range(0, messages, 1000):
        items = [
            {"role": "user", "text": f"message {n} " + "x" * text_size, "metadata": {"n": n}}
            for n in range(start, min(start + 1000, messages))
        ]
        messages_append(context=ctx, items=items)
    return ctx


def _export(admin, **params) -> bytes:
    response = admin.get("/api/v1/export", params)
    assert response.status_code == 200
    return b"".join(response.streaming_content)


def _import(admin, body: bytes | str):
    return admin.client.generic(
        "POST", "/api/v1/import", body, content_type="application/x-ndjson", **admin._headers()
    )


def _wipe():
    MemoryRecord.objects.all().delete()
    Context.objects.all().delete()


def _nothing_stored():
    return not (Context.objects.exists() or Message.objects.exists() or Run.objects.exists())


def test_an_export_ends_with_a_trailer_of_its_counts_and_the_digest_of_the_lines_before_it():
    admin = make_key(scopes=["read", "write", "admin"])
    _fill(5)
    body = _export(admin)
    *lines, last = body.splitlines(keepends=True)
    trailer = json.loads(last)
    kinds = [json.loads(line)["type"] for line in lines]
    assert json.loads(lines[0]) == {**BACKUP_HEADER, "embeddings": False}
    assert trailer == {
        "type": "trailer",
        "counts": {
            "context": 1,
            "run": 1,
            "step": 1,
            "message": 5,
            "score": 0,
            "label": 0,
            "comment": 0,
            "checkpoint": 0,
            "checkpoint_blob": 0,
            "checkpoint_write": 0,
            "memory": 0,
            "memory_version": 0,
            "embedding": 0,
        },
        "sha256": hashlib.sha256(b"".join(lines)).hexdigest(),
    }
    assert kinds.count("message") == 5 and last.endswith(b"\n")


def _cut_after(lines, n):
    """The first lines of a file, up to and with its n-th message line."""
    messages = [i for i, line in enumerate(lines) if b'"type":"message"' in line]
    return lines[: messages[n - 1] + 1]


def _cut_after_179_messages(lines):
    return _cut_after(lines, 179)


def _edit_a_message(lines):
    at = next(i for i, line in enumerate(lines) if b'"text":"message 7 ' in line)
    return [*lines[:at], lines[at].replace(b"message 7 ", b"message 8 "), *lines[at + 1 :]]


def _drop_a_message(lines):
    at = next(i for i, line in enumerate(lines) if b'"text":"message 7 ' in line)
    return [*lines[:at], *lines[at + 1 :]]


def _trailer_says(lines, **changes):
    trailer = json.loads(lines[-1])
    trailer.update(changes)
    return [*lines[:-1], json.dumps(trailer).encode() + b"\n"]


def _as_version_1(lines):
    # What an export wrote before trailers: header version 1, no last line.
    header = {**json.loads(lines[0]), "version": 1}
    return [json.dumps(header).encode() + b"\n", *lines[1:-1]]


@pytest.mark.parametrize(
    ("damage", "complaint"),
    [
        (_cut_after_179_messages, "without its trailer"),
        (lambda lines: lines[:-1], "without its trailer"),
        (_edit_a_message, "sha256"),
        (_drop_a_message, "counts"),
        (
            lambda lines: _trailer_says(
                lines,
                counts={**json.loads(lines[-1])["counts"], "message": 299},
            ),
            "counts",
        ),
        (lambda lines: _trailer_says(lines, sha256="0" * 64), "sha256"),
        (lambda lines: _trailer_says(lines, sha256=None), "sha256"),
        (lambda lines: [*lines, lines[1]], "follows the trailer"),
        (lambda lines: [*lines, lines[-1]], "follows the trailer"),
        (_as_version_1, "version 1"),
    ],
    ids=[
        "cut-at-a-line-boundary",
        "trailer-missing",
        "line-edited",
        "line-dropped",
        "counts-wrong",
        "digest-wrong",
        "digest-missing",
        "line-after-trailer",
        "second-trailer",
        "version-1-export",
    ],
)
def test_an_import_that_is_not_the_whole_export_is_a_422_and_writes_nothing(damage, complaint):
    admin = make_key(scopes=["read", "write", "admin"])
    _fill(300)
    body = _export(admin)
    _wipe()
    response = _import(admin, b"".join(damage(body.splitlines(keepends=True))))
    assert response.status_code == 422, response.content[:300]
    assert complaint in response.json()["detail"]
    assert _nothing_stored()
    # The export itself goes back in whole.
    assert _import(admin, body).status_code == 200
    assert Message.objects.count() == 300


def test_a_restored_contexts_counters_are_counted_from_its_rows_not_taken_from_the_file():
    """The file's counters say 300 messages; it holds 3. The next append takes seq 4."""
    admin = make_key(scopes=["read", "write", "admin"])
    digest = keys_digest(KEYS)
    stamp = {"created_at": "2026-01-02T10:00:00+00:00", "updated_at": "2026-01-02T10:00:00+00:00"}
    records = [
        BACKUP_HEADER,
        {
            "type": "context",
            "digest": digest,
            "keys": KEYS,
            "title": "",
            "metadata": {},
            "last_seq": 300,
            "message_count": 300,
            "token_count": 99_999,
            "run_count": 9,
            **stamp,
        },
        *(
            {"type": "message", "context": digest, "seq": n, "role": "user", "text": f"m{n}"}
            for n in (1, 2, 3)
        ),
    ]
    response = _import(admin, backup_file(records))
    assert response.status_code == 200, response.content
    ctx = Context.objects.get(keys_digest=digest)
    assert (ctx.last_seq, ctx.message_count, ctx.run_count) == (3, 3, 0)
    assert ctx.token_count == sum(ctx.messages.values_list("token_count", flat=True)) > 0
    [later] = messages_append(context=ctx, items=[{"role": "user", "text": "next"}]).messages
    assert later.seq == 4


def test_the_cli_import_checks_the_trailer_and_reads_strict_json(tmp_path):
    _fill(20)
    path = tmp_path / "backup.jsonl"
    call_command("export_memory", "-o", str(path))
    lines = path.read_bytes().splitlines(keepends=True)
    _wipe()

    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(_cut_after(lines, 12)))
    with pytest.raises(CommandError, match="without its trailer"):
        call_command("import_memory", str(cut))
    assert _nothing_stored()

    # NaN is no JSON number: the line is refused even in a file whose trailer is right.
    text = [line.decode() for line in lines[:-1]]
    at = next(i for i, line in enumerate(text) if '"text":"message 3 ' in line)
    text[at] = text[at].replace('"metadata":{"n":3}', '"metadata":{"n":NaN}')
    nan = tmp_path / "nan.jsonl"
    nan.write_text(signed_backup(text))
    with pytest.raises(CommandError, match=f"line {at + 1} is not JSON: NaN"):
        call_command("import_memory", str(nan))
    assert _nothing_stored()

    call_command("import_memory", str(path), stdout=io.StringIO())
    assert Message.objects.count() == 20


def test_a_version_1_file_goes_in_only_when_the_operator_says_so(tmp_path):
    """Files written before the trailer cannot be checked: the API refuses them (tested above),
    the command imports one only with --unchecked-version-1 (the documented way over an upgrade
    that needs an export from the old version)."""
    _fill(20)
    path = tmp_path / "backup.jsonl"
    call_command("export_memory", "-o", str(path))
    old = tmp_path / "v1.jsonl"
    old.write_bytes(b"".join(_as_version_1(path.read_bytes().splitlines(keepends=True))))
    _wipe()
    with pytest.raises(CommandError, match="version 1 .* --unchecked-version-1"):
        call_command("import_memory", str(old))
    assert _nothing_stored()

    call_command("import_memory", "--unchecked-version-1", str(old), stdout=io.StringIO())
    ctx = Context.objects.get(keys_digest=keys_digest(KEYS))
    assert (ctx.last_seq, ctx.message_count, ctx.run_count) == (20, 20, 1)
    # The option checks nothing less in a file that has a trailer.
    _wipe()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(_cut_after(path.read_bytes().splitlines(keepends=True), 12)))
    with pytest.raises(CommandError, match="without its trailer"):
        call_command("import_memory", "--unchecked-version-1", str(cut))
    assert _nothing_stored()


def _over_the_body_limit(admin) -> bytes:
    """An export a little over the API's body limit (64 KiB here), and proof that limit holds:
    a message of the same size is a 413."""
    ctx = _fill(120, text_size=200)
    body = _export(admin)
    assert 64 * 1024 < len(body) < 96 * 1024
    huge = admin.post(f"/api/v1/contexts/{ctx.pk}/messages", {"role": "user", "text": "x" * 70_000})
    assert huge.status_code == 413
    _wipe()
    return body


@override_settings(MAX_REQUEST_BODY_BYTES=64 * 1024, DATA_UPLOAD_MAX_MEMORY_SIZE=64 * 1024)
def test_an_import_over_the_api_body_limit_goes_in_under_its_own_limit():
    admin = make_key(scopes=["read", "write", "admin"])
    body = _over_the_body_limit(admin)
    with override_settings(MAX_IMPORT_BYTES=len(body) - 1):
        response = _import(admin, body)
    assert response.status_code == 413
    assert "AGENTMEMORY_MAX_IMPORT_BYTES" in response.json()["detail"]
    assert _nothing_stored()

    with override_settings(MAX_IMPORT_BYTES=len(body)):
        response = _import(admin, body)
    assert response.status_code == 200, response.content[:300]
    assert response.json()["created"]["messages"] == 120
    assert _export(admin) == body


@pytest.mark.django_db(transaction=True)
@override_settings(MAX_REQUEST_BODY_BYTES=64 * 1024, DATA_UPLOAD_MAX_MEMORY_SIZE=64 * 1024)
def test_an_import_streamed_without_a_length_under_asgi_is_counted_against_its_limit(
    asgi_live_server,
):
    """Chunked transfer encoding (no Content-Length) through uvicorn: the import counts what it
    reads, so a body past AGENTMEMORY_MAX_IMPORT_BYTES is a 413 that wrote nothing, and one over
    the API's body limit but within the import's goes in."""
    admin = make_key(scopes=["read", "write", "admin"])
    body = _over_the_body_limit(admin)

    def post():
        def chunks():
            for at in range(0, len(body), 4096):
                yield body[at : at + 4096]

        return httpx.post(
            asgi_live_server.url + "/api/v1/import",
            content=chunks(),
            headers={"Authorization": f"Bearer {admin.secret}"},
            timeout=60,
        )

    with override_settings(MAX_IMPORT_BYTES=len(body) - 1):
        response = post()
    assert response.status_code == 413, response.content[:300]
    assert _nothing_stored()
    response = post()
    assert response.status_code == 200, response.content[:300]
    assert _export(admin) == body


def _memory_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text())[1])


@pytest.mark.slow
def test_a_100000_message_export_round_trips_through_the_api_byte_identical(capsys):
    """GET /export -> POST /import of a backup three times the API's default body limit. The
    import's peak memory (the process's resident peak, reset just before the request) grows by
    less than the body's size: it is read line by line, never whole."""
    from django.conf import settings

    admin = make_key(scopes=["read", "write", "admin"])
    _fill(100_000, text_size=60)
    body = _export(admin)
    assert len(body) > 3 * settings.MAX_REQUEST_BODY_BYTES
    _wipe()

    # The request (and its 50 MB payload) is built before the peak is reset.
    request = RequestFactory().generic(
        "POST",
        "/api/v1/import",
        body,
        content_type="application/x-ndjson",
        **admin._headers(),
    )
    handler = ClientHandler(enforce_csrf_checks=False)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the resident peak, to now
    before = _memory_kib("VmRSS")
    response = handler(request.environ)
    growth = (_memory_kib("VmHWM") - before) * 1024
    assert response.status_code == 200, response.content[:300]
    assert json.loads(response.content)["created"]["messages"] == 100_000
    with capsys.disabled():
        print(f"\nimport of {len(body) / 1e6:.1f} MB: resident peak grew {growth / 1e6:.1f} MB")
    assert growth < len(body), (growth, len(body))
    assert _export(admin) == body
