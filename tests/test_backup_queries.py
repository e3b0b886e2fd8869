"""Restore reads what a chunk of lines names together: a chunk's messages, vectors, memories and
sources in a few statements, each naming its context; a run a file names but does not hold is
asked for once; a run's counters are written in one update per context."""

import json
import random
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory_app import memories
from memory_app.audit import Actor
from memory_app.backup.export import contexts_matching, export_lines
from memory_app.backup.format import CHUNK
from memory_app.backup.restore import import_lines
from memory_app.models import (
    Context,
    Embedding,
    MemoryEmbedding,
    MemoryRecord,
    Message,
    Run,
    Step,
)
from memory_app.queries.logbook import run_cost, runs_costs
from memory_app.services import runs as runs_service
from memory_app.services.contexts import context_get_or_create
from memory_app.services.memories import memories_record
from memory_app.services.messages import messages_append
from memory_app.services.runs import run_create, runs_recount, steps_append
from tests.builders import register_models, signed_backup, without_their_context

pytestmark = pytest.mark.django_db

KEYS = {"user": "ada", "chat": "queries"}


def _wipe():
    MemoryRecord.objects.all().delete()
    Context.objects.all().delete()


def _reads_of(queries, table: str) -> list[str]:
    return [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and re.search(rf'\bFROM "{table}"', q["sql"])
    ]


def _context_with_sources(n: int):
    """A context of one run with `n` steps and `n` messages (message i of step i), a vector on
    each message, and `n` memories of the context, memory i sourced from message i and step i,
    each with a vector."""
    ctx, _ = context_get_or_create(keys=KEYS)
    run, _ = run_create(context=ctx, client_id="run-1", task="t")
    steps = steps_append(run=run, items=[{"kind": "action"} for _ in range(n)]).steps
    messages_append(
        context=ctx,
        items=[
            {"role": "assistant", "text": f"said {i}", "run_id": run.pk, "step_id": s.pk}
            for i, s in enumerate(steps)
        ],
    )
    register_models(m3=3)
    msgs = list(Message.objects.filter(context=ctx).order_by("seq"))
    Embedding.objects.bulk_create(
        Embedding(message=m, context=ctx, model="m3", dimensions=3, vector=[0.1, 0.2, i / n])
        for i, m in enumerate(msgs)
    )
    memories_record(
        scope=memories.Scope(context=ctx),
        items=[
            {"content": f"fact {i}", "source_message_id": m.pk, "source_step_id": m.step_id}
            for i, m in enumerate(msgs)
        ],
        actor=Actor.system("user:ada"),
    )
    MemoryEmbedding.objects.bulk_create(
        MemoryEmbedding(memory_record=r, model="m3", dimensions=3, vector=[0.3, 0.2, 0.1])
        for r in MemoryRecord.objects.filter(context=ctx)
    )
    return ctx


def _imported_with_sources(n: int):
    """`_context_with_sources` exported with its vectors and imported into an empty store:
    the import's statements, and the context imported."""
    ctx = _context_with_sources(n)
    lines = list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk]), embeddings=True))
    _wipe()
    # Each kind of read below is once per chunk of each line kind: all of them in one chunk.
    assert n < CHUNK
    with CaptureQueriesContext(connection) as queries:
        result = import_lines(lines)
    assert result.created["embeddings"] == 2 * n and result.created["memories"] == n
    assert without_their_context([q["sql"] for q in queries.captured_queries]) == []
    return queries, Context.objects.get(keys_digest=ctx.keys_digest)


def test_a_chunk_of_embedding_lines_is_resolved_in_a_few_reads():
    """Forty messages and forty memories with a vector each: the import reads the messages the
    vectors name and the vectors stored once per chunk (not once per line), in the context,
    and restores every vector."""
    n = 40
    queries, ctx = _imported_with_sources(n)
    for table in (
        "memory_app_embedding",
        "memory_app_embeddingwaiting",
        "memory_app_memoryembedding",
        "memory_app_memoryembeddingwaiting",
    ):
        assert len(_reads_of(queries, table)) == 1, table
    vectors = {
        e.message.seq: [round(float(x), 6) for x in e.vector]
        for e in Embedding.objects.filter(context=ctx).select_related("message")
    }
    assert vectors == {i + 1: [0.1, 0.2, round(i / n, 6)] for i in range(n)}
    assert MemoryEmbedding.objects.filter(memory_record__context=ctx).count() == n


