"""Scores, labels and comments on a run, step or message, and review queues: every write audited.

Who wrote a row is the actor's label (`user:<name>`, `key:<prefix>`), set here from who asks. An
evaluator's score is idempotent by its client id (per author): the same id with the same content
answers the stored score, other content is a conflict. A reviewer scoring in the dashboard keeps
one score per name and target, replaced when they score again (the audit keeps the old one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from memory_app.audit import Actor, audit_record
from memory_app.errors import Conflict, Invalid, NotFound, differences
from memory_app.models import Comment, Label, Message, ReviewQueue, Run, Score, ScoreKind, Step
from memory_app.models.scores import CATEGORY_CHARS, COMMENT_CHARS, NAME_CHARS


@dataclass(frozen=True)
class Target:
    """What a row is about: a run, a step (with its run) or a message (with its run, if any)."""

    context_id: int
    run_id: int | None = None
    step_id: int | None = None
    message_id: int | None = None

    @classmethod
    def of(cls, obj: Run | Step | Message) -> Target:
        if isinstance(obj, Run):
            return cls(context_id=obj.context_id, run_id=obj.pk)
        if isinstance(obj, Step):
            return cls(context_id=obj.context_id, run_id=obj.run_id, step_id=obj.pk)
        return cls(context_id=obj.context_id, run_id=obj.run_id, message_id=obj.pk)

    def fields(self) -> dict[str, Any]:
        return {
            "context_id": self.context_id,
            "run_id": self.run_id,
            "step_id": self.step_id,
            "message_id": self.message_id,
        }

    @property
    def kind(self) -> str:
        return "step" if self.step_id else "message" if self.message_id else "run"


def clean_name(name: Any, what: str = "name") -> str:
    if not isinstance(name, str) or not name.strip():
        raise Invalid(f"a {what} is a non-empty text")
    name = name.strip()
    if len(name) > NAME_CHARS:
        raise Invalid(f"a {what} is at most {NAME_CHARS} characters")
    return name


def score_value(kind: str, value: Any) -> tuple[float | None, str | None]:
    """(number, category) for a value of `kind`, or Invalid saying what the kind takes."""
    if kind == ScoreKind.BOOLEAN:
        if not isinstance(value, bool):
            raise Invalid("a boolean score's value is true or false")
        return (1.0 if value else 0.0), None
    if kind == ScoreKind.NUMERIC:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid("a numeric score's value is a number")
        if not math.isfinite(float(value)):
            raise Invalid("a numeric score's value is a finite number")
        return float(value), None
    if kind == ScoreKind.CATEGORICAL:
        if not isinstance(value, str) or not value.strip():
            raise Invalid("a categorical score's value is a non-empty text")
        if len(value) > CATEGORY_CHARS:
            raise Invalid(f"a category is at most {CATEGORY_CHARS} characters")
        return None, value
    raise Invalid(f"a score's kind is one of {ScoreKind.values}, got {kind!r}")


def clean_comment(text: Any) -> str:
    """A score's comment (it may be empty)."""
    if not isinstance(text, str):
        raise Invalid("a comment is a text")
    if len(text) > COMMENT_CHARS:
        raise Invalid(f"a comment is at most {COMMENT_CHARS} characters")
    return text


def comment_text(text: Any) -> str:
    """A comment's text: a comment says something, so it is never blank."""
    text = clean_comment(text)
    if not text.strip():
        raise Invalid("a comment is a non-empty text")
    return text


def score_snapshot(score: Score) -> dict[str, Any]:
    return {
        "id": score.pk,
        "target": score.target_type,
        "target_id": score.target_id,
        "run_id": score.run_id,
        "name": score.name,
        "kind": score.kind,
        "value": score.value,
        "comment": score.comment,
        "author": score.author,
        "client_id": score.client_id,
    }


def _content(score: Score) -> dict[str, Any]:
    """What a retry with the same client id must repeat."""
    snap = score_snapshot(score)
    return {k: snap[k] for k in ("target", "target_id", "name", "kind", "value", "comment")}


def score_add(
    *,
    actor: Actor,
    target: Target,
    name: Any,
    kind: Any,
    value: Any,
    comment: Any = "",
    client_id: str | None = None,
) -> tuple[Score, bool]:
    """A new score, or the stored one for a repeated client id with the same content (False)."""
    name = clean_name(name)
    number, category = score_value(kind, value)
    comment = clean_comment(comment)
    row = Score(
        **target.fields(),
        author=actor.label,
        name=name,
        kind=kind,
        number=number,
        category=category,
        comment=comment,
        client_id=client_id,
    )
    if client_id is not None:
        stored = _by_client_id(target.context_id, actor.label, client_id)
        if stored is not None:
            return _repeat(stored, row), False
    try:
        with transaction.atomic():
            row.save()
            _audit(actor, "score_add", row, before=None)
    except IntegrityError:
        # Another request with this client id won the race: answer as a repeat of it.
        stored = _by_client_id(target.context_id, actor.label, client_id) if client_id else None
        if stored is None:
            raise
        return _repeat(stored, row), False
    return row, True


def _by_client_id(context_id: int, author: str, client_id: str) -> Score | None:
    return Score.objects.filter(context_id=context_id, author=author, client_id=client_id).first()


