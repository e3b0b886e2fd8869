"""Search everything: one full-text query over messages, step outputs, step errors and tool
calls of every context the reader may see, ranked, grouped by context and run.

Each kind is read through its GIN index (MessageSearch for messages, RunSearch for what runs
wrote) and the work is bounded whatever the store's size: each kind yields at most
`CANDIDATES` matches (the first the index gives, ranked with `ts_rank_cd` as they are read),
the kinds are merged by rank and a page is cut from the merge. A kind that reaches the bound
says so (`SearchPage.capped`): its best hits are the best of the matches read, and a narrower
query (more words, a "phrase", a key) reads them all. Pruned messages have no vector; the
candidates of pruned steps are looked up by their keys and left out. Messages a large batch
stored are found once the full-text indexer reaches them (`memory_app.search.fulltext`; small
appends are indexed at once).

A word the planner's statistics put in a large share of a kind's rows (`WALK_SHARE`: a word
in every message, say) is not read through the GIN index, whose bitmap holds every match
before the first is read: that kind's rows are walked newest first instead, context by context
(the most recently active first) on the side table's primary key, at most `WALK_ROWS` of them,
until `CANDIDATES` match; if the walk meets fewer, the kind is read through its index as any
other. Either way each read stays within the visible contexts and on an index.

The query reads one kind per statement part, each a plain SELECT (messages joined to their
vectors on the context): on Citus each part fans out to every shard with its LIMIT pushed down
and the coordinator merges (the planner's estimates there are not the shards', so no kind is
walked). A snippet is a verbatim window of the text around the words
PostgreSQL's `ts_headline` marks (its own output rewrites markup-like text), as parts the
caller escapes: agent-written text never becomes markup.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet
from django.db.models.functions import Substr
from django.urls import reverse

from memory_app import scale_out
from memory_app.models import FTS_CONFIG, Context, Message, Run, Step, ToolCall
from memory_app.queries.dashboard import (
    MAX_QUERY_CHARS,
    BadQuery,
    _decode_cursor,
    _encode_cursor,
    _key_match,
)

# What can be searched, in the order the filters list them.
KINDS = {
    "message": "messages",
    "output": "step outputs",
    "tool": "tool calls",
    "error": "errors",
}
PAGE_SIZE = 20
CANDIDATES = 200
# A kind whose matches the planner puts at this share of its rows or more is walked newest first
# (see the module doc), reading at most WALK_ROWS rows: at that share they hold about twice
# CANDIDATES matches.
WALK_SHARE = 0.25
WALK_ROWS = 8 * CANDIDATES
START, STOP = "\x02", "\x03"
HEADLINE = (
    f"StartSel={START}, StopSel={STOP}, MaxWords=30, MinWords=12, MaxFragments=2,"
    ' FragmentDelimiter=" … "'
)
TASK_CHARS = 120

_MESSAGES = """
    (SELECT 'message', s.context_id, m.run_id, m.step_id, m.id,
            ts_rank_cd(s.search_vector, %s::tsquery)
     FROM memory_app_messagesearch s
     JOIN memory_app_message m ON m.context_id = s.context_id AND m.seq = s.seq
     WHERE s.search_vector @@ %s::tsquery {contexts}
     {order} LIMIT %s)
"""
_RUN_ROWS = """
    (SELECT r.kind, r.context_id, r.run_id, r.step_id, r.ref_id,
            ts_rank_cd(r.search_vector, %s::tsquery)
     FROM memory_app_runsearch r
     WHERE r.search_vector @@ %s::tsquery AND r.kind = '{kind}' {contexts}
     {order} LIMIT %s)
"""
# On a cluster the first matches the index gives are whichever shards answer first: the same
# search would keep other candidates each time (and its pages overlap or skip). There each
# shard's are taken in a fixed order, newest first by context, and merged in it.
_SHARD_ORDER = {
    "message": "ORDER BY s.context_id, s.seq DESC",
    "run": "ORDER BY r.context_id, r.ref_id DESC",
}
# The walks: the contexts most recently active first, each one's rows newest first on the side
# table's primary key, WALK_ROWS rows in all; the ones that match, CANDIDATES at most.
_CONTEXTS_WALKED = """
    SELECT c.id FROM memory_app_context c WHERE TRUE {contexts}
    ORDER BY c.last_activity_at DESC, c.id DESC LIMIT %s