def test_a_chunk_of_memory_lines_reads_its_records_and_sources_together():
    """Forty memories, each naming a message and a step as its sources: the import reads the
    stored records of their keys and their sources once per chunk (not once per line), each
    source in its context, and each memory keeps its sources."""
    n = 40
    queries, ctx = _imported_with_sources(n)
    by_key = [
        s
        for s in _reads_of(queries, "memory_app_memoryrecord")
        if re.search(r'WHERE .*"memory_app_memoryrecord"\."content_hash"', s)
    ]
    assert len(by_key) == 1, by_key
    # Messages by seq: the message lines' check of those stored, the vectors' messages and the
    # memories' sources; steps by position: the messages' steps and the memories' sources.
    by_seq = [s for s in _reads_of(queries, "memory_app_message") if '"seq" IN' in s]
    assert len(by_seq) == 3, by_seq
    by_position = [s for s in _reads_of(queries, "memory_app_step") if '"position" IN' in s]
    assert len(by_position) == 2, by_position
    for record in MemoryRecord.objects.filter(context=ctx):
        i = int(record.content.split()[1])
        message = Message.objects.get(context=ctx, pk=record.source_message_id)
        step = Step.objects.get(context=ctx, pk=record.source_step_id)
        assert (message.seq, step.position, record.source_run_id) == (i + 1, i + 1, step.run_id)


def _without_runs(lines: list[str]) -> list[str]:
    """The file's lines, its run and step lines left out and its trailer made again."""
    kept = [line for line in lines[:-1] if json.loads(line)["type"] not in ("run", "step")]
    return signed_backup(kept).splitlines(keepends=True)


def test_messages_naming_a_run_the_file_does_not_hold_ask_for_it_once():
    """A file whose many messages name a run it does not hold (its run lines left out): the
    run is looked for once, not once per message, and the messages come in without a run."""
    ctx, _ = context_get_or_create(keys=KEYS)
    run, _ = run_create(context=ctx, client_id="gone", task="t")
    messages_append(
        context=ctx,
        items=[{"role": "user", "text": f"m {i}", "run_id": run.pk} for i in range(60)],
    )
    lines = _without_runs(list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk]))))
    _wipe()
    with CaptureQueriesContext(connection) as queries:
        result = import_lines(lines)
    assert result.created["messages"] == 60
    by_ref = [s for s in _reads_of(queries, "memory_app_run") if "client_id" in s]
    assert len(by_ref) == 1, by_ref
    assert not Message.objects.filter(run__isnull=False).exists()


def test_a_run_a_later_line_of_the_file_creates_is_found_by_the_lines_after_it():
    """A message line naming a run before the file's run line creates it finds none; the
    message, step and score lines after the run line find the run created."""
    ctx, _ = context_get_or_create(keys=KEYS)
    run, _ = run_create(context=ctx, client_id="late", task="t")
    steps_append(run=run, items=[{"kind": "action"}])
    messages_append(
        context=ctx,
        items=[{"role": "user", "text": f"m {i}", "run_id": run.pk} for i in range(4)],
    )
    lines = list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk])))
    records = [json.loads(line) for line in lines[:-1]]
    first, *later = [r for r in records if r["type"] == "message"]
    others = [r for r in records if r["type"] not in ("message", "header", "context")]
    header = [r for r in records if r["type"] in ("header", "context")]
    # The first message before the run and step lines, the others after them.
    reordered = [*header, first, *others, *later]
    text = [json.dumps(r, separators=(",", ":")) + "\n" for r in reordered]
    _wipe()
    result = import_lines(signed_backup(text).splitlines(keepends=True))
    assert result.created["runs"] == 1 and result.created["steps"] == 1
    ctx = Context.objects.get(keys_digest=ctx.keys_digest)
    created = Run.objects.get(context=ctx, client_id="late")
    runs = dict(Message.objects.filter(context=ctx).values_list("seq", "run_id"))
    assert runs == {first["seq"]: None, **{m["seq"]: created.pk for m in later}}
    assert (created.step_count, created.last_position) == (1, 1)


