"""Backup/restore: a 10,000-message, 100-run context restores field by field; export memory
is flat."""

import io
import json
import tracemalloc

import pytest
from django.core.management import call_command

from memory_app import errors, memories
from memory_app.backup.export import contexts_matching, export_lines
from memory_app.backup.restore import import_lines
from memory_app.models import (
    Context,
    Embedding,
    MemoryEmbedding,
    MemoryRecord,
    Message,
    MessageSearch,
    Run,
    Step,
    ToolCall,
    keys_digest,
)
from memory_app.search import fulltext
from memory_app.search.messages import search_messages
from memory_app.services.contexts import context_get_or_create
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, run_finish, steps_append
from tests.builders import register_models, signed_backup, without_their_context

pytestmark = pytest.mark.django_db


def _fill(ctx, *, messages: int, runs: int, start: int = 0):
    run_rows = []
    for r in range(runs):
        run, _ = run_create(
            context=ctx,
            client_id=f"run-{r}" if r % 2 else None,
            task=f"task {r}",
            system_prompt="sys",
            framework="smolagents",
            metadata={"r": r},
        )
        steps_append(
            run=run,
            items=[
                {
                    "kind": "task",
                    "task": f"task {r}",
                    "payload": {"task": f"task {r}", "task_images": None},
                },
                {
                    "kind": "action",
                    "step_number": 1,
                    "observations": "obs",
                    "error_type": "AgentError" if r % 3 else None,
                    "error_message": "boom" if r % 3 else None,
                    "start_time": 1.5,
                    "end_time": 2.25,
                    "input_tokens": 10,
                    "output_tokens": 3,
                    "payload": {"step_number": 1, "nested": {"b": 1, "a": [1, 2]}},
                    "tool_calls": [
                        {
                            "call_id": f"c{r}",
                            "name": "search",
                            "arguments": {"q": r},
                            "output": "x",
                            "success": True,
                        }
                    ],
                },
            ],
        )
        run_finish(run=run, status="success", final_answer={"answer": r})
        run_rows.append(run)
    step = run_rows[0].steps.get(position=2) if run_rows else None
    for i in range(start, start + messages, 1000):
        items = [
            {
                "role": "user" if n % 2 else "assistant",
                "name": "ada",
                "text": f"message number {n} about topic {n % 7}",
                "content": [{"type": "text", "text": f"message number {n}"}],
                "tags": ["t"] if n % 5 == 0 else [],
                "metadata": {"n": n},
                "client_id": f"m{n}" if n % 3 else None,
                "source_timestamp": "2026-01-01 10:00:00.000",
                "run_id": run_rows[n % len(run_rows)].pk if run_rows and n % 4 == 0 else None,
                "step_id": step.pk if step and n == 8 else None,
            }
            for n in range(i, min(i + 1000, start + messages))
        ]
        messages_append(context=ctx, items=items)
    return run_rows


def _memory(ctx, content, *, scope=None, source=None):
    scope = scope if scope is not None else {}
    where = memories.Scope(context=ctx) if scope == {} else memories.Scope(keys=scope)
    return MemoryRecord.objects.create(
        context=ctx if scope == {} else None,
        scope_keys=where.scope_keys,
        scope_digest=where.digest,
        content=content,
        content_hash=memories.content_hash(content),
        keywords=["k"],
        source_message=source,
        recorded_by="key:agent",
    )


def _fields(obj, skip=()):
    data = {}
    for f in obj._meta.concrete_fields:
        # search_seq is this database's full-text progress, not part of the context.
        if f.primary_key or f.name in skip or f.name in ("search_vector", "search_seq"):
            continue
        value = getattr(obj, f.attname)
        data[f.name] = value.tolist() if hasattr(value, "tolist") else value
    return data


def snapshot():
    """Everything, with foreign keys replaced by natural keys, so two databases can be compared."""
    run_key = {
        r.pk: (r.context.keys_digest, r.client_id, r.created_at)
        for r in Run.objects.select_related("context")
    }
    step_key = {s.pk: (run_key[s.run_id], s.position) for s in Step.objects.all()}
    msg_key = {
        m.pk: (m.context.keys_digest, m.seq)
        for m in Message.objects.select_related("context").only("context__keys_digest", "seq")
    }
    ctx_key = dict(Context.objects.values_list("pk", "keys_digest"))
    mem_key = dict((m.pk, (m.scope_digest, m.content_hash)) for m in MemoryRecord.objects.all())
    return {
        "contexts": sorted(
            (_fields(c) for c in Context.objects.all()), key=lambda d: d["keys_digest"]
        ),
        "runs": sorted(
            (
                {**_fields(r, ("context",)), "context": ctx_key[r.context_id]}
                for r in Run.objects.all()
            ),
            key=lambda d: (d["context"], str(d["client_id"]), d["created_at"]),
        ),
        "steps": sorted(
            (
                {
                    **_fields(s, ("run", "context")),
                    "run": run_key[s.run_id],
                    "context": ctx_key[s.context_id],
                }
                for s in Step.objects.all()
            ),
            key=lambda d: (str(d["run"]), d["position"]),
        ),
        "tool_calls": sorted(
            (
                {
                    **_fields(t, ("step", "context")),
                    "step": step_key[t.step_id],
                    "context": ctx_key[t.context_id],
                }
                for t in ToolCall.objects.all()
            ),
            key=lambda d: (str(d["step"]), d["position"]),
        ),
        "messages": sorted(
            (
                {
                    **_fields(m, ("context", "run", "step")),
                    "context": ctx_key[m.context_id],
                    "run": run_key.get(m.run_id),
                    "step": step_key.get(m.step_id),
                }
                for m in Message.objects.all()
            ),
            key=lambda d: (d["context"], d["seq"]),
        ),
        "memories": sorted(
            (
                {
                    **_fields(m, ("context", "source_message", "source_step", "source_run")),
                    "context": ctx_key.get(m.context_id),
                    "source_message": msg_key.get(m.source_message_id),
                    "source_run": run_key.get(m.source_run_id),
                }
                for m in MemoryRecord.objects.all()
            ),
            key=lambda d: d["content_hash"],
        ),
        "embeddings": sorted(
            (
                {
                    **_fields(e, ("message", "memory_record", "context")),
                    "message": msg_key.get(getattr(e, "message_id", None)),
                    "memory": mem_key.get(getattr(e, "memory_record_id", None)),
                    "context": ctx_key.get(getattr(e, "context_id", None)),
                }
                for e in [*Embedding.objects.all(), *MemoryEmbedding.objects.all()]
            ),
            key=lambda d: (str(d["message"]), str(d["memory"]), d["model"]),
        ),
    }


