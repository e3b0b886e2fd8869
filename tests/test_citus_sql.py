"""Every row lock the claims, purges, imports and deletes take is one Citus can route.

On Citus a table of context rows is distributed by `context_id` (the contexts by `id`), and a
statement with FOR UPDATE / FOR NO KEY UPDATE / FOR SHARE / FOR KEY SHARE is refused unless it
goes to one shard: its table alone, filtered by the distribution column equal to one value. No
Citus runs here, so these tests hold the SQL's shape: every statement sent to PostgreSQL while
a path runs is captured (psycopg's `Cursor.execute`, under Django's cursors and the raw ones
alike), and each lock in it is checked; the trigger functions are read from the catalog and
checked the same way, and no trigger on a table of context rows is statement-level.
"""

from __future__ import annotations

import re
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from memory_app import backlog, memories
from memory_app.backup.export import export_lines
from memory_app.backup.restore import import_lines
from memory_app.db import lock_contexts
from memory_app.embeddings import indexer, providers, worker
from memory_app.models import (
    Context,
    Embedding,
    Message,
    Run,
    SpanQueue,
    Step,
    TraceSpan,
)
from memory_app.search import fulltext
from memory_app.services import curation
from memory_app.services.memories import memories_record
from memory_app.services.messages import COPY_THRESHOLD, message_edit, messages_append
from memory_app.services.runs import run_create, run_finish, steps_append
from tests.builders import make_context, without_their_context
from tests.test_embeddings import stand_in  # noqa: F401 - the provider the worker calls

# The tables docs/scale-out.md distributes by context (the contexts themselves by `id`).
DISTRIBUTED = {
    "memory_app_context",
    "memory_app_message",
    "memory_app_messagesearch",
    "memory_app_run",
    "memory_app_step",
    "memory_app_toolcall",
    "memory_app_tracespan",
    "memory_app_spanqueue",
    "memory_app_embedding",
    "memory_app_embeddingwaiting",
    "memory_app_embeddingretry",
}

LOCK = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+UPDATE|UPDATE|KEY\s+SHARE|SHARE)\b", re.I)
CLAUSE_END = re.compile(r"\b(?:ORDER\s+BY|GROUP\s+BY|LIMIT|OFFSET|RETURNING)\b|$", re.I)
ONE_VALUE = r"\s*=\s*(?:%s|\$\d+|\d+|[A-Za-z_][\w.]*)"


def _depths(text: str) -> list[int]:
    depth, out = 0, []
    for ch in text:
        if ch == ")":
            depth -= 1
        out.append(depth)
        if ch == "(":
            depth += 1
    return out


def _top_level(text: str, pattern: re.Pattern) -> list[re.Match]:
    depth = _depths(text)
    return [m for m in pattern.finditer(text) if m.start() == len(text) or depth[m.start()] == 0]


def _unwrap(text: str) -> str:
    text = text.strip()
    while text.startswith("(") and text.endswith(")") and min(_depths(text)[1:-1] or [1]) >= 1:
        text = text[1:-1].strip()
    return text


def _enclosing(sql: str, at: int) -> str:
    """The parenthesised query (or the whole statement) around position `at`, up to it."""
    depth = 0
    for i in range(at - 1, -1, -1):
        if sql[i] == ")":
            depth += 1
        elif sql[i] == "(":
            if depth == 0:
                return sql[i + 1 : at]
            depth -= 1
    return sql[:at]


def unroutable(query: str) -> str | None:
    """Why this one query (no FOR clause of its own left) would not go to one shard, or None.

    Its table must be named alone (no join, no second table) and one conjunct at the top of
    its WHERE must set the distribution column to one value."""
    head = _top_level(query, re.compile(r"\b(?:FROM|UPDATE)\b", re.I))
    where = _top_level(query, re.compile(r"\bWHERE\b", re.I))
    if not head:
        return "no table"
    if not where:
        # A table kept off the shards (the memories' vectors) is locked on the coordinator.
        table = query[head[0].end() :].split()[0].strip('"')
        return None if table not in DISTRIBUTED else "no WHERE"
    tables = re.split(r"\bSET\b", query[head[0].end() : where[0].start()], flags=re.I)[0].strip()
    if "," in tables or re.search(r"\bJOIN\b", tables, re.I):
        return f"more than one table: {tables}"
    table = tables.split()[0].strip('"')
    if table not in DISTRIBUTED:
        return None
    rest = query[where[0].end() :]
    condition = _unwrap(rest[: _top_level(rest, CLAUSE_END)[0].start()])
    depth = _depths(condition)
    conjuncts, start = [], 0
    for m in re.finditer(r"\bAND\b", condition, re.I):
        if depth[m.start()] == 0:
            conjuncts.append(condition[start : m.start()])
            start = m.end()
    conjuncts.append(condition[start:])
    column = "id" if table == "memory_app_context" else "context_id"
    one = re.compile(rf'^(?:"?\w+"?\.)?"?{column}"?{ONE_VALUE}$', re.I)
    for c in conjuncts:
        c = _unwrap(c)
        if one.match(c):
            return None
    return f"{table} not filtered by one {column}: {condition}"