def test_a_contexts_runs_are_recounted_in_one_update():
    """Recounting six runs of a context writes their counters in one update naming the
    context, each run's counters those of its own steps."""
    ctx, _ = context_get_or_create(keys=KEYS)
    runs = []
    for r in range(6):
        run, _ = run_create(context=ctx, client_id=f"r{r}", task="t", metadata={"model": "m-x"})
        steps_append(
            run=run,
            items=[
                {
                    "kind": "action",
                    "model": f"m-{i % 2}",
                    "error_type": "E" if i < r else None,
                    "cost": 0.5,
                    "tool_calls": [{"call_id": f"c{i}", "name": "t"}],
                }
                for i in range(r + 1)
            ],
        )
        runs.append(run)
    Run.objects.filter(context=ctx).update(
        step_count=0, error_count=0, tool_call_count=0, model_names=[], cost=None
    )
    with CaptureQueriesContext(connection) as queries:
        runs_recount(runs=[(ctx.pk, r.pk) for r in runs])
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 1, updates
    assert without_their_context([q["sql"] for q in queries.captured_queries]) == []
    counted = {
        r.client_id: (r.step_count, r.error_count, r.tool_call_count, r.model_names, r.cost)
        for r in Run.objects.filter(context=ctx)
    }
    assert counted == {
        f"r{r}": (
            r + 1,
            r,
            r + 1,
            sorted({"m-x", "m-0", *(["m-1"] if r else [])}),
            0.5 * (r + 1),
        )
        for r in range(6)
    }


def test_an_import_writes_a_contexts_runs_counters_in_one_update_each():
    """Six runs imported into an empty store: their stamps put back, their last positions and
    their counters are three updates of the context's runs, not three for each run."""
    ctx, _ = context_get_or_create(keys=KEYS)
    for r in range(6):
        run, _ = run_create(context=ctx, client_id=f"r{r}", task="t")
        steps_append(run=run, items=[{"kind": "action"} for _ in range(r + 1)])
    lines = list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk])))
    _wipe()
    with CaptureQueriesContext(connection) as queries:
        import_lines(lines)
    updates = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "memory_app_run"')
    ]
    assert len(updates) == 3, updates
    counted = Run.objects.values_list("client_id", "step_count", "last_position")
    assert sorted(counted) == [(f"r{r}", r + 1, r + 1) for r in range(6)]


def test_a_runs_cost_counted_among_others_is_its_cost_counted_alone():
    """Floats added in another order differ in their last digits: each run's cost summed in
    one GROUP BY over many runs is, to the last digit, the run's own `run_cost` (the run page's
    figure), and the runs table keeps it."""
    ctx, _ = context_get_or_create(keys=KEYS)
    rnd = random.Random(24)
    runs = []
    for r in range(20):
        run, _ = run_create(context=ctx, client_id=f"c{r}", task="t")
        items = [
            {"kind": "action", "model": f"m-{i % 3}", "cost": rnd.uniform(0, 3)} for i in range(30)
        ]
        steps_append(run=run, items=items)
        runs.append(run)
    runs_recount(runs=[(ctx.pk, r.pk) for r in runs])
    together = runs_costs(context_id=ctx.pk, runs=runs)
    for run in Run.objects.filter(context=ctx):
        alone = run_cost(run=run)
        assert together[run.pk].total == alone.total == run.cost
        assert together[run.pk].models == alone.models


def test_a_recount_of_many_runs_writes_them_a_batch_per_update(monkeypatch):
    """One UPDATE's CASE has a branch per run, tried for each row: more runs than a batch go in
    several updates, each naming the context."""
    monkeypatch.setattr(runs_service, "RECOUNT_BATCH", 2)
    ctx, _ = context_get_or_create(keys=KEYS)
    runs = [run_create(context=ctx, client_id=f"b{r}", task="t")[0] for r in range(5)]
    for run in runs:
        steps_append(run=run, items=[{"kind": "action", "cost": 0.25}])
    with CaptureQueriesContext(connection) as queries:
        runs_recount(runs=[(ctx.pk, r.pk) for r in runs])
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 3 and without_their_context(updates) == []
    assert [r.cost for r in Run.objects.filter(context=ctx)] == [0.25] * 5