def _wipe():
    MemoryRecord.objects.all().delete()
    Context.objects.all().delete()


@pytest.mark.slow
def test_context_with_10000_messages_and_100_runs_restores_field_by_field(tmp_path):
    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "big"}, title="Big one")
    context_get_or_create(keys={"user": "bob"})  # not exported
    _fill(ctx, messages=10_000, runs=100)
    source_msg = Message.objects.get(context=ctx, seq=42)
    mem = _memory(ctx, "Ada prefers metric units", source=source_msg)
    _memory(None, "Every ada context: be brief", scope={"user": "ada"})
    Embedding.objects.filter(message__context=ctx).delete()
    register_models(m3=3)
    Embedding.objects.create(
        message=source_msg, context=ctx, model="m3", dimensions=3, vector=[0.1, 0.2, 0.3]
    )
    MemoryEmbedding.objects.create(
        memory_record=mem, model="m3", dimensions=3, vector=[1.0, 0.0, 0.5]
    )

    path = tmp_path / "backup.jsonl"
    call_command(
        "export_memory", "--keys", json.dumps({"chat": "big"}), "--embeddings", "-o", str(path)
    )
    Context.objects.filter(keys__user="bob").delete()
    before = snapshot()
    assert len(before["messages"]) == 10_000 and len(before["runs"]) == 100
    assert (
        len(before["steps"]),
        len(before["tool_calls"]),
        len(before["memories"]),
        len(before["embeddings"]),
    ) == (200, 100, 2, 2)

    _wipe()
    assert Message.objects.count() == 0
    out = io.StringIO()
    call_command("import_memory", str(path), stdout=out)
    after = snapshot()
    # Who recorded a restored memory is the importer: the file's word for it is not trusted.
    assert {m["recorded_by"] for m in after["memories"]} == {"manage.py import_memory"}
    assert {m["origin"] for m in after["memories"]} == {"import"}
    before["memories"] = [
        {**m, "recorded_by": "manage.py import_memory", "origin": "import"}
        for m in before["memories"]
    ]
    for kind in before:
        assert after[kind] == before[kind], kind

    # Importing the same file again changes nothing.
    call_command("import_memory", str(path), stdout=io.StringIO())
    assert snapshot() == before


def _comment_and_checkpoint_each_message(ctx, start: int):
    """A comment on each message from seq `start + 1`, and a pending write for each."""
    from memory_app.models import CheckpointWrite, Comment

    messages = Message.objects.filter(context=ctx, seq__gt=start).values_list("pk", "run_id", "seq")
    Comment.objects.bulk_create(
        Comment(context=ctx, message_id=pk, run_id=run_pk, author="key:x", text=f"on {seq}")
        for pk, run_pk, seq in messages
    )
    CheckpointWrite.objects.bulk_create(
        CheckpointWrite(
            context=ctx,
            checkpoint_id="cp",
            task_id=f"t{seq}",
            idx=0,
            channel="messages",
            value_type="msgpack",
            value_data=b"\x00" * 64,
            summary={"seq": seq},
        )
        for _, _, seq in messages
    )


def test_export_memory_stays_flat_as_the_context_doubles():
    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "grow"})
    _fill(ctx, messages=3000, runs=5)
    _comment_and_checkpoint_each_message(ctx, 0)

    def peak():
        tracemalloc.start()
        try:
            for _line in export_lines(contexts=contexts_matching(context_ids=[ctx.pk])):
                pass
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small = peak()
    _fill(ctx, messages=3000, runs=0, start=3000)
    _comment_and_checkpoint_each_message(ctx, 3000)
    large = peak()
    assert Message.objects.filter(context=ctx).count() == 6000
    trailer = json.loads(list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk])))[-1])
    assert trailer["counts"]["comment"] == trailer["counts"]["checkpoint_write"] == 6000
    # A buffered export would roughly double; a streamed one reads the same chunk size either way.
    assert large < small * 1.25, (small, large)


def test_import_rejects_what_is_not_a_backup():
    with pytest.raises(errors.BackupFormatError):
        import_lines(['{"type": "context"}'])
    with pytest.raises(errors.BackupFormatError):
        import_lines(["not json"])
    with pytest.raises(errors.BackupFormatError):
        import_lines(
            [
                '{"type": "header", "format": "agentmemory-backup", "version": 2}',
                '{"type": "bogus"}',
            ]
        )
    # A kind that is no string is refused by name like an unknown one (it cannot be counted).
    with pytest.raises(errors.BackupFormatError, match="unknown record type"):
        import_lines(
            [
                '{"type": "header", "format": "agentmemory-backup", "version": 2}\n',
                '{"type": []}\n',
            ]
        )