"""
_MESSAGES_WALK = """
    (SELECT 'message', s.context_id, m.run_id, m.step_id, m.id,
            ts_rank_cd(s.search_vector, %s::tsquery)
     FROM (SELECT w.* FROM ({walked}) c CROSS JOIN LATERAL (
              SELECT s.context_id, s.seq, s.search_vector FROM memory_app_messagesearch s
              WHERE s.context_id = c.id ORDER BY s.seq DESC LIMIT %s) w LIMIT %s) s
     JOIN memory_app_message m ON m.context_id = s.context_id AND m.seq = s.seq
     WHERE s.search_vector @@ %s::tsquery
     LIMIT %s)
"""
_RUN_ROWS_WALK = """
    (SELECT r.kind, r.context_id, r.run_id, r.step_id, r.ref_id,
            ts_rank_cd(r.search_vector, %s::tsquery)
     FROM (SELECT w.* FROM ({walked}) c CROSS JOIN LATERAL (
              SELECT r.kind, r.context_id, r.run_id, r.step_id, r.ref_id, r.search_vector
              FROM memory_app_runsearch r WHERE r.context_id = c.id AND r.kind = '{kind}'
              ORDER BY r.ref_id DESC LIMIT %s) w LIMIT %s) r
     WHERE r.search_vector @@ %s::tsquery
     LIMIT %s)
"""
# The planner's estimate of the rows matching, against the table's rows: one row per side table.
_SHARES = """
    SELECT c.relname, c.reltuples FROM pg_class c
    WHERE c.oid IN ('memory_app_messagesearch'::regclass, 'memory_app_runsearch'::regclass)
"""
_ESTIMATES = """
    EXPLAIN (FORMAT JSON) SELECT 1 FROM memory_app_messagesearch WHERE search_vector @@ %s::tsquery
    UNION ALL SELECT 1 FROM memory_app_runsearch WHERE search_vector @@ %s::tsquery
"""
# Of the steps the candidates belong to, the pruned ones (each looked up by its key: a join in
# the candidates' query let the planner read every match of a frequent word to hash it).
_PRUNED = """
    SELECT st.context_id, st.id FROM memory_app_step st
    JOIN unnest(%s::bigint[], %s::bigint[]) AS p(context_id, id)
        ON st.context_id = p.context_id AND st.id = p.id
    WHERE st.pruned_at IS NOT NULL