def unroutable_locks(sql: str) -> list[str]:
    """Each row lock in the statement that Citus could not route to one shard, with why."""
    found = []
    for m in LOCK.finditer(sql):
        query = _enclosing(sql, m.start())
        if (why := unroutable(query)) is not None:
            found.append(f"{why}\n    in: {sql}")
    return found


@pytest.fixture
def statements(monkeypatch):
    """Every statement any psycopg cursor (Django's or a raw one) sends meanwhile."""
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def capture(self, query, params=None, **kwargs):
        sent.append(query if isinstance(query, str) else query.as_string(self))
        return execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", capture)
    return sent


def assert_routable(sent: list[str], *, at_least: int = 1) -> None:
    locks = [s for s in sent if LOCK.search(s)]
    assert len(locks) >= at_least, f"the path took {len(locks)} row locks: {sent}"
    problems = [p for s in locks for p in unroutable_locks(s)]
    assert not problems, "\n".join(problems)


def test_the_rule_refuses_the_shapes_citus_refuses():
    """What the claims and locks were: each spans contexts, and the checker says so."""
    refused = [
        "SELECT id FROM memory_app_context WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE",
        "SELECT id, search_seq, last_seq FROM memory_app_context WHERE search_seq < last_seq"
        " ORDER BY id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED",
        "UPDATE memory_app_embedding SET indexed = true WHERE id IN ( SELECT id FROM"
        " memory_app_embedding WHERE NOT indexed ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)",
        "SELECT id FROM memory_app_embeddingwaiting ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
        'SELECT "memory_app_message"."id" FROM "memory_app_message" WHERE'
        ' ("memory_app_message"."context_id" = %s OR "memory_app_message"."id" = %s) FOR UPDATE',
        'SELECT "memory_app_run"."id" FROM "memory_app_run" WHERE "memory_app_run"."id" IN'
        " (%s, %s) FOR UPDATE",
        'SELECT e.id FROM "memory_app_embedding" e LEFT OUTER JOIN "memory_app_message" m ON'
        " (e.message_id = m.id) WHERE e.context_id = %s FOR UPDATE OF e SKIP LOCKED",
        "PERFORM 1 FROM memory_app_context WHERE id IN (OLD.context_id, NEW.context_id)"
        " ORDER BY id FOR NO KEY UPDATE",
    ]
    for sql in refused:
        assert unroutable_locks(sql), sql
    allowed = [
        "SELECT id FROM memory_app_context WHERE id = %s FOR NO KEY UPDATE",
        'SELECT "memory_app_step"."id" FROM "memory_app_step" WHERE (("memory_app_step"."id"'
        ' IN (%s, %s) OR "memory_app_step"."run_id" IN (%s)) AND "memory_app_step"."context_id"'
        " = %s) FOR UPDATE",
        "PERFORM 1 FROM memory_app_context WHERE id = first_id FOR NO KEY UPDATE",
        'SELECT "memory_app_auditevent"."id" FROM "memory_app_auditevent" WHERE'
        ' "memory_app_auditevent"."id" = %s FOR UPDATE',
    ]
    for sql in allowed:
        assert not unroutable_locks(sql), sql


def _behind(context: Context, n: int = COPY_THRESHOLD) -> None:
    """A batch large enough to leave its full-text vectors to the indexer."""
    messages_append(
        context=context, items=[{"role": "user", "text": f"note {i}"} for i in range(n)]
    )