def test_importing_into_an_existing_context_moves_its_counters_on():
    """A merge (the context exists here with part of the file's history): the imported messages
    and runs count, and the next append follows the highest seq instead of colliding with it."""
    keys = {"user": "ada", "chat": "merge"}
    ctx, _ = context_get_or_create(keys=keys)
    texts = [f"message {n} about the harbour" for n in range(5)]
    messages_append(context=ctx, items=[{"role": "user", "text": t} for t in texts])
    run_create(context=ctx, client_id="run-a", task="t")
    lines = list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk])))
    _wipe()
    # The same agent wrote its first two messages here too.
    ctx, _ = context_get_or_create(keys=keys)
    messages_append(context=ctx, items=[{"role": "user", "text": t} for t in texts[:2]])

    result = import_lines(lines)
    assert (result.created["messages"], result.skipped["messages"], result.created["runs"]) == (
        3,
        2,
        1,
    )
    ctx.refresh_from_db()
    stored = Message.objects.filter(context=ctx)
    assert (ctx.last_seq, ctx.message_count, ctx.run_count) == (5, 5, 1)
    assert ctx.token_count == sum(stored.values_list("token_count", flat=True))
    [later] = messages_append(context=ctx, items=[{"role": "user", "text": "after"}]).messages
    assert later.seq == 6
    # Searchable at once (from their text), and the indexer writes their full-text vectors.
    assert len(search_messages(context=ctx, query="harbour", k=10, mode="keyword").hits) == 5
    fulltext.index_pending()
    ctx.refresh_from_db()
    assert ctx.search_seq == 6 and MessageSearch.objects.filter(context_id=ctx.pk).count() == 6


def test_a_backup_cut_short_at_a_line_boundary_is_refused_and_writes_nothing():
    """Every line of a copy cut after a line's newline is well-formed: only the trailer tells it
    from the whole file. The cut copy is refused (it used to go in as a context of 179 messages
    that looked restored); the whole file then restores all of them, and the next append follows
    the last seq restored."""
    keys = {"user": "ada", "chat": "resumed"}
    ctx, _ = context_get_or_create(keys=keys)
    messages_append(context=ctx, items=[{"role": "user", "text": f"m{n}"} for n in range(300)])
    run_create(context=ctx, client_id="run-a", task="t")
    lines = list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk])))
    _wipe()
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds[-1] == "trailer"
    stop = [i for i, kind in enumerate(kinds) if kind == "message"][178] + 1
    with pytest.raises(errors.BackupFormatError, match="without its trailer"):
        import_lines(lines[:stop])
    assert not Context.objects.exists() and not Message.objects.exists()

    import_lines(lines)
    ctx = Context.objects.get(keys_digest=keys_digest(keys))
    assert (ctx.last_seq, ctx.message_count, ctx.run_count) == (300, 300, 1)
    assert ctx.token_count == sum(
        Message.objects.filter(context=ctx).values_list("token_count", flat=True)
    )
    [later] = messages_append(context=ctx, items=[{"role": "user", "text": "after"}]).messages
    assert later.seq == 301


def test_an_import_that_fails_half_way_writes_nothing():
    """A bad line after good ones: the error names it, and the context, run and messages the
    lines before it made are not left behind (a partial restore would look complete)."""
    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "half"})
    _fill(ctx, messages=30, runs=2)
    lines = list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk])))
    _wipe()
    # The last message line (the trailer follows it).
    assert json.loads(lines[-2])["type"] == "message"
    bad = json.loads(lines[-2])
    bad["seq"] = "seven"
    with pytest.raises(errors.BackupFormatError, match="seq"):
        import_lines([*lines[:-2], json.dumps(bad) + "\n", lines[-1]])
    assert (
        not Context.objects.exists() and not Message.objects.exists() and not Run.objects.exists()
    )
    import_lines(lines)  # the good file goes in whole
    assert Message.objects.count() == 30 and Run.objects.count() == 2


# --- POST /api/v1/import: a line that cannot be read is a 422 naming it ---------------------------

DEEP = 10_000


def _api_backup_with(*, text: str = '"m1"', metadata: str = "{}"):
    """An admin key, and a backup of one context with three messages whose second message's
    text and metadata are written as the raw JSON `text` and `metadata`; the store is then wiped,
    so an import would create everything. Also the number of that message's line."""
    from tests.api_helpers import make_key

    admin = make_key(scopes=["read", "write", "admin"])
    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "fuzzed-import"})
    messages_append(context=ctx, items=[{"role": "user", "text": f"m{n}"} for n in range(3)])
    *lines, _trailer = export_lines(contexts=contexts_matching(context_ids=[ctx.pk]))
    _wipe()
    [n] = [i for i, line in enumerate(lines) if json.loads(line).get("text") == "m1"]
    assert '"text":"m1"' in lines[n] and '"metadata":{}' in lines[n]
    lines[n] = (
        lines[n]
        .replace('"text":"m1"', f'"text":{text}')
        .replace('"metadata":{}', f'"metadata":{metadata}')
    )
    # Signed again: the line is what is tested, not the trailer.
    return admin, signed_backup(lines), n + 1


def _api_import(admin, body: str):
    return admin.client.generic(
        "POST", "/api/v1/import", body, content_type="application/x-ndjson", **admin._headers()
    )


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        ({"text": '"\\ud800"'}, "surrogate"),
        ({"text": '"tea \\udfff and \\ud83d\\ude00"'}, "surrogate"),
        ({"metadata": '{"\\udc00": 1}'}, "surrogate"),
        ({"metadata": '{"a": ' * DEEP + "1" + "}" * DEEP}, "nested"),
        ({"metadata": '{"a": ' + "[" * DEEP + "]" * DEEP + "}"}, "nested"),
        # Readable (orjson reads 1,024 levels), but the encoders the import writes with recurse.
        ({"metadata": '{"a": ' * 1000 + "1" + "}" * 1000}, "nested"),
        ({"text": '"NUL \\u0000"'}, "NUL"),
    ],
    ids=[
        "lone-high-surrogate",
        "lone-low-surrogate-beside-a-pair",
        "surrogate-key",
        "deep-object",
        "deep-array",
        "1000-deep",
        "nul",
    ],
)
def test_an_api_import_line_that_is_not_storable_json_is_a_422_naming_it_and_writes_nothing(
    raw, complaint
):
    admin, body, number = _api_backup_with(**raw)
    response = _api_import(admin, body)
    assert response.status_code == 422, response.content[:300]
    detail = response.json()["detail"]
    assert f"line {number}" in detail and complaint in detail
    assert not Context.objects.exists() and not Message.objects.exists()


