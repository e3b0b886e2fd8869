"""The dashboard's inputs for scores, labels, comments and review queues."""

from __future__ import annotations

from django import forms

from memory_app.models import ScoreKind
from memory_app.models.scores import CATEGORY_CHARS, COMMENT_CHARS, NAME_CHARS
from memory_app.views.forms import DashboardForm, TextField, WholeNumberField

ACTIONS = ("score", "label", "unlabel", "comment", "unscore")


class ReviewForm(DashboardForm):
    """One change to what is said about a run or one of its steps (`step`, by id)."""

    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS])
    step = WholeNumberField(minimum=1)
    name = TextField(max_length=NAME_CHARS)
    kind = forms.ChoiceField(choices=ScoreKind.choices, required=False)
    value = TextField(max_length=CATEGORY_CHARS)
    text = TextField(max_length=COMMENT_CHARS, strip=False)
    score = WholeNumberField(minimum=1)

    def clean(self):
        data = super().clean()
        action = data.get("action")
        if action in ("score", "label", "unlabel") and not data.get("name"):
            self.add_error("name", "a name is needed")
        if action == "score" and not data.get("kind"):
            self.add_error("kind", "a score's kind is needed")
        if action == "unscore" and not data.get("score"):
            self.add_error("score", "which score")
        return data

    def score_value(self):
        """The typed value of a score as the dashboard sends it (text)."""
        kind, text = self.cleaned_data["kind"], self.cleaned_data["value"]
        if kind == ScoreKind.BOOLEAN:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise forms.ValidationError("a boolean score is true or false")
            return text.lower() in ("true", "1", "yes")
        if kind == ScoreKind.NUMERIC:
            try:
                return float(text)
            except ValueError:
                raise forms.ValidationError(f"a numeric score is a number, got {text!r}") from None
        return text


class QueueForm(DashboardForm):
    name = forms.CharField(max_length=200)
    filters = TextField(max_length=4000)
    score_name = forms.CharField(max_length=NAME_CHARS)
    score_kind = forms.ChoiceField(choices=ScoreKind.choices)
    categories = TextField(max_length=9 * (CATEGORY_CHARS + 2))

    def clean_categories(self):
        return [line.strip() for line in self.cleaned_data["categories"].splitlines() if line]


class QueuePageForm(DashboardForm):
    cursor = TextField(max_length=500)


class QueueScoreForm(DashboardForm):
    """A digit key pressed on a run of the queue (and the comment typed with it)."""

    run = WholeNumberField(minimum=1, required=True)
    key = forms.RegexField(regex=r"^[0-9]$", error_messages={"invalid": "a digit key, 0 to 9"})
    comment = TextField(max_length=COMMENT_CHARS, strip=False)
    cursor = TextField(max_length=500)