def _repeat(stored: Score, sent: Score) -> Score:
    old, new = _content(stored), _content(sent)
    if old != new:
        raise Conflict(
            f"score {stored.client_id!r} already exists with different content",
            differences(old, new),
        )
    return stored


def _audit(actor: Actor, action: str, score: Score, *, before: Any) -> None:
    audit_record(
        actor=actor,
        action=action,
        target_type="score",
        target_ids=[score.pk],
        context_id=score.context_id,
        before=before,
        after=score_snapshot(score),
    )


def score_set(
    *, actor: Actor, target: Target, name: Any, kind: Any, value: Any, comment: Any = ""
) -> Score:
    """The actor's one score of `name` on `target`, made or replaced (a reviewer's change of
    mind): the audit event keeps what it was."""
    name = clean_name(name)
    number, category = score_value(kind, value)
    comment = clean_comment(comment)
    with transaction.atomic():
        mine = list(
            Score.objects.select_for_update()
            .filter(**target.fields(), author=actor.label, name=name)
            .order_by("-id")
        )
        row = mine[0] if mine else Score(**target.fields(), author=actor.label, name=name)
        before = score_snapshot(row) if mine else None
        row.kind, row.number, row.category, row.comment = kind, number, category, comment
        row.save()
        _audit(actor, "score_set" if mine else "score_add", row, before=before)
    return row


def score_delete(*, actor: Actor, context_id: int, score_id: int) -> None:
    with transaction.atomic():
        row = (
            Score.objects.select_for_update()
            .filter(context_id=context_id, pk=score_id, author=actor.label)
            .first()
        )
        if row is None:
            raise NotFound(f"score {score_id} not found")
        audit_record(
            actor=actor,
            action="score_delete",
            target_type="score",
            target_ids=[row.pk],
            context_id=context_id,
            before=score_snapshot(row),
        )
        Score.objects.filter(context_id=context_id, pk=row.pk).delete()


def label_add(*, actor: Actor, target: Target, name: Any) -> Label:
    """Label a target (a label already there stays as it is, unaudited: nothing changed)."""
    name = clean_name(name, "label")
    with transaction.atomic():
        label, created = Label.objects.get_or_create(
            **target.fields(), name=name, defaults={"author": actor.label}
        )
        if created:
            audit_record(
                actor=actor,
                action="label_add",
                target_type="label",
                target_ids=[label.pk],
                context_id=target.context_id,
                after={"target": target.kind, "target_id": label.target_id, "name": name},
            )
    return label


def label_remove(*, actor: Actor, target: Target, name: Any) -> None:
    name = clean_name(name, "label")
    with transaction.atomic():
        label = Label.objects.select_for_update().filter(**target.fields(), name=name).first()
        if label is None:
            raise NotFound(f"no label {name!r} here")
        audit_record(
            actor=actor,
            action="label_remove",
            target_type="label",
            target_ids=[label.pk],
            context_id=target.context_id,
            before={"target": target.kind, "target_id": label.target_id, "name": name},
        )
        Label.objects.filter(context_id=target.context_id, pk=label.pk).delete()


def comment_add(*, actor: Actor, target: Target, text: Any) -> Comment:
    text = comment_text(text)
    with transaction.atomic():
        comment = Comment.objects.create(**target.fields(), author=actor.label, text=text)
        audit_record(
            actor=actor,
            action="comment_add",
            target_type="comment",
            target_ids=[comment.pk],
            context_id=target.context_id,
            after={"target": target.kind, "target_id": comment.target_id, "text": text},
        )
    return comment


def review_queue_create(
    *,
    actor: Actor,
    name: str,
    filters: str,
    score_name: str,
    score_kind: str,
    categories: list[str] | None = None,
) -> ReviewQueue:
    """Save a runs-table filter as a queue whose reviewers give `score_name`."""
    name = name.strip()
    if not name:
        raise Invalid("a queue needs a name")
    score_name = clean_name(score_name, "score name")
    categories = [c.strip() for c in categories or [] if c.strip()]
    if score_kind == ScoreKind.CATEGORICAL and not 2 <= len(categories) <= 9:
        raise Invalid("a categorical queue has 2 to 9 categories (digit keys 1 to 9)")
    for category in categories:
        score_value(ScoreKind.CATEGORICAL, category)
    if score_kind not in ScoreKind.values:
        raise Invalid(f"a score's kind is one of {ScoreKind.values}")
    with transaction.atomic():
        if ReviewQueue.objects.filter(name=name).exists():
            raise Invalid(f"a queue named {name!r} exists")
        queue = ReviewQueue.objects.create(
            name=name,
            filters=filters,
            score_name=score_name,
            score_kind=score_kind,
            categories=categories if score_kind == ScoreKind.CATEGORICAL else [],
            created_by=actor.user,
        )
        audit_record(
            actor=actor,
            action="review_queue_create",
            target_type="reviewqueue",
            target_ids=[queue.pk],
            after={
                "name": name,
                "filters": filters,
                "score_name": score_name,
                "score_kind": score_kind,
                "categories": queue.categories,
            },
        )
    return queue