def test_an_api_import_keeps_paired_surrogates_and_json_nested_up_to_the_limit():
    """What the 422s above refuse is narrow: an emoji written as an escaped surrogate pair is
    text, and a line nested MAX_DEPTH deep (the line's object, then its metadata) is stored."""
    from memory_app.backup.lines import MAX_DEPTH

    depth = MAX_DEPTH - 1
    nested = '{"a": ' * depth + "1" + "}" * depth
    admin, body, _ = _api_backup_with(text='"tea \\ud83c\\udf75"', metadata=nested)
    response = _api_import(admin, body)
    assert response.status_code == 200, response.content[:300]
    stored = Message.objects.get(seq=2)
    assert stored.text == "tea \U0001f375" and stored.metadata == json.loads(nested)


def test_a_whole_backup_holds_key_subset_memories_under_no_context_and_their_store_namespaces(
    tmp_path,
):
    """A LangGraph store's items (and any memory of a key subset) whose keys no context's keys
    contain: a whole export, by the command or an unconfined key, holds them; an export of given
    contexts and a confined key's export do not; a restore brings the items back with their
    time to live and lists their namespaces again."""
    from memory_app.audit import Actor
    from memory_app.models import StoreNamespace
    from memory_app.queries.store import item_get, namespaces_list
    from memory_app.services.store import item_put
    from tests.api_helpers import make_key

    actor = Actor.system("backup-test")
    bob, team = memories.Scope(keys={"user": "bob"}), memories.Scope(keys={"team": "blue"})
    item_put(scope=bob, namespace=["prefs", "ui"], key="theme", value={"b": 1, "a": 2}, actor=actor)
    item_put(scope=bob, namespace=["cache"], key="k", value={"v": 1}, actor=actor, ttl=30)
    ctx, _ = context_get_or_create(keys={"user": "ada"})
    _memory(ctx, "Ada drinks tea")
    _memory(ctx, "The blue team meets on Mondays", scope=team.keys)

    def exported(**options) -> str:
        out = tmp_path / "backup.jsonl"
        call_command("export_memory", output=str(out), **options)
        return out.read_text()

    def memory_contents(text: str) -> set[str]:
        records = [json.loads(line) for line in text.splitlines()]
        return {r["content"] for r in records if r["type"] == "memory"}

    whole = exported()
    assert memory_contents(whole) == {
        "Ada drinks tea",
        "The blue team meets on Mondays",
        '{"b": 1, "a": 2}',
        '{"v": 1}',
    }
    assert memory_contents(exported(keys='{"user": "bob"}')) == {'{"b": 1, "a": 2}', '{"v": 1}'}
    assert memory_contents(exported(context_ids=[ctx.pk])) == {"Ada drinks tea"}
    admin = make_key(scopes=["read", "admin"])
    confined = make_key(scopes=["read", "admin"], context_keys={"user": "ada"})
    streamed = lambda key: b"".join(key.get("/api/v1/export").streaming_content).decode()  # noqa: E731
    assert len(memory_contents(streamed(admin))) == 4
    assert memory_contents(streamed(confined)) == {"Ada drinks tea"}

    _wipe()
    StoreNamespace.objects.all().delete()
    assert memory_contents(exported()) == set()
    result = import_lines(whole.splitlines(keepends=True), actor=actor)
    assert result.created["memories"] == 4
    theme = item_get(scope=bob, namespace=["prefs", "ui"], key="theme")
    assert theme.content == '{"b": 1, "a": 2}'
    assert item_get(scope=bob, namespace=["cache"], key="k").item_ttl == 30
    assert namespaces_list(scope=bob) == [["cache"], ["prefs", "ui"]]


# --- scores, labels, comments, checkpoints and memory versions -----------------------------------


def _reviewed(ctx):
    """A context with what reviewers, evaluators, a LangGraph saver and memory edits write: a
    score, label and comment on a run, a step and a message each (one score twice, as an
    evaluator run twice gives it), a checkpoint with its channel value and pending writes (bytes
    that are no UTF-8, a write summary whose keys are not in sorted order), and a memory edited
    and archived (three versions, metadata in written order)."""
    from memory_app.audit import Actor
    from memory_app.services.checkpoints import checkpoint_put, writes_put
    from memory_app.services.memories import memories_record, memory_edit, memory_set_archived
    from memory_app.services.scores import Target, comment_add, label_add, score_add

    runs = _fill(ctx, messages=12, runs=2)
    ada, bot = Actor.system("user:ada"), Actor.system("key:evalbot")
    targets = [
        Target.of(runs[0]),  # a run without a client id: named by its creation instant
        Target.of(Step.objects.get(run=runs[1], position=2)),
        Target.of(Message.objects.get(context=ctx, seq=8)),  # has a run and a step
    ]
    for n, target in enumerate(targets):
        score_add(actor=bot, target=target, name="accuracy", kind="numeric", value=0.5 + n)
        label_add(actor=ada, target=target, name=f"needs-work-{n}")
        comment_add(actor=ada, target=target, text=f"Zürich ☕ {n}")
    score_add(actor=bot, target=targets[0], name="accuracy", kind="numeric", value=0.75)
    score_add(actor=ada, target=targets[1], name="ok", kind="boolean", value=True, client_id="s1")
    score_add(actor=ada, target=targets[2], name="tone", kind="categorical", value="warm")
    checkpoint_put(
        context=ctx,
        checkpoint_ns="",
        checkpoint_id="cp-1",
        parent_checkpoint_id=None,
        checkpoint=("msgpack", b"\x00\xffcheckpoint"),
        channel_versions={"messages": "v1", "agent": "v2"},
        metadata={"source": "input", "step": -1},
        metadata_typed=("json", b'{"source":"input","step":-1}'),
        blobs=[("messages", "v1", "msgpack", b"\x93\x00\xc0"), ("agent", "v2", "empty", b"")],
        ts=1767261600.25,
        task="summarise the harbour report",
    )
    checkpoint_put(
        context=ctx,
        checkpoint_ns="tools:1",
        checkpoint_id="cp-sub",
        parent_checkpoint_id=None,
        checkpoint=("msgpack", b"\x01"),
        channel_versions={},
        metadata={"source": "loop"},
        metadata_typed=("json", b'{"source":"loop"}'),
        blobs=[],
    )
    writes_put(
        context=ctx,
        checkpoint_ns="",
        checkpoint_id="cp-1",
        task_id="task-a",
        task_path="~__pregel_pull, agent",
        writes=[
            (0, "messages", "msgpack", b"\xde\xad", {"zeta": 1, "alpha": [2, {"y": 1, "b": 0}]})
        ],
    )
    [recorded] = memories_record(
        scope=memories.Scope(context=ctx),
        items=[{"content": "Ada likes tea", "metadata": {"zeta": 1, "alpha": 2}}],
        actor=ada,
    )
    mem = memory_edit(
        record=recorded.record, actor=ada, content="Ada likes green tea", metadata={"y": 1, "b": 2}
    )
    memory_set_archived(record=mem, archived=True, actor=bot)