"""


@dataclass
class SearchFilters:
    """What the search reads: the query (web-search syntax: words, "phrases", -exclusions, or),
    the kinds (none: all of them) and context keys the contexts must hold."""

    q: str
    kinds: list[str] = field(default_factory=list)
    keys: list[tuple[str, str]] = field(default_factory=list)
    # Keys the context contains, as JSON (the Agent API's `keys`).
    keys_contain: dict[str, Any] | None = None

    def __post_init__(self):
        self.q = self.q.strip()
        if not self.q:
            raise BadQuery("type something to search for")
        if len(self.q) > MAX_QUERY_CHARS:
            raise BadQuery(f"the query is at most {MAX_QUERY_CHARS} characters")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown:
            raise BadQuery(f"kind must be among {list(KINDS)}, got {unknown}")

    @property
    def searched_kinds(self) -> list[str]:
        return [k for k in KINDS if not self.kinds or k in self.kinds]


@dataclass
class Hit:
    kind: str
    context_id: int
    run_id: int | None
    step_id: int | None
    ref_id: int
    rank: float
    # Filled for the page's hits (`_describe`).
    context: Context | None = None
    run: Run | None = None
    step_position: int | None = None
    message_seq: int | None = None
    role: str = ""
    tool_name: str = ""
    parts: list[tuple[str, bool]] = field(default_factory=list)
    # Whether the snippet starts after the text's start, ends before its end.
    cut_before: bool = False
    cut_after: bool = False

    @property
    def link(self) -> str:
        return hit_link(self)

    @property
    def snippet(self) -> str:
        return "".join(text for text, _ in self.parts)

    @property
    def highlights(self) -> list[tuple[int, int]]:
        """(start, end) offsets of the matched words in `snippet`."""
        spans, at = [], 0
        for text, marked in self.parts:
            if marked:
                spans.append((at, at + len(text)))
            at += len(text)
        return spans


@dataclass
class RunGroup:
    run: Run | None
    hits: list[Hit]


@dataclass
class ContextGroup:
    context: Context
    runs: list[RunGroup]


@dataclass
class SearchPage:
    hits: list[Hit]
    next_cursor: str | None
    # Kinds whose matches reached the bound (see the module doc).
    capped: list[str]
    offset: int = 0

    @property
    def groups(self) -> list[ContextGroup]:
        """The hits by context, then by run (messages of no run first), each group where its
        best hit ranks."""
        by_context: dict[int, dict[int | None, list[Hit]]] = {}
        for hit in self.hits:
            by_context.setdefault(hit.context_id, {}).setdefault(hit.run_id, []).append(hit)
        groups = []
        for runs in by_context.values():
            first = next(iter(runs.values()))[0]
            ordered = sorted(runs.items(), key=lambda item: item[0] is not None)
            groups.append(
                ContextGroup(first.context, [RunGroup(hits[0].run, hits) for _, hits in ordered])
            )
        return groups


def _tsquery(q: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT q::text FROM websearch_to_tsquery(%s::regconfig, %s) q WHERE numnode(q) > 0",
            [FTS_CONFIG, q],
        )
        row = cursor.fetchone()
    return row[0] if row else ""


def _context_filter(filters: SearchFilters, contexts: QuerySet[Context] | None) -> tuple[str, list]:
    """The SQL condition on a context id `{column}` that keeps the reader's contexts matching
    the keys."""
    chosen = contexts
    if filters.keys or filters.keys_contain:
        chosen = Context.objects.all() if chosen is None else chosen
        for key, value in filters.keys:
            chosen = chosen.filter(_key_match(key, value))
        if filters.keys_contain:
            chosen = chosen.filter(keys__contains=filters.keys_contain)
    if chosen is None:
        return "", []
    sql, params = chosen.values("pk").query.sql_with_params()
    # An array computed once: as `IN (subquery)` the planner joined each context to the matches
    # and read the GIN index again for every context.
    return f"AND {{column}} = ANY(ARRAY({sql}))", list(params)


def search_all(
    *,
    filters: SearchFilters,
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
    contexts: QuerySet[Context] | None = None,
) -> SearchPage:
    """One page of hits, best first; `contexts` bounds them to those contexts (an API key's
    confinement), None reads every context."""
    offset = 0
    if cursor:
        (offset,) = _decode_cursor(cursor, 1)
        if not isinstance(offset, int) or offset < 0:
            raise BadQuery("the page cursor is not valid; start again from the first page")
    tsquery = _tsquery(filters.q)
    if not tsquery:
        return SearchPage([], None, [])
    condition, context_params = _context_filter(filters, contexts)
    with transaction.atomic(), connection.cursor() as db:
        walked = _walked_kinds(db, tsquery, filters.searched_kinds)
        rows = _walk(db, tsquery, walked, condition, context_params) if walked else []
        # A walk that met fewer than CANDIDATES matches is read through the index after all.
        found = {kind: sum(row[0] == kind for row in rows) for kind in walked}
        indexed = [k for k in filters.searched_kinds if found.get(k, 0) < CANDIDATES]
        rows = [row for row in rows if row[0] not in indexed]
        if indexed:
            rows += _indexed(db, tsquery, indexed, condition, context_params)
        steps = {(row[1], row[3]) for row in rows if row[0] != "message"}
        pruned: set[tuple[int, int]] = set()
        if steps:
            db.execute(_PRUNED, [[c for c, _ in steps], [i for _, i in steps]])
            pruned = set(db.fetchall())
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        counts[row[0]] += 1
    capped = [k for k in KINDS if counts[k] >= CANDIDATES]
    rows = [row for row in rows if row[0] == "message" or (row[1], row[3]) not in pruned]
    # Best first; ties in a stable order (context, kind, newest first) so pages never overlap.
    rows.sort(key=lambda row: (-row[5], row[1], row[0], -row[4]))
    page = [Hit(*row) for row in rows[offset : offset + limit]]
    page = _describe(page, tsquery)
    more = offset + limit < len(rows)
    return SearchPage(page, _encode_cursor(offset + limit) if more else None, capped, offset)


def _walked_kinds(db, tsquery: str, kinds: list[str]) -> list[str]:
    """The kinds whose matches the planner's statistics put at WALK_SHARE of their side table's
    rows or more (none on Citus, whose coordinator has no statistics of the shards' rows)."""
    if scale_out.is_distributed(db, "memory_app_messagesearch"):
        return []
    db.execute(_SHARES)
    sizes = dict(db.fetchall())
    if min(sizes.values(), default=0) <= 0:
        return []
    db.execute(_ESTIMATES, [tsquery, tsquery])
    plan = db.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    estimates = [p["Plan Rows"] for p in plan[0]["Plan"].get("Plans", [])]
    if len(estimates) != 2:
        return []
    share = {
        "message": estimates[0] / sizes["memory_app_messagesearch"],
        "run": estimates[1] / sizes["memory_app_runsearch"],
    }
    return [k for k in kinds if share["message" if k == "message" else "run"] >= WALK_SHARE]


def _walk(db, tsquery: str, kinds: list[str], condition: str, context_params: list) -> list:
    """The first CANDIDATES matches of each kind in a walk of its newest rows (module doc)."""
    walked = _CONTEXTS_WALKED.format(contexts=condition.format(column="c.id"))
    parts, params = [], []
    for kind in kinds:
        template = _MESSAGES_WALK if kind == "message" else _RUN_ROWS_WALK
        parts.append(template.format(walked=walked, kind=kind))
        # Each part: the rank's query, the contexts, the rows of one context and in all, the
        # match's query, the bound.
        params += [tsquery, *context_params, WALK_ROWS, WALK_ROWS, WALK_ROWS, tsquery, CANDIDATES]
    # The walks read the side tables' primary keys in order: index scans, never a whole table.
    db.execute("SET LOCAL enable_seqscan = off")
    db.execute(" UNION ALL ".join(parts), params)
    return db.fetchall()


def _indexed(db, tsquery: str, kinds: list[str], condition: str, context_params: list) -> list:
    """The first CANDIDATES matches of each kind its GIN index gives."""
    parts, params = [], []
    sharded = scale_out.is_distributed(db, "memory_app_messagesearch")
    for kind in kinds:
        table = "message" if kind == "message" else "run"
        order = _SHARD_ORDER[table] if sharded else ""
        if table == "message":
            contexts = condition.format(column="s.context_id")
            parts.append(_MESSAGES.format(contexts=contexts, order=order))
        else:
            contexts = condition.format(column="r.context_id")
            parts.append(_RUN_ROWS.format(kind=kind, contexts=contexts, order=order))
        # Each part: the rank's query, the match's query, the context filter, the bound.
        params += [tsquery, tsquery, *context_params, CANDIDATES]
    # Bitmap scans of the GIN indexes only: with a LIMIT the planner otherwise walks a table
    # hoping to meet enough matches early, and reads all of it for a rare word.
    db.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = off")
    db.execute(" UNION ALL ".join(parts), params)
    return db.fetchall()


def _headlines(sql: str, pairs: list[tuple[int, int]], tsquery: str) -> dict[int, tuple[str, str]]:
    """(text, headline) of each (context, id) pair's row."""
    if not pairs:
        return {}
    with connection.cursor() as db:
        db.execute(
            sql,
            {
                "contexts": [c for c, _ in pairs],
                "ids": [i for _, i in pairs],
                "config": FTS_CONFIG,
                "q": tsquery,
                "options": HEADLINE,
            },
        )
        return {row[0]: (row[1], row[2]) for row in db.fetchall()}


# The text of each kind, as its vector was made (migration 0035 for what runs wrote), with the
# highlight marks taken out of it.
_TEXTS = {
    "message": ("memory_app_message", "t.text"),
    "output": (
        "memory_app_step",
        "concat_ws(' ', t.plan, t.code_action, t.model_output #>> '{}', t.observations,"
        " t.action_output #>> '{}')",
    ),
    "error": ("memory_app_step", "concat_ws(' ', t.error_type, t.error_message)"),
    "tool": ("memory_app_toolcall", "concat_ws(' ', t.name, t.arguments #>> '{}', t.output)"),
}
# The text is read as far as its vector reaches; the headline is read from it with the highlight
# marks taken out, for the words it marks only.
_HEADLINE_SQL = """
    SELECT t.id, left({text}, memory_app_search_chars()), ts_headline(%(config)s::regconfig,
        translate(left({text}, memory_app_search_chars()), E'\\x02\\x03', ''),
        %(q)s::tsquery, %(options)s)
    FROM {table} t
    JOIN unnest(%(contexts)s::bigint[], %(ids)s::bigint[]) AS p(context_id, id)
        ON t.context_id = p.context_id AND t.id = p.id
"""
BEFORE, AFTER = 60, 240


def _marked(headline: str) -> set[str]:
    """The words a headline marks."""
    return {chunk.split(STOP, 1)[0] for chunk in headline.split(START)[1:] if STOP in chunk}


def snippet_parts(text: str, words: set[str]) -> tuple[list[tuple[str, bool]], bool, bool]:
    """A window of `text` around the first of `words` as (text, highlighted) parts, each a
    verbatim piece of the text (PostgreSQL's own headline rewrites it: markup-like text becomes
    spaces), and whether text was cut before and after the window."""
    if not text:
        return [], False, False
    pattern = (
        re.compile(
            r"(?<!\w)("
            + "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
            + r")(?!\w)",
            re.IGNORECASE,
        )
        if words
        else None
    )
    first = pattern.search(text) if pattern else None
    start = max(0, first.start() - BEFORE) if first else 0
    end = min(len(text), start + BEFORE + AFTER)
    # Cut at a space where there is one near the edge, not inside a word.
    if start > 0 and (space := text.find(" ", start, start + 20)) != -1:
        start = space + 1
    if end < len(text) and (space := text.rfind(" ", end - 20, end)) != -1:
        end = space
    window = text[start:end]
    parts: list[tuple[str, bool]] = []
    at = 0
    for match in pattern.finditer(window) if pattern else ():
        if match.start() > at:
            parts.append((window[at : match.start()], False))
        parts.append((match.group(0), True))
        at = match.end()
    if at < len(window):
        parts.append((window[at:], False))
    return parts, start > 0, end < len(text)


def _describe(hits: list[Hit], tsquery: str) -> list[Hit]:
    """Each hit's context, run, position or seq, and snippet (a few reads for the page); a hit
    whose row was deleted since it was found is left out."""
    if not hits:
        return hits
    context_ids = {h.context_id for h in hits}
    contexts = Context.objects.only("keys", "title").in_bulk(context_ids)
    run_ids = {h.run_id for h in hits if h.run_id}
    runs = {
        (r.context_id, r.pk): r
        for r in Run.objects.filter(context_id__in=context_ids, id__in=run_ids)
        .only("id", "context_id", "status", "agent_name", "started_at", "created_at")
        .annotate(task_head=Substr("task", 1, TASK_CHARS))
    }
    step_ids = {h.step_id for h in hits if h.step_id and h.kind != "message"}
    positions = {
        (c, i): p
        for c, i, p in Step.objects.filter(context_id__in=context_ids, id__in=step_ids).values_list(
            "context_id", "id", "position"
        )
    }
    message_ids = [h.ref_id for h in hits if h.kind == "message"]
    messages = {
        (c, i): (seq, role)
        for c, i, seq, role in Message.objects.filter(
            context_id__in=context_ids, id__in=message_ids
        ).values_list("context_id", "id", "seq", "role")
    }
    tool_ids = [h.ref_id for h in hits if h.kind == "tool"]
    tools = dict(
        ((c, i), name)
        for c, i, name in ToolCall.objects.filter(
            context_id__in=context_ids, id__in=tool_ids
        ).values_list("context_id", "id", "name")
    )
    headlines: dict[tuple[str, int], str] = {}
    for kind, (table, text) in _TEXTS.items():
        pairs = [(h.context_id, h.ref_id) for h in hits if h.kind == kind]
        found = _headlines(_HEADLINE_SQL.format(table=table, text=text), pairs, tsquery)
        headlines.update({(kind, i): line for i, line in found.items()})
    for hit in hits:
        hit.context = contexts.get(hit.context_id)
        hit.run = runs.get((hit.context_id, hit.run_id)) if hit.run_id else None
        if hit.kind == "message":
            hit.message_seq, hit.role = messages.get((hit.context_id, hit.ref_id), (None, ""))
        else:
            hit.step_position = positions.get((hit.context_id, hit.step_id))
        hit.tool_name = tools.get((hit.context_id, hit.ref_id), "") if hit.kind == "tool" else ""
        text, headline = headlines.get((hit.kind, hit.ref_id), ("", ""))
        hit.parts, hit.cut_before, hit.cut_after = snippet_parts(text, _marked(headline))
    return [
        h
        for h in hits
        if h.context is not None
        and (h.message_seq if h.kind == "message" else h.step_position) is not None
    ]


def hit_link(hit: Hit) -> str:
    """The dashboard page that shows the hit: the message in its context's history, or the
    step in its run's logbook (a tool call's or an error's step)."""
    if hit.kind == "message":
        seq = hit.message_seq
        return reverse("context", args=[hit.context_id]) + f"?seq={seq}#m-{seq}"
    return reverse("run-step", args=[hit.run_id, hit.step_position]) + f"#step-{hit.step_position}"


def hit_api_path(hit: Hit) -> str:
    """The Agent API's route of the hit's message or step (with its tool calls)."""
    if hit.kind == "message":
        return f"/api/v1/contexts/{hit.context_id}/messages/{hit.ref_id}"
    return f"/api/v1/contexts/{hit.context_id}/steps/{hit.step_id}"