@pytest.mark.django_db(transaction=True)
def test_the_embed_worker_and_the_hnsw_indexer_claim_one_context_per_lock(
    stand_in,  # noqa: F811
    system_actor,
    statements,
    settings,
):
    settings.AGENTMEMORY_INDEXER_THREAD = False
    contexts = [make_context(messages=3) for _ in range(3)]
    # A key-subset memory's vector, which has no context.
    memories_record(
        scope=memories.Scope(keys={"user": "ada"}),
        actor=system_actor,
        items=[{"content": "Ada drinks green tea"}],
    )
    statements.clear()
    result = worker.embed_batch(provider=providers.get_provider(), batch_size=100)
    assert result.embedded == 10
    assert_routable(statements, at_least=4)

    # Every vector back to waiting for its graph (the memories': claimed apart).
    with connection.cursor() as cursor:
        for table, columns in indexer.SHARED_COLUMNS.items():
            cursor.execute(
                f"WITH moved AS (DELETE FROM {table} RETURNING {columns})"  # noqa: S608
                f" INSERT INTO {indexer.WAITING_TABLES[table]} ({columns})"
                f" SELECT {columns} FROM moved"
            )
    statements.clear()
    assert indexer.index_batch(batch_size=100) == 10
    assert_routable(statements, at_least=4)
    for context in contexts:
        context.delete()


@pytest.mark.django_db(transaction=True)
def test_the_fulltext_indexer_locks_one_context_by_its_id(statements, settings):
    settings.AGENTMEMORY_INDEXER_THREAD = False
    busy, idle = make_context(), make_context()
    _behind(busy)
    _behind(idle)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    try:
        with psycopg.connect(**params) as other:
            # A writer holds the first context: the claim passes over it to the next.
            other.execute("SELECT 1 FROM memory_app_context WHERE id = %s FOR UPDATE", [busy.pk])
            statements.clear()
            assert fulltext.index_batch() == COPY_THRESHOLD
        assert_routable(statements, at_least=2)
        idle.refresh_from_db()
        assert idle.search_seq == idle.last_seq
        statements.clear()
        assert fulltext.index_pending() == COPY_THRESHOLD
        assert_routable(statements)
    finally:
        connections.close_all()
        busy.delete()
        idle.delete()


@pytest.mark.django_db
def test_lock_contexts_locks_each_context_by_its_id(statements):
    ids = [make_context().pk for _ in range(3)]
    statements.clear()
    with transaction.atomic():
        lock_contexts(reversed(ids))
    assert_routable(statements, at_least=3)


@pytest.mark.django_db
def test_purges_lock_one_context_per_statement(statements, system_actor):
    a, b = make_context(messages=4), make_context(messages=4)
    runs = []
    for context in (a, b):
        run, _ = run_create(context=context, task="t")
        steps_append(run=run, items=[{"kind": "action"} for _ in range(2)])
        runs.append(run)
    for context in (a, b):
        ids = list(Message.objects.filter(context=context).values_list("pk", flat=True)[:2])
        curation.messages_set_pruned(context=context, ids=ids, pruned=True, actor=system_actor)
    for run in runs:
        step = Step.objects.filter(run=run).first()
        curation.steps_set_pruned(run=run, ids=[step.pk], pruned=True, actor=system_actor)
    statements.clear()
    events = curation.pruned_purge(
        older_than=timezone.now() + timedelta(seconds=1),
        confirmation=curation.PURGE_CONFIRMATION,
        actor=system_actor,
    )
    assert len(events) == 4  # messages and steps of each context
    assert not Message.objects.filter(pruned_at__isnull=False).exists()
    assert_routable(statements, at_least=4)

    statements.clear()
    curation.selected_purge(
        message_ids=[Message.objects.filter(context=c).first().pk for c in (a, b)],
        run_ids=[r.pk for r in runs],
        confirmation=curation.PURGE_CONFIRMATION,
        actor=system_actor,
    )
    assert_routable(statements, at_least=4)
    assert Message.objects.filter(context__in=[a, b]).count() == 2