def _reviewed_snapshot():
    """Scores, labels, comments, checkpoints and memory versions by natural key (author and
    actor aside: an import's are the importer), JSON as text so key order counts."""
    from memory_app.models import (
        Checkpoint,
        CheckpointBlob,
        CheckpointWrite,
        Comment,
        Label,
        MemoryVersion,
        Score,
    )

    run_key = {r.pk: (r.client_id, r.created_at) for r in Run.objects.all()}
    step_key = {s.pk: (run_key[s.run_id], s.position) for s in Step.objects.all()}
    msg_key = dict(Message.objects.values_list("pk", "seq"))
    ctx_key = dict(Context.objects.values_list("pk", "keys_digest"))
    mem_key = {m.pk: (m.scope_digest, m.content_hash) for m in MemoryRecord.objects.all()}

    def rows(model, skip=()):
        out = []
        for row in model.objects.all():
            data = _fields(row, ("context", "run", "step", "message", "memory", *skip))
            data["context"] = ctx_key.get(getattr(row, "context_id", None))
            data["run"] = run_key.get(getattr(row, "run_id", None))
            data["step"] = step_key.get(getattr(row, "step_id", None))
            data["message"] = msg_key.get(getattr(row, "message_id", None))
            data["memory"] = mem_key.get(getattr(row, "memory_id", None))
            for name, value in data.items():
                if isinstance(value, memoryview | bytes):
                    data[name] = bytes(value)
                elif isinstance(value, dict | list):
                    data[name] = json.dumps(value)
            out.append(data)
        return sorted(out, key=repr)

    return {
        "scores": rows(Score, ("author",)),
        "labels": rows(Label, ("author",)),
        "comments": rows(Comment, ("author",)),
        "checkpoints": rows(Checkpoint, ("run_id",)),
        "blobs": rows(CheckpointBlob),
        "writes": rows(CheckpointWrite),
        "versions": rows(MemoryVersion, ("actor", "user", "api_key", "audit_event")),
    }


def test_scores_labels_comments_checkpoints_and_memory_versions_round_trip_and_again():
    from memory_app.models import CheckpointWrite, Label, MemoryVersion, Score

    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "reviewed"})
    _reviewed(ctx)
    lines = list(
        export_lines(contexts=contexts_matching(context_ids=[ctx.pk]), memory_versions=True)
    )
    kinds = [json.loads(line)["type"] for line in lines]
    assert json.loads(lines[-1])["counts"] == {
        "context": 1,
        "run": 3,  # two of _fill, one the input checkpoint opened
        "step": 4,
        "message": 12,
        "score": 6,
        "label": 3,
        "comment": 3,
        "checkpoint": 2,
        "checkpoint_blob": 2,
        "checkpoint_write": 1,
        "memory": 1,
        "memory_version": 3,
        "embedding": 0,
    }
    # Referents first: the memory's versions follow it, annotations follow the messages.
    assert kinds.index("score") > max(i for i, k in enumerate(kinds) if k == "message")
    assert kinds.index("memory_version") > kinds.index("memory")
    before = _reviewed_snapshot()
    _wipe()
    assert not Score.objects.exists() and not MemoryVersion.objects.exists()

    result = import_lines(lines)
    after = _reviewed_snapshot()
    # The memory's three versions come back, then the import's own: version 4, "import".
    imported = after["versions"].pop()
    assert (imported["version"], imported["action"]) == (4, "import")
    assert imported["content"] == "Ada likes green tea"
    for kind in before:
        assert after[kind] == before[kind], kind
    write = CheckpointWrite.objects.get()
    assert list(write.summary) == ["zeta", "alpha"] and bytes(write.value_data) == b"\xde\xad"
    assert list(MemoryVersion.objects.get(version=1).metadata) == ["zeta", "alpha"]
    # Who wrote them is the importer, never the file's word.
    assert {s.author for s in Score.objects.all()} | {
        label.author for label in Label.objects.all()
    } == {"import"}
    assert set(MemoryVersion.objects.values_list("actor", flat=True)) == {"import"}
    assert (result.created["scores"], result.created["memory_versions"]) == (6, 3)

    # Importing the same file again changes nothing.
    again = import_lines(lines)
    assert _reviewed_snapshot() == {**after, "versions": [*after["versions"], imported]}
    assert again.created["scores"] == again.created["checkpoints"] == 0
    assert again.skipped["scores"] == 6 and again.skipped["memory_versions"] == 3


def _lines_without_trailer():
    """An export of a reviewed context (see `_reviewed`), without its trailer; the store is then
    wiped."""
    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "reviewed"})
    _reviewed(ctx)
    *lines, _trailer = export_lines(
        contexts=contexts_matching(context_ids=[ctx.pk]), memory_versions=True
    )
    _wipe()
    return lines


