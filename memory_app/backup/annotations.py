"""Scores, labels and comments in a backup: rows of their target's context, exported with it
after its messages, each naming its one target by natural key: a run by its ref, a step by
(run ref, position), a message by its seq in the line's context.

Their natural keys (a line whose key is stored already is left as it is): a score's is (context,
target, name, created_at), a label's (context, target, name), the table's own unique key, and a
comment's (context, target, created_at), so a score or comment line needs its `created_at`.
The author is the importer, as a memory's `recorded_by` is: it is who asks, never the file's
word (a line may omit it). The rules the write path holds names, comments and categories to
hold on import too. A score keeps its client id unless the
importer already has a score with that id in the context (the id is its author's retry key):
then it is stored without one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import models
from django.db.models import OuterRef, Subquery

from memory_app.backup.format import (
    COMMENT_FIELDS,
    LABEL_FIELDS,
    SCORE_FIELDS,
    dump_fields,
    load_fields,
)
from memory_app.errors import BackupFormatError, Invalid
from memory_app.models import Comment, Context, Label, Message, Score, ScoreKind, Step
from memory_app.services.scores import clean_comment, clean_name, comment_text, score_value

KINDS: dict[str, tuple[type[models.Model], list[models.Field]]] = {
    "score": (Score, SCORE_FIELDS),
    "label": (Label, LABEL_FIELDS),
    "comment": (Comment, COMMENT_FIELDS),
}
_TARGET = ("context_id", "run_id", "step_id", "message_id")
NATURAL_KEYS = {
    "score": (*_TARGET, "name", "created_at"),
    "label": (*_TARGET, "name"),
    "comment": (*_TARGET, "created_at"),
}
_STAMPS = {
    "score": ["created_at", "updated_at"],
    "label": ["created_at"],
    "comment": ["created_at"],
}


def annotation_records(
    ctx: Context, run_refs: dict[int, dict], chunk_size: int
) -> Iterator[dict[str, Any]]:
    """A context's scores, then its labels, then its comments (after its runs and messages)."""
    # A step's or message's natural key is read in a subquery on the row's own context as well
    # as its id, so on Citus each stays on the context's shard (a join on the id alone would be
    # a cross-shard outer join).
    steps = Step.objects.filter(
        context_id=OuterRef("context_id"), pk=OuterRef("step_id")
    ).order_by()
    messages = Message.objects.filter(
        context_id=OuterRef("context_id"), pk=OuterRef("message_id")
    ).order_by()
    for kind, (model, fields) in KINDS.items():
        rows = (
            model.objects.filter(context=ctx)
            .annotate(
                step_position=Subquery(steps.values("position")[:1]),
                step_run_id=Subquery(steps.values("run_id")[:1]),
                message_seq=Subquery(messages.values("seq")[:1]),
            )
            .order_by("pk")
        )
        for row in rows.iterator(chunk_size=chunk_size):
            record = {"type": kind, "context": ctx.keys_digest, **dump_fields(row, fields)}
            # The target alone: a step's or message's run is derived from it on import.
            record["run"] = run_refs[row.run_id] if row.target_type == "run" else None
            record["step"] = (
                {"run": run_refs[row.step_run_id], "position": row.step_position}
                if row.step_id
                else None
            )
            record["message"] = row.message_seq if row.message_id else None
            yield record