@pytest.mark.django_db
def test_prunes_edits_and_run_writes_lock_by_their_context(statements, system_actor):
    context = make_context(messages=4)
    ids = list(Message.objects.filter(context=context).values_list("pk", flat=True))
    statements.clear()
    curation.messages_set_pruned(context=context, ids=ids[:2], pruned=True, actor=system_actor)
    flt = curation.PruneFilter(text="message 3")
    preview = curation.bulk_prune_preview(context=context, flt=flt)
    assert preview.count == 1
    curation.bulk_prune_apply(
        context=context,
        flt=flt,
        upto_seq=preview.upto_seq,
        expected_count=preview.count,
        actor=system_actor,
    )
    message_edit(message=Message.objects.get(pk=ids[3]), text="edited", actor=system_actor)
    run, _ = run_create(context=context, task="t")
    [step] = steps_append(run=run, items=[{"kind": "action"}]).steps
    curation.steps_set_pruned(run=run, ids=[step.pk], pruned=True, actor=system_actor)
    run_finish(run=run, status="success")
    assert_routable(statements, at_least=6)


@pytest.mark.django_db
def test_an_import_of_several_contexts_locks_one_per_statement(statements, settings):
    settings.AGENTMEMORY_INDEXER_THREAD = False
    sources = [make_context(messages=3) for _ in range(3)]
    lines = list(export_lines())
    Context.objects.filter(pk__in=[c.pk for c in sources]).delete()
    statements.clear()
    import_lines(lines)
    assert Message.objects.count() == 9
    assert_routable(statements, at_least=3)


@pytest.mark.django_db
def test_span_expiry_claims_one_context_per_lock(statements, settings):
    old = timezone.now() - timedelta(days=10)
    for context in (make_context(), make_context()):
        for i in range(3):
            span = TraceSpan.objects.create(
                context=context,
                trace_id=f"{context.pk:032x}",
                span_id=f"{i:016x}",
                role="other",
                start_ns=i,
                end_ns=i + 1,
                data={},
            )
            TraceSpan.objects.filter(pk=span.pk).update(received_at=old)
    settings.AGENTMEMORY_SPAN_RETENTION_DAYS = 7
    statements.clear()
    with CaptureQueriesContext(connection) as sent:
        assert backlog.expire_spans_batch(batch_size=10) == 6
    assert_routable(statements, at_least=2)
    assert not TraceSpan.objects.exists()
    # The oldest spans are found by plain reads of every context's; the claims, deletes and
    # updates name one.
    claims = [
        q["sql"]
        for q in sent.captured_queries
        if "memory_app_tracespan" in q["sql"]
        and (not q["sql"].startswith("SELECT") or "FOR UPDATE" in q["sql"])
    ]
    assert len(claims) >= 4 and without_their_context(claims) == []


@pytest.mark.django_db
def test_the_span_mapper_claims_one_context_per_lock(statements):
    from memory_app.bench.otlp import _exports
    from memory_app.services.span_queue import spans_map_pending
    from tests.api_helpers import make_key

    writer = make_key(scopes=("write",))
    exports = _exports("citus-sql", 3)  # three runs, in three contexts
    for body in exports:
        response = writer.client.generic(
            "POST", "/v1/traces", body, content_type="application/x-protobuf", **writer._headers()
        )
        assert response.status_code == 200, response.content
    assert_routable(statements, at_least=0)
    queued = sum(SpanQueue.objects.values_list("span_count", flat=True))
    statements.clear()
    assert spans_map_pending() == queued > 0
    # A context lock and a claim of its queued exports, per context.
    assert_routable(statements, at_least=6)
    assert not SpanQueue.objects.exists()
    assert Run.objects.filter(status="success").count() == 3


def _trigger_functions() -> list[tuple[str, str, int, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, t.tgname, t.tgtype, pg_get_functiondef(t.tgfoid)"
            " FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE NOT t.tgisinternal AND c.relname LIKE 'memory\\_app\\_%%'"
            " ORDER BY c.relname, t.tgname"
        )
        return cursor.fetchall()


def _context_tables() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND column_name = 'context_id'"
        )
        return {name for (name,) in cursor.fetchall()} | {"memory_app_context"}