def _nothing_of_it_stored():
    from memory_app.models import Checkpoint, CheckpointWrite, MemoryVersion, Score

    return (
        not any(
            model.objects.exists()
            for model in (Context, Run, Message, MemoryRecord, Score, Checkpoint, CheckpointWrite)
        )
        and not MemoryVersion.objects.exists()
    )


DROP = object()  # a change that takes the field out of the line


@pytest.mark.parametrize(
    ("kind", "change", "complaint"),
    [
        ("score", {"kind": "numeric", "number": None, "category": "warm"}, "not of its kind"),
        ("score", {"run": {"client_id": "r9", "created_at": "2026-01-01T00:00:00"}}, "one target"),
        ("label", {"message": 999}, "refers to a message that is not in the backup"),
        ("comment", {"text": 7}, "comment text must be a string"),
        ("checkpoint", {"checkpoint_data": "not base64!"}, "base64"),
        (
            "checkpoint",
            {"run": {"client_id": "nobody", "created_at": "2026-01-01T00:00:00+00:00"}},
            "refers to a run that is not in the backup",
        ),
        ("checkpoint_write", {"idx": "0"}, "idx must be an integer"),
        ("memory_version", {"content_hash": "0" * 64}, "memory that is not in the backup"),
        ("memory_version", {"version": 0}, "starts at 1"),
        # The write path's rules for names, comments and categories.
        ("score", {"name": "  "}, "a score line: a name is a non-empty text"),
        ("score", {"comment": "x" * 10_001}, "a comment is at most 10000 characters"),
        ("score", {"category": " "}, "a categorical score's value is a non-empty text"),
        ("label", {"name": ""}, "a label line: a label is a non-empty text"),
        ("comment", {"text": " \n "}, "a comment line: a comment is a non-empty text"),
        ("comment", {"text": "x" * 10_001}, "a comment line: a comment is at most 10000"),
        # Without its instant, a score's or comment's natural key would match nothing stored.
        ("score", {"created_at": DROP}, "a score record needs created_at"),
        ("comment", {"created_at": DROP}, "a comment record needs created_at"),
        # Integers past their column's range.
        ("memory_version", {"version": 2**31}, "version must be between 0 and 2147483647"),
        ("checkpoint_write", {"idx": -(2**31) - 1}, "idx must be between -2147483648 and"),
    ],
    ids=[
        "score-value-not-of-its-kind",
        "score-with-two-targets",
        "label-on-an-unknown-message",
        "comment-not-text",
        "checkpoint-bytes-not-base64",
        "checkpoint-of-an-unknown-run",
        "write-index-not-a-number",
        "version-of-an-unknown-memory",
        "version-0",
        "score-name-blank",
        "score-comment-too-long",
        "category-blank",
        "label-name-empty",
        "comment-blank",
        "comment-too-long",
        "score-without-created-at",
        "comment-without-created-at",
        "version-past-its-column",
        "write-index-past-its-column",
    ],
)
def test_a_bad_line_of_a_new_kind_writes_nothing(kind, change, complaint):
    """The last line of each kind spoilt: the lines before it (the context, its runs, messages
    and the rows of the new kinds already read) are not left behind."""
    lines = _lines_without_trailer()
    at = max(i for i, line in enumerate(lines) if json.loads(line)["type"] == kind)
    bad = {k: v for k, v in {**json.loads(lines[at]), **change}.items() if v is not DROP}
    spoilt = signed_backup([*lines[:at], json.dumps(bad) + "\n", *lines[at + 1 :]])
    with pytest.raises(errors.BackupFormatError, match=complaint):
        import_lines(spoilt.splitlines(keepends=True))
    assert _nothing_of_it_stored()
    import_lines(signed_backup(lines).splitlines(keepends=True))  # the good file goes in whole
    assert Context.objects.count() == 1


def test_a_version_2_file_still_goes_in_and_holds_only_its_six_kinds():
    """Files exported before scores, checkpoints and versions were carried: their trailer counts
    the six kinds of version 2, and a line of a later kind is unknown to that version."""
    from tests.builders import BACKUP_KINDS_V2

    lines = _lines_without_trailer()
    header = json.dumps({**json.loads(lines[0]), "version": 2}) + "\n"
    old = [header, *(line for line in lines[1:] if json.loads(line)["type"] in BACKUP_KINDS_V2)]
    result = import_lines(signed_backup(old).splitlines(keepends=True))
    assert result.created["messages"] == 12 and result.created["memories"] == 1
    # With no versions in the file, the import's own is the memory's first, as before.
    from memory_app.models import MemoryVersion

    assert list(MemoryVersion.objects.values_list("version", "action")) == [(1, "import")]

    _wipe()
    score = next(line for line in lines if json.loads(line)["type"] == "score")
    with pytest.raises(errors.BackupFormatError, match="unknown record type 'score'"):
        import_lines(signed_backup([*old, score]).splitlines(keepends=True))
    assert _nothing_of_it_stored()


def test_a_score_keeps_its_client_id_unless_the_importer_holds_it_and_a_stored_memory_its_history():
    """Two evaluators used the same client id in one context: imported, both scores are the
    importer's, and the table keeps one client id per author and context, so the second is
    stored without it. A memory already stored here keeps its own versions: the file's are not
    grafted onto it."""
    from memory_app.audit import Actor
    from memory_app.models import MemoryVersion, Score
    from memory_app.services.memories import memories_record, memory_edit
    from memory_app.services.scores import Target, score_add

    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "twice"})
    run, _ = run_create(context=ctx, client_id="run-a", task="t")
    for name in ("eval-a", "eval-b"):
        score_add(
            actor=Actor.system(name),
            target=Target.of(run),
            name=name,
            kind="numeric",
            value=1,
            client_id="run-a:accuracy",
        )
    scope = memories.Scope(context=ctx)
    [kept] = memories_record(
        scope=scope, items=[{"content": "Ada likes tea"}], actor=Actor.system()
    )
    memory_edit(record=kept.record, actor=Actor.system(), note="reworded", keywords=["tea"])
    lines = list(
        export_lines(contexts=contexts_matching(context_ids=[ctx.pk]), memory_versions=True)
    )
    _wipe()
    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "twice"})
    [here] = memories_record(
        scope=memories.Scope(context=ctx),
        items=[{"content": "Ada likes tea"}],
        actor=Actor.system(),
    )

    result = import_lines(lines)
    assert dict(Score.objects.values_list("name", "client_id")) == {
        "eval-a": "run-a:accuracy",
        "eval-b": None,
    }
    assert (result.created["memory_versions"], result.skipped["memory_versions"]) == (0, 2)
    assert list(
        MemoryVersion.objects.filter(memory=here.record).values_list("version", "action")
    ) == [(1, "record")]