class _Targets:
    """A chunk's targets, each looked up once, only in the line's context (one the file
    defines): another tenant's run, step or message fails like an unknown one."""

    def __init__(self, importer: Any, kind: str) -> None:
        self.importer, self.kind = importer, kind
        # (context, run, position) -> (step, its run), for the steps the chunk names.
        self.steps: dict[tuple[int, int, int], tuple[int, int]] = {}
        self.messages: dict[tuple[int, int], tuple[int, int | None]] = {}

    def missing(self, what: str) -> BackupFormatError:
        return BackupFormatError(f"a {self.kind} refers to a {what} that is not in the backup")

    def run(self, ctx_pk: int, ref: dict) -> int:
        run_pk = self.importer.run_id(ctx_pk, ref)
        if run_pk is None:
            raise self.missing("run")
        return run_pk

    def load_messages(self, records: list[dict[str, Any]]) -> None:
        seqs: dict[int, set[int]] = {}
        for rec in records:
            if rec.get("message") is not None:
                ctx_pk = self.importer.context_id(rec["context"])
                seqs.setdefault(ctx_pk, set()).add(rec["message"])
        for ctx_pk, wanted in seqs.items():
            found = Message.objects.filter(context_id=ctx_pk, seq__in=wanted)
            for seq, pk, run_pk in found.values_list("seq", "pk", "run_id"):
                self.messages[(ctx_pk, seq)] = (pk, run_pk)

    def load_steps(self, records: list[dict[str, Any]]) -> None:
        """The chunk's steps, one query per context (their runs found first, in that context)."""
        wanted: dict[int, set[tuple[int, int]]] = {}
        for rec in records:
            if rec.get("step") is not None:
                ctx_pk = self.importer.context_id(rec["context"])
                run_pk = self.run(ctx_pk, rec["step"]["run"])
                wanted.setdefault(ctx_pk, set()).add((run_pk, rec["step"]["position"]))
        for ctx_pk, keys in wanted.items():
            found = Step.objects.filter(
                context_id=ctx_pk,
                run_id__in={run for run, _ in keys},
                position__in={position for _, position in keys},
            )
            for run_pk, position, pk in found.values_list("run_id", "position", "pk"):
                if (run_pk, position) in keys:
                    self.steps[(ctx_pk, run_pk, position)] = (pk, run_pk)

    def of(self, ctx_pk: int, rec: dict[str, Any]) -> dict[str, int | None]:
        if rec.get("run") is not None:
            return {"run_id": self.run(ctx_pk, rec["run"]), "step_id": None, "message_id": None}
        if rec.get("step") is not None:
            key = (ctx_pk, self.run(ctx_pk, rec["step"]["run"]), rec["step"]["position"])
            if key not in self.steps:
                raise self.missing("step")
            step_pk, run_pk = self.steps[key]
            return {"run_id": run_pk, "step_id": step_pk, "message_id": None}
        if (ctx_pk, rec["message"]) not in self.messages:
            raise self.missing("message")
        message_pk, run_pk = self.messages[(ctx_pk, rec["message"])]
        return {"run_id": run_pk, "step_id": None, "message_id": message_pk}


def import_annotations(importer: Any, kind: str, records: list[dict[str, Any]]) -> None:
    """One chunk of score, label or comment lines (`importer`: restore's `_Importer`)."""
    model, fields = KINDS[kind]
    targets = _Targets(importer, kind)
    targets.load_messages(records)
    targets.load_steps(records)
    rows = []
    for rec in records:
        ctx_pk = importer.context_id(rec["context"])
        row = model(context_id=ctx_pk, **load_fields(rec, fields), **targets.of(ctx_pk, rec))
        row.author = importer.actor.label
        _write_path_rules(kind, row)
        rows.append(row)
    names = NATURAL_KEYS[kind]
    # Narrowed by the key's last column (the instant or the name), then compared whole.
    new = importer.not_stored(model, rows, names, narrow=names[-1])
    if kind == "score":
        _free_client_ids(importer, new)
    importer.insert(model, new, _STAMPS[kind])
    importer.result.count(f"{kind}s", len(new), len(rows) - len(new))


def _write_path_rules(kind: str, row: Score | Label | Comment) -> None:
    """What the API and dashboard refuse, an import refuses too (the same functions say so): a
    blank or overlong name, a comment over its length, a blank comment, an empty category. A
    name is stored as those paths store it, without surrounding blanks."""
    try:
        if kind == "comment":
            row.text = comment_text(row.text)
            return
        row.name = clean_name(row.name, "label" if kind == "label" else "name")
        if kind == "score":
            row.comment = clean_comment(row.comment)
            if row.kind == ScoreKind.CATEGORICAL:
                score_value(row.kind, row.category)
    except Invalid as exc:
        raise BackupFormatError(f"a {kind} line: {exc}") from None


def _free_client_ids(importer: Any, scores: list[Score]) -> None:
    """A client id the importer holds already in a context (its own score's, or one an earlier
    line of the file gave) is dropped: the table keeps one per (context, author, client id)."""
    wanted = {s.client_id for s in scores if s.client_id is not None}
    if not wanted:
        return
    taken = set(
        Score.objects.filter(
            context_id__in={s.context_id for s in scores},
            author=importer.actor.label,
            client_id__in=wanted,
        ).values_list("context_id", "client_id")
    )
    for score in scores:
        if score.client_id is None:
            continue
        if (score.context_id, score.client_id) in taken:
            score.client_id = None
        else:
            taken.add((score.context_id, score.client_id))