@pytest.mark.django_db
def test_no_trigger_on_context_rows_is_statement_level_or_spans_contexts():
    triggers = _trigger_functions()
    tables = _context_tables()
    assert {name for _, name, _, _ in triggers} >= {
        "message_search_update",
        "message_search_delete",
        "message_take_seq",
    }
    statement_level = [
        f"{table}.{name}"
        for table, name, tgtype, _ in triggers
        if table in tables and not tgtype & 1
    ]
    assert statement_level == []
    problems = []
    for table, name, _, body in triggers:
        if table not in tables:
            continue
        code = re.sub(r"--[^\n]*", "", body.split("$function$")[1])
        for chunk in code.split(";"):
            m = re.search(r"\b(PERFORM|SELECT|DELETE|UPDATE|INSERT)\b", chunk, re.I)
            if m is None or m.group(1).upper() == "INSERT":
                continue  # an INSERT ... VALUES writes the one row it names
            # Locked or not, what the function reads or writes is one context's.
            statement = LOCK.split(chunk[m.start() :])[0]
            if (why := unroutable(statement)) is not None:
                problems.append(f"{table}.{name}: {why}")
    assert not problems, "\n".join(problems)


@pytest.mark.django_db
def test_the_claims_first_steps_read_an_index():
    """Step 1 of each claim reads the partial index of what waits, not the whole table (a
    sequential scan is ruled out so that an empty test table cannot hide a missing index)."""
    context = make_context(messages=3)
    # Stored vectors and statistics: a table the migrations left "known empty" (its primary
    # key rebuilt) makes every plan cost the same.
    Embedding.objects.bulk_create(
        Embedding(message=m, context=context, model=f"m{n}", dimensions=1, vector=[1.0])
        for m in Message.objects.filter(context=context)
        for n in range(100)
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("ANALYZE memory_app_embedding")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + worker.PENDING_SQL, ["m", 0, timezone.now(), 100])
        plan = "\n".join(line for (line,) in cursor.fetchall())
        assert "embedding_pending_idx" in plan
        cursor.execute("EXPLAIN " + fulltext.BEHIND_SQL, [0, fulltext.CANDIDATES])
        plan = "\n".join(line for (line,) in cursor.fetchall())
        assert "context_search_behind_idx" in plan


ANNOTATIONS = {"memory_app_score", "memory_app_label", "memory_app_comment"}
STEP_OR_MESSAGE = re.compile(
    r'\(SELECT [^()]*? FROM "memory_app_(?:step|message)" (?:U\d+ )?WHERE (.*?) LIMIT 1\)'
)


@pytest.mark.django_db
def test_a_backup_of_scores_labels_and_comments_reads_and_writes_one_context_per_statement(
    statements, monkeypatch, settings
):
    """Export reads each annotation table by the context alone, its targets' natural keys in
    subqueries on the row's context as well as the target's id (no join on the id alone, a
    cross-shard outer join on Citus); import puts each chunk's timestamps back with updates
    that name the context."""
    import sys

    from memory_app.backup.export import contexts_matching
    from tests.test_backup import _reviewed, _wipe

    settings.AGENTMEMORY_INDEXER_THREAD = False
    monkeypatch.setattr(sys.modules[__name__], "DISTRIBUTED", DISTRIBUTED | ANNOTATIONS)
    # Export reads with server-side cursors, which the fixture does not see.
    declare = psycopg.ServerCursor.execute

    def capture(self, query, params=None, **kwargs):
        statements.append(query if isinstance(query, str) else query.as_string(self))
        return declare(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.ServerCursor, "execute", capture)
    ctx = make_context()
    _reviewed(ctx)
    statements.clear()
    lines = list(export_lines(contexts=contexts_matching(context_ids=[ctx.pk])))
    reads = [s for s in statements if re.search(r'FROM "memory_app_(?:score|label|comment)"', s)]
    assert len(reads) == 3, reads
    subqueries = [m.group(1) for s in reads for m in STEP_OR_MESSAGE.finditer(s)]
    assert len(subqueries) == 9, reads  # step position, step run and message seq, per table
    for sql in reads:
        assert unroutable(sql) is None, sql
    for where in subqueries:
        assert '"context_id" = ("memory_app_' in where and '"id" = ("memory_app_' in where, where

    _wipe()
    statements.clear()
    import_lines(lines)
    updates = [
        s
        for s in statements
        if re.match(r'\s*UPDATE "memory_app_(?:score|label|comment|step|message|toolcall)"', s)
    ]
    assert {re.match(r'\s*UPDATE "(\w+)"', s).group(1) for s in updates} >= ANNOTATIONS
    for sql in updates:
        assert unroutable(sql) is None, sql