def test_a_read_keys_export_holds_no_memory_history_and_no_export_names_who_changed_it(tmp_path):
    """A memory's versions hold what an operator edited out of it: a read key's export has no
    version line, an admin key's and the operator's have them, and none says who made a
    change (an import replaces it with the importer anyway)."""
    from tests.api_helpers import make_key

    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "reviewed"})
    _reviewed(ctx)  # its memory's first content, "Ada likes tea", lives on in version 1 only
    reader, admin = make_key(scopes=["read"]), make_key(scopes=["read", "write", "admin"])

    def kinds_and_text(body: str):
        return [json.loads(line)["type"] for line in body.splitlines()], body

    read_kinds, read_body = kinds_and_text(
        b"".join(reader.get("/api/v1/export").streaming_content).decode()
    )
    assert "memory" in read_kinds and "memory_version" not in read_kinds
    assert '"Ada likes tea"' not in read_body and '"actor"' not in read_body
    assert json.loads(read_body.splitlines()[-1])["counts"]["memory_version"] == 0

    admin_kinds, admin_body = kinds_and_text(
        b"".join(admin.get("/api/v1/export").streaming_content).decode()
    )
    out = tmp_path / "backup.jsonl"
    call_command("export_memory", "-o", str(out))
    operator_kinds, operator_body = kinds_and_text(out.read_text(encoding="utf-8"))
    for kinds, body in ((admin_kinds, admin_body), (operator_kinds, operator_body)):
        assert kinds.count("memory_version") == 3
        assert '"Ada likes tea"' in body and '"actor"' not in body


def test_an_import_finds_a_chunks_step_targets_in_one_query():
    """Scores on five steps of a run: the import reads their steps together, not one by one."""
    import re

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from memory_app.audit import Actor
    from memory_app.models import Score
    from memory_app.services.scores import Target, score_add

    ctx, _ = context_get_or_create(keys={"user": "ada", "chat": "steps"})
    run, _ = run_create(context=ctx, client_id="r", task="t")
    steps = steps_append(run=run, items=[{"kind": "action"} for _ in range(5)]).steps
    for step in steps:
        score_add(
            actor=Actor.system("eval"),
            target=Target.of(step),
            name="ok",
            kind="boolean",
            value=True,
        )
    lines = list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk])))
    _wipe()
    with CaptureQueriesContext(connection) as queries:
        import_lines(lines)
    by_position = [
        q["sql"]
        for q in queries.captured_queries
        if re.search(r'FROM "memory_app_step" WHERE .*"memory_app_step"\."position"', q["sql"])
    ]
    assert len(by_position) == 1, by_position
    assert sorted(Score.objects.values_list("step__position", flat=True)) == [1, 2, 3, 4, 5]


# --- every statement on a context's rows names its context ----------------------------------


def _merge_scenario():
    """A reviewed context (see `_reviewed`) with a vector and a memory whose sources are a step
    and a message, its export; then the store wiped and the context begun again here: its run
    `run-1` with that run's first step, and its first two messages. Answers the file's lines
    and each run's counters, by client id (or creation instant), before the export."""
    from memory_app.audit import Actor
    from memory_app.services.memories import memories_record

    keys = {"user": "ada", "chat": "reviewed"}
    ctx, _ = context_get_or_create(keys=keys)
    _reviewed(ctx)
    message = Message.objects.get(context=ctx, step__isnull=False)  # seq 9, of run 0's step 2
    assert (message.seq, message.run_id) == (9, message.step.run_id)
    memories_record(
        scope=memories.Scope(context=ctx),
        items=[
            {
                "content": "Ada reads the harbour report",
                "source_message_id": message.pk,
                "source_step_id": message.step_id,
            }
        ],
        actor=Actor.system("user:ada"),
    )
    register_models(m3=3)
    Embedding.objects.create(
        message=message, context=ctx, model="m3", dimensions=3, vector=[0.1, 0.2, 0.3]
    )
    counters = {
        r.client_id or r.created_at: (r.step_count, r.error_count, r.last_position)
        for r in Run.objects.filter(context=ctx)
    }
    lines = list(
        export_lines(
            contexts=contexts_matching(context_ids=[ctx.pk]), embeddings=True, memory_versions=True
        )
    )
    first_step = Step.objects.get(context=ctx, run__client_id="run-1", position=1)
    texts = list(Message.objects.filter(context=ctx, seq__lte=2).values_list("text", flat=True))
    _wipe()
    ctx, _ = context_get_or_create(keys=keys)
    run, _ = run_create(context=ctx, client_id="run-1", task="task 1")
    steps_append(run=run, items=[{"kind": first_step.kind, "task": first_step.task}])
    messages_append(context=ctx, items=[{"role": "user", "text": t} for t in texts])
    return ctx, lines, counters


