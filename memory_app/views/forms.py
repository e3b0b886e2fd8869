"""Every input of the dashboard: query-string filters and POST bodies, one form per view.

Views validate with a form and hand its cleaned values to the domain; a form's errors are
rendered by the templates (`memory_app/form_errors.html`), in the panel that asked or, for input
with no form on screen, on the 400 page (`common.invalid_form`). Text fields refuse NUL
(PostgreSQL text cannot hold it): Django's CharField carries ProhibitNullCharactersValidator.
"""

from __future__ import annotations

import json
from datetime import UTC

from django import forms
from django.core.exceptions import ValidationError

from memory_app.errors import Invalid
from memory_app.models import MessageRole, RunStatus
from memory_app.queries.dashboard import (
    CONTEXT_ORDERS,
    MAX_QUERY_CHARS,
    BadQuery,
    HistoryFilters,
    parse_key_chips,
)
from memory_app.queries.runs_table import ORDERS as RUN_ORDERS
from memory_app.queries.runs_table import RunFilters
from memory_app.queries.search_all import KINDS as SEARCH_KINDS
from memory_app.schemas.fields import INT64_MAX
from memory_app.services.curation import PruneFilter

# --- fields ------------------------------------------------------------------------------------


class WholeNumberField(forms.IntegerField):
    default_error_messages = {"min_value": "must be at least %(limit_value)s"}

    def __init__(self, *, minimum: int = 0, **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(min_value=minimum, **kwargs)

    def to_python(self, value):
        try:
            return super().to_python(value)
        except ValidationError:
            raise ValidationError(
                f"must be a whole number, got {value!r}", code="invalid"
            ) from None


class MomentField(forms.DateTimeField):
    """A date and time as the browser's datetime-local input sends it (ISO 8601, an offset
    optional); a naive one is in the server's time zone."""

    default_error_messages = {"invalid": "must be a date and time like 2025-01-31T14:00"}

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def to_python(self, value):
        # PostgreSQL takes offsets up to ±15:59 where Python takes ±23:59: compare the instant
        # in UTC, and refuse one beyond the calendar's ends.
        moment = super().to_python(value)
        try:
            return None if moment is None else moment.astimezone(UTC)
        except OverflowError:
            raise ValidationError("the date and time is out of range", code="invalid") from None


class TextField(forms.CharField):
    """Optional text, stripped; `missing` is the value when the parameter is absent altogether
    (an empty one stays empty)."""

    def __init__(self, *, missing: str = "", **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)
        self.missing = missing

    def to_python(self, value):
        if value is None:
            return self.missing
        return super().to_python(value)


class FlagField(forms.Field):
    """`1` is on, anything else off; absent is `missing` (a form posted without the field)."""

    def __init__(self, *, missing: bool = False, **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)
        self.missing = missing

    def to_python(self, value):
        return self.missing if value is None else value == "1"


class ListField(forms.Field):
    """A repeated parameter (`?key=a&key=b`), each value cleaned by `item`."""

    widget = forms.MultipleHiddenInput

    def __init__(self, *, item: forms.Field, **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)
        self.item = item

    def to_python(self, value):
        if value in (None, ""):
            return []
        values = value if isinstance(value, list | tuple) else [value]
        return [self.item.clean(v) for v in values]


def role_field() -> forms.ChoiceField:
    return forms.ChoiceField(
        choices=[("", "any"), *MessageRole.choices],
        required=False,
        error_messages={"invalid_choice": f"must be one of {MessageRole.values}, got %(value)r"},
    )


def _chips(values: list[str]) -> list[tuple[str, str]]:
    try:
        return parse_key_chips(values)
    except BadQuery as exc:
        raise ValidationError(str(exc)) from exc


def _json_object(raw: str, message: str) -> dict:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValidationError(f"{message}: {exc}") from exc
    if not isinstance(value, dict):
        raise ValidationError(message)
    return value


def _lenient_id(raw: str) -> int | None:
    # A link's `done=` notice is a courtesy: a stale or mangled one shows no notice, not an error.
    return int(raw) if raw and raw.isdigit() else None


# --- forms -------------------------------------------------------------------------------------


class DashboardForm(forms.Form):
    """A form whose fields are named, and labelled, as their parameters."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, field in self.fields.items():
            if field.label is None:
                field.label = name.replace("_", " ")

    def typed(self, names=None) -> dict:
        """What was sent for each field (stripped), to fill the form in again."""
        out = {}
        for name in names or self.fields:
            value = self[name].value()
            if isinstance(value, list | tuple):
                out[name] = list(value)
            else:
                out[name] = "" if value is None else str(value).strip()
        return out


class KeyChipsForm(DashboardForm):
    """A set of key=value chips (`key`, repeated) and the chip input adding one more (`add`)."""

    key = ListField(item=forms.CharField(required=False, strip=False))
    # The chip input: one more key=value added to the current set.
    add = TextField()

    def clean_key(self):
        return _chips(self.cleaned_data["key"])

    def clean_add(self):
        added = self.cleaned_data["add"]
        return _chips([added]) if added else []


class ContextListForm(KeyChipsForm):
    q = TextField(label="search text")
    sort = forms.ChoiceField(
        choices=list(CONTEXT_ORDERS.items()),
        required=False,
        error_messages={"invalid_choice": f"must be one of {sorted(CONTEXT_ORDERS)}"},
    )
    cursor = TextField()

    def clean_sort(self):
        return self.cleaned_data["sort"] or "recent"


class HistoryForm(DashboardForm):
    role = role_field()
    tag = TextField(max_length=200)
    q = TextField(label="filter text", max_length=MAX_QUERY_CHARS)
    pruned = FlagField()
    md = FlagField()
    before = WholeNumberField(minimum=1)
    after = WholeNumberField(minimum=0)
    seq = WholeNumberField(minimum=1)

    def filters(self) -> HistoryFilters:
        data = self.cleaned_data
        return HistoryFilters(
            role=data["role"], tag=data["tag"], text=data["q"], show_pruned=data["pruned"]
        )


class AmountField(forms.FloatField):
    """An optional amount of at least 0 (seconds, dollars)."""

    default_error_messages = {"min_value": "must be at least %(limit_value)s"}

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(min_value=0, **kwargs)

    def to_python(self, value):
        try:
            return super().to_python(value)
        except ValidationError:
            raise ValidationError(f"must be a number, got {value!r}", code="invalid") from None


class RunTableForm(KeyChipsForm):
    """The runs table's filters, order and page: every one in the URL, so a view can be shared."""

    status = forms.MultipleChoiceField(
        choices=RunStatus.choices,
        required=False,
        error_messages={"invalid_choice": f"must be among {RunStatus.values}, got %(value)s"},
    )
    has_error = FlagField(label="has errors")
    error = TextField(label="error text", max_length=MAX_QUERY_CHARS)
    model = TextField(max_length=200)
    started_after = MomentField(label="started from")
    started_before = MomentField(label="started before")
    min_duration = AmountField(label="min duration (s)")
    min_cost = AmountField(label="min cost (USD)")
    score = TextField(label="score name", max_length=100)
    score_value = TextField(label="score value", max_length=200)
    score_min = forms.FloatField(label="score at least", required=False)
    score_max = forms.FloatField(label="score at most", required=False)
    label = TextField(max_length=100)
    sort = forms.ChoiceField(
        choices=[(name, label) for name, (label, _, _) in RUN_ORDERS.items()],
        required=False,
        error_messages={"invalid_choice": f"must be one of {sorted(RUN_ORDERS)}"},
    )
    cursor = TextField()

    def clean_sort(self):
        return self.cleaned_data["sort"] or "started"

    def filters(self) -> RunFilters:
        data = self.cleaned_data
        return RunFilters(
            statuses=data["status"],
            has_error=data["has_error"],
            error=data["error"],
            model=data["model"],
            keys=data["key"] + data["add"],
            started_after=data["started_after"],
            started_before=data["started_before"],
            min_duration=data["min_duration"],
            min_cost=data["min_cost"],
            score=data["score"],
            score_value=data["score_value"],
            score_min=data["score_min"],
            score_max=data["score_max"],
            label=data["label"],
        )


class RunCompareForm(DashboardForm):
    """Two runs to compare: `a` (the baseline) and `b`, or `run` twice (the runs table's
    checkboxes, in any order)."""

    a = WholeNumberField(minimum=1, max_value=INT64_MAX)
    b = WholeNumberField(minimum=1, max_value=INT64_MAX)
    run = ListField(item=WholeNumberField(minimum=1, max_value=INT64_MAX))

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        picked = sorted({pk for pk in data["run"] if pk is not None})
        if data["run"]:
            data["run"] = picked
            if len(picked) != 2:
                raise ValidationError(f"pick exactly two runs to compare, got {len(picked)}")
        elif data["a"] is None or data["b"] is None:
            raise ValidationError("name the two runs to compare: a (the baseline) and b")
        elif data["a"] == data["b"]:
            raise ValidationError("pick two different runs to compare")
        return data


class SearchAllForm(KeyChipsForm):
    """The search page's query, kinds and page: every one in the URL, so a search can be shared.
    An empty query is the page's empty state, not an error."""

    q = TextField(label="search text", max_length=MAX_QUERY_CHARS)
    kind = forms.MultipleChoiceField(
        choices=list(SEARCH_KINDS.items()),
        required=False,
        error_messages={"invalid_choice": f"must be among {list(SEARCH_KINDS)}, got %(value)s"},
    )
    cursor = TextField()


class RunsPageForm(DashboardForm):
    before = WholeNumberField(minimum=1)


class MessagePruneForm(DashboardForm):
    pruned = FlagField(missing=True)
    md = FlagField()


class PrunedForm(DashboardForm):
    pruned = FlagField(missing=True)


class RunLiveForm(DashboardForm):
    after = WholeNumberField(minimum=0)
    position = WholeNumberField(minimum=1)
    # The ids of the step on screen and of the step at `after`, when the page knows them.
    step = WholeNumberField(minimum=1)
    last = WholeNumberField(minimum=1)
    tail = FlagField()
    # The page draws the timeline a step at a time (app.js): the poll sends the new steps' bars.
    tl = FlagField()


class StepDetailForm(DashboardForm):
    # A page loads a step's details by id, so they stay right when steps are renumbered.
    step = WholeNumberField(minimum=1)


class MemoryListForm(DashboardForm):
    q = TextField(label="search")
    context = WholeNumberField(minimum=1)
    scope = TextField()
    archived = FlagField()
    id = WholeNumberField(minimum=1)

    def clean_scope(self) -> dict | None:
        raw = self.cleaned_data["scope"]
        if not raw:
            return None
        if raw.startswith("{"):
            return _json_object(
                raw, 'the scope must be a JSON object like {"user": "ada"} or key=value'
            )
        return dict(_chips(raw.split()))


class MemoryEditForm(DashboardForm):
    content = forms.CharField(required=False, strip=False)
    keywords = TextField()
    kind = TextField()

    def clean_keywords(self) -> list[str]:
        return [k.strip() for k in self.cleaned_data["keywords"].split(",") if k.strip()]


class ArchiveForm(DashboardForm):
    archived = FlagField(missing=True)


class VersionForm(DashboardForm):
    version = WholeNumberField(minimum=1, required=True)


class MemoryMergeForm(DashboardForm):
    ids = ListField(item=WholeNumberField(minimum=1, required=True))
    keep = WholeNumberField(minimum=1)

    def clean(self):
        data = super().clean()
        if "ids" in self.errors or "keep" in self.errors:
            return data
        data["keep"] = data["keep"] or (min(data["ids"]) if data["ids"] else None)
        if data["keep"] is None:
            raise ValidationError("select the memories to merge")
        return data


class MemoryPurgeForm(DashboardForm):
    confirmation = forms.CharField(required=False, strip=False)


class PromoteForm(DashboardForm):
    kind = TextField(missing="fact")


class CurateHistoryForm(DashboardForm):
    view = TextField()
    before = WholeNumberField(minimum=1)
    done = TextField()

    def clean_view(self) -> str:
        return "pruned" if self.cleaned_data["view"] == "pruned" else "live"

    def clean_done(self) -> int | None:
        return _lenient_id(self.cleaned_data["done"])


class CurateRunForm(DashboardForm):
    after = WholeNumberField(minimum=0)
    done = TextField()

    def clean_done(self) -> int | None:
        return _lenient_id(self.cleaned_data["done"])


class SelectionForm(DashboardForm):
    """The ticked rows of a curate list, pruned or restored together."""

    noun = "message"
    ids = ListField(item=WholeNumberField(minimum=0, required=True))
    pruned = FlagField(missing=True)
    view = TextField()

    def clean(self):
        data = super().clean()
        if "ids" not in self.errors and not data.get("ids"):
            raise ValidationError(f"select at least one {self.noun}")
        return data


class StepSelectionForm(SelectionForm):
    noun = "step"


class MessageEditForm(DashboardForm):
    text = forms.CharField(required=False, strip=False)
    tags = TextField()

    def clean_tags(self) -> list[str]:
        tags = [t.strip() for t in self.cleaned_data["tags"].split(",") if t.strip()]
        if any(len(t) > 200 for t in tags):
            raise ValidationError("a tag is longer than 200 characters")
        return tags


# The fields of a bulk-prune filter, carried from the preview to the apply form.
PRUNE_FILTER_FIELDS = (
    "role",
    "tag",
    "text",
    "before_seq",
    "after_seq",
    "before_time",
    "after_time",
    "run",
)


class PruneFilterForm(DashboardForm):
    role = role_field()
    tag = TextField()
    text = TextField()
    before_seq = WholeNumberField(minimum=1)
    after_seq = WholeNumberField(minimum=0)
    before_time = MomentField()
    after_time = MomentField()
    run = WholeNumberField(minimum=1)

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            data["filter"] = PruneFilter(
                role=data["role"],
                tag=data["tag"],
                text=data["text"],
                before_seq=data["before_seq"],
                after_seq=data["after_seq"],
                before_time=data["before_time"],
                after_time=data["after_time"],
                run_id=data["run"],
            )
        except Invalid as exc:
            raise ValidationError(str(exc)) from exc
        return data

    def filter_params(self) -> dict:
        return self.typed(PRUNE_FILTER_FIELDS)


class PruneApplyForm(PruneFilterForm):
    # What the preview showed: the apply refuses if the set changed since.
    upto_seq = WholeNumberField(minimum=0)
    expected_count = WholeNumberField(minimum=0)

    def clean(self):
        data = super().clean()
        if not self.errors and (data["upto_seq"] is None or data["expected_count"] is None):
            raise ValidationError(
                "preview the filter first (upto_seq and expected_count are missing)"
            )
        return data


class AuditFilterForm(DashboardForm):
    actor = TextField()
    action = TextField()
    target = TextField()
    target_id = WholeNumberField(minimum=1)
    context = WholeNumberField(minimum=1)
    since = MomentField()
    until = MomentField()
    before = WholeNumberField(minimum=1)

    # What the older-events link carries on (`before` is the link's own).
    FILTERS = ("actor", "action", "target", "target_id", "context", "since", "until")


class UndoForm(DashboardForm):
    next = TextField(strip=False)


class PurgeForm(DashboardForm):
    older_than = MomentField()
    context = WholeNumberField(minimum=1)
    confirmation = forms.CharField(required=False, strip=False)


class ApiKeyForm(DashboardForm):
    name = TextField(strip=False)
    scopes = ListField(item=forms.CharField(required=False))
    context_keys = TextField(label="context-key restriction")
    memory_review = TextField(missing="live", label="memory review")

    def clean_context_keys(self) -> dict:
        raw = self.cleaned_data["context_keys"]
        if not raw:
            return {}
        return _json_object(
            raw, 'the context-key restriction must be a JSON object like {"tenant": "acme"}'
        )


class KeyReviewForm(DashboardForm):
    memory_review = TextField(label="memory review")


class InboxDecideForm(DashboardForm):
    ids = ListField(item=WholeNumberField(minimum=1, required=True))
    action = forms.ChoiceField(choices=[("approve", "approve"), ("reject", "reject")])
    note = TextField()


class InboxMergeForm(DashboardForm):
    proposal = WholeNumberField(minimum=1, required=True)
    into = WholeNumberField(minimum=1, required=True)


class EmbeddingModelForm(DashboardForm):
    name = forms.CharField(max_length=200, label="model name")
    dimensions = WholeNumberField(minimum=1, required=True, max_value=16_000)


class PlaygroundForm(DashboardForm):
    """One side of the playground. Side B's fields are prefixed `b_` and default to side A's."""

    selector = TextField(strip=False)
    k = TextField(strip=False)
    semantics = TextField(strip=False)
    max_tokens = TextField(strip=False)
    policy = TextField(strip=False)
    tokenizer = TextField(strip=False)
    query = TextField(strip=False)
    mode = TextField(strip=False)
    search_k = TextField(strip=False)
    search_mode = TextField(strip=False)
    window = TextField(strip=False)
    compare = FlagField()

    def __init__(self, data, *, defaults: dict[str, str], prefix: str | None = None):
        super().__init__(data, prefix=prefix)
        for name, value in defaults.items():
            self.fields[name].missing = value

    def add_prefix(self, field_name: str) -> str:
        return f"{self.prefix}_{field_name}" if self.prefix else field_name

    def params(self) -> dict[str, str]:
        """The selector's settings as strings: cleaned when valid, as sent otherwise."""
        names = [n for n in self.fields if n != "compare"]
        if self.is_valid():
            return {n: self.cleaned_data[n] for n in names}
        return {n: self[n].value() or "" for n in names}
