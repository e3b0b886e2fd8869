"""What reviewers and evaluators say about a run, a step or a message: scores (a named judgement,
numeric, boolean or categorical), labels and comments; and the review queues that lead a
reviewer through the runs still waiting for their score.

Scores, labels and comments are rows of their target's context: `context_id` is in their keys,
and the database's foreign keys to runs, steps and messages are composite (migration 0029), so a
row only points at a target of its own context. Django follows `id` alone (`db_constraint=False`)
and cascades a purged target's rows; the database cascades too, for deletes Django does not see.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from memory_app.models.contexts import Context
from memory_app.models.messages import Message
from memory_app.models.runs import Run, Step
from memory_app.models.shared import ContextRow, choices_check

NAME_CHARS = 100
CATEGORY_CHARS = 200
COMMENT_CHARS = 10_000


class ScoreKind(models.TextChoices):
    NUMERIC = "numeric"
    BOOLEAN = "boolean"
    CATEGORICAL = "categorical"


def _target(model, related_name: str) -> models.ForeignKey:
    return models.ForeignKey(
        model,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name=related_name,
        db_index=False,
        db_constraint=False,
    )


class Annotation(ContextRow):
    """What scores, labels and comments share: their target and who wrote them.

    A step's row names its run too (`run`), and a message's its run when the message has one,
    so a run's whole review reads by run. A run's own row names neither step nor message."""

    context = models.ForeignKey(Context, on_delete=models.CASCADE, related_name="+", db_index=False)
    run = _target(Run, "+")
    step = _target(Step, "+")
    message = _target(Message, "+")
    # `user:<name>` or `key:<prefix>`, set by the server from who asks (never from the request).
    author = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True

    @property
    def target_type(self) -> str:
        if self.step_id is not None:
            return "step"
        if self.message_id is not None:
            return "message"
        return "run"

    @property
    def target_id(self) -> int:
        return self.step_id or self.message_id or self.run_id


def _target_checks(prefix: str) -> list[models.CheckConstraint]:
    return [
        models.CheckConstraint(
            condition=Q(run__isnull=False) | Q(message__isnull=False), name=f"{prefix}_has_target"
        ),
        models.CheckConstraint(
            condition=Q(step__isnull=True) | Q(run__isnull=False, message__isnull=True),
            name=f"{prefix}_step_of_run",
        ),
    ]


class Score(Annotation):
    """A named judgement: `number` holds a numeric score (a boolean's is 1 or 0), `category` a
    categorical one. One author's scores of one name on one target may be several (an evaluator
    run twice); the dashboard keeps one per reviewer, replacing it when they score again."""

    name = models.CharField(max_length=NAME_CHARS)
    kind = models.CharField(max_length=20, choices=ScoreKind.choices)
    number = models.FloatField(null=True, blank=True)
    category = models.CharField(max_length=CATEGORY_CHARS, null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    # The caller's own id: the same id with the same content is the same score (a retry).
    client_id = models.CharField(max_length=200, null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["context", "author", "client_id"],
                condition=Q(client_id__isnull=False),
                name="score_client_id_unique",
            ),
            choices_check("kind", ScoreKind, "score_kind_valid"),
            models.CheckConstraint(
                condition=(
                    Q(kind="numeric", number__isnull=False, category__isnull=True)
                    | Q(kind="boolean", number__in=[0.0, 1.0], category__isnull=True)
                    | Q(kind="categorical", number__isnull=True, category__isnull=False)
                ),
                name="score_value_of_kind",
            ),
            *_target_checks("score"),
        ]
        indexes = [
            # A run's scores (logbook, runs table, filters, "scored by me"), by name.
            models.Index(fields=["context", "run", "name"], name="score_run_name_idx"),
            models.Index(
                fields=["context", "message"],
                condition=Q(message__isnull=False),
                name="score_message_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name}={self.value} on {self.target_type} {self.target_id}"

    @property
    def value(self):
        if self.kind == ScoreKind.BOOLEAN:
            return self.number == 1.0
        if self.kind == ScoreKind.CATEGORICAL:
            return self.category
        return self.number


class Label(Annotation):
    """A short tag on a run, step or message (`regression`, `needs-prompt-fix`): one per name and
    target."""

    name = models.CharField(max_length=NAME_CHARS)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["context", "run", "step", "message", "name"],
                nulls_distinct=False,
                name="label_target_name_unique",
            ),
            *_target_checks("label"),
        ]
        indexes = [models.Index(fields=["context", "name", "run"], name="label_name_run_idx")]

    def __str__(self) -> str:
        return f"label {self.name} on {self.target_type} {self.target_id}"


class Comment(Annotation):
    """Free text on a run, step or message."""

    text = models.TextField()

    class Meta:
        constraints = [*_target_checks("comment")]
        indexes = [models.Index(fields=["context", "run"], name="comment_run_idx")]

    def __str__(self) -> str:
        return f"comment on {self.target_type} {self.target_id}"


class ReviewQueue(models.Model):
    """A saved runs-table filter (its query string) and the score its reviewers give: a reviewer
    works through the runs it lists that they have not yet scored under `score_name`. Belongs to
    no context (it spans them): a small table of the operators'."""

    name = models.CharField(max_length=200, unique=True)
    filters = models.TextField(blank=True, default="", help_text="the runs table's query string")
    score_name = models.CharField(max_length=NAME_CHARS)
    score_kind = models.CharField(max_length=20, choices=ScoreKind.choices)
    # A categorical queue's categories, in the order the digit keys 1, 2, 3… give them.
    categories = ArrayField(models.CharField(max_length=CATEGORY_CHARS), default=list, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [choices_check("score_kind", ScoreKind, "reviewqueue_kind_valid")]

    def __str__(self) -> str:
        return self.name