def test_an_import_reads_and_writes_a_contexts_rows_only_in_that_context():
    """Every statement of a merge import on runs, steps, tool calls, messages, annotations,
    checkpoints and vectors names their context (on Citus each goes to its shard alone): the
    lookups of the steps that messages and memories name, of the messages that vectors and
    memories name, and the recount of the runs it grew."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _ctx, lines, _counters = _merge_scenario()
    with CaptureQueriesContext(connection) as queries:
        result = import_lines(lines)
    assert result.created["steps"] == 3 and result.skipped["steps"] == 1
    statements = [q["sql"] for q in queries.captured_queries]
    touched = " ".join(statements)
    # The vectors' reads of their messages and of the vectors stored are among them too.
    tables = (
        "memory_app_run",
        "memory_app_step",
        "memory_app_embedding",
        "memory_app_embeddingwaiting",
    )
    assert all(f'"{t}"' in touched for t in tables)
    assert without_their_context(statements) == []


def test_an_export_reads_a_contexts_rows_only_in_that_context():
    """The steps' tool calls, and the message and step a memory names as its sources, are read
    in the exported context, as everything else of it is."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ctx, lines, _counters = _merge_scenario()
    import_lines(lines)
    with CaptureQueriesContext(connection) as queries:
        again = list(
            export_lines(
                contexts=contexts_matching(context_ids=[ctx.pk]),
                embeddings=True,
                memory_versions=True,
            )
        )
    assert without_their_context([q["sql"] for q in queries.captured_queries]) == []
    [memory] = [
        json.loads(line) for line in again if '"type":"memory"' in line and "harbour report" in line
    ]
    assert memory["source_message"] == {"context": ctx.keys_digest, "seq": 9}
    run = Message.objects.get(context=ctx, seq=9).step.run
    ref = {"client_id": run.client_id, "created_at": run.created_at.isoformat()}
    assert memory["source_step"] == {"run": ref, "position": 2}


def test_a_merge_import_counts_each_runs_steps_errors_and_last_position_from_its_rows():
    """A run stored here with its first step takes the file's later steps: its counters are
    counted from the steps it holds then, as are those of the runs the import created."""
    ctx, lines, counters = _merge_scenario()
    import_lines(lines)
    runs = {
        r.client_id or r.created_at: (r.step_count, r.error_count, r.last_position)
        for r in Run.objects.filter(context=ctx)
        if r.client_id != "run-1"
    }
    merged = Run.objects.get(context=ctx, client_id="run-1")
    assert (merged.step_count, merged.error_count, merged.last_position) == counters["run-1"]
    assert counters["run-1"] == (2, 1, 2)
    assert merged.tool_call_count == ToolCall.objects.filter(step__run=merged).count() == 1
    assert runs == {k: v for k, v in counters.items() if k != "run-1"}


def test_an_export_names_a_key_subset_memorys_source_in_another_context():
    """A key-subset memory exported with one context may name a message of another: it is read
    by its id and named by that context's digest and its seq."""
    from memory_app.audit import Actor
    from memory_app.services.memories import memories_record

    there, _ = context_get_or_create(keys={"user": "ada", "chat": "there"})
    here, _ = context_get_or_create(keys={"user": "ada", "chat": "here"})
    [message] = messages_append(context=there, items=[{"role": "user", "text": "tea"}]).messages
    memories_record(
        scope=memories.Scope(keys={"user": "ada"}),
        items=[{"content": "Ada likes tea", "source_message_id": message.pk}],
        actor=Actor.system("user:ada"),
    )
    lines = [
        json.loads(line) for line in export_lines(contexts=contexts_matching(context_ids=[here.pk]))
    ]
    [memory] = [r for r in lines if r["type"] == "memory"]
    assert memory["source_message"] == {"context": there.keys_digest, "seq": 1}


@pytest.mark.django_db
def test_a_memory_made_from_a_run_begun_during_the_export_is_still_exported():
    """The export reads as it goes (no snapshot): a run, its step and a memory made from the
    step while it streams the messages reach the memories with the run not written. The memory
    is exported with its source read as one outside the context; the stream runs to its end."""
    from memory_app.audit import Actor
    from memory_app.backup.export import export_records
    from memory_app.services.memories import memories_record

    ctx, _ = context_get_or_create(keys={"user": "race"})
    messages_append(context=ctx, items=[{"role": "user", "text": "hi"}])
    records = []
    for record in export_records(contexts=contexts_matching(context_ids=[ctx.pk])):
        records.append(record)
        if record["type"] == "message":  # an agent writes meanwhile
            run, _ = run_create(context=ctx, client_id="late", task="t")
            [step] = steps_append(run=run, items=[{"kind": "action", "observations": "o"}]).steps
            memories_record(
                scope=memories.Scope(context=ctx),
                items=[{"content": "late memory", "source_step_id": step.pk}],
                actor=Actor.system("test"),
            )
    assert [r["type"] for r in records] == ["header", "context", "message", "memory"]
    assert records[-1]["content"] == "late memory"
    assert records[-1]["source_step"]["run"]["client_id"] == "late"
    assert records[-1]["source_step"]["position"] == 1


@pytest.mark.django_db
def test_a_message_written_with_its_run_and_step_during_the_export_keeps_them(monkeypatch):
    """A message appended with a new run and step after the export wrote the context's runs and
    read its steps (the export reads as it goes) is exported naming both."""
    from memory_app.backup import export

    ctx, _ = context_get_or_create(keys={"user": "late-step"})
    messages_append(context=ctx, items=[{"role": "user", "text": "first"}])
    read_steps = export._steps_of
    late = []

    def steps_then_an_agent_writes(context_id, pks=None):
        found = read_steps(context_id, pks)
        if pks is None and not late:
            run, _ = run_create(context=ctx, client_id="late-run", task="t")
            [step] = steps_append(run=run, items=[{"kind": "action"}]).steps
            late.append(
                messages_append(
                    context=ctx,
                    items=[
                        {"role": "assistant", "text": "late", "run_id": run.pk, "step_id": step.pk}
                    ],
                ).messages[0]
            )
        return found

    monkeypatch.setattr(export, "_steps_of", steps_then_an_agent_writes)
    records = list(export.export_records(contexts=contexts_matching(context_ids=[ctx.pk])))
    [message] = [r for r in records if r["type"] == "message" and r["text"] == "late"]
    assert message["run"]["client_id"] == "late-run"
    assert message["step"]["run"]["client_id"] == "late-run"
    assert message["step"]["position"] == 1
