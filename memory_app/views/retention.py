"""Expiry, retention and erasure in the dashboard: a memory's expiry date and pin, its legal
hold (admins only), the retention policies (admins), and erasure by key subset (admins, typed
confirmation, a receipt of counts per kind)."""

from __future__ import annotations

import json

from django import forms
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from memory_app.audit import Actor
from memory_app.errors import Conflict, Forbidden, Invalid
from memory_app.models import MemoryRecord, RetentionKind, RetentionPolicy
from memory_app.roles import require
from memory_app.services import erasure, retention
from memory_app.services.memory_expiry import (
    MAX_HOLD_REASON,
    memory_set_expiry,
    memory_set_legal_hold,
)
from memory_app.views.common import bad_request, invalid_form, page
from memory_app.views.forms import DashboardForm, FlagField, MomentField, TextField

RETENTION = "memory_app/curate/retention.html"
ERASURE = "memory_app/curate/erasure.html"


class ExpiryForm(DashboardForm):
    expires_at = MomentField()
    pinned = FlagField()


class LegalHoldForm(DashboardForm):
    reason = TextField(max_length=MAX_HOLD_REASON)


def _keys(raw: str) -> dict:
    """A key subset typed as JSON (`{"user": "ada"}`) or as `user=ada, chat=7`."""
    raw = (raw or "").strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("the keys must be a JSON object")
        return value
    pairs = [p.split("=", 1) for p in raw.split(",") if p.strip()]
    if any(len(p) != 2 or not p[0].strip() for p in pairs):
        raise forms.ValidationError('write the keys as {"user": "ada"} or user=ada')
    return {k.strip(): v.strip() for k, v in pairs}


class KeysField(TextField):
    def clean(self, value):
        return _keys(super().clean(value))


class PolicyForm(DashboardForm):
    name = TextField(max_length=200)
    scope_keys = KeysField()
    kind = forms.ChoiceField(choices=RetentionKind.choices)
    max_age_days = forms.IntegerField(min_value=1, max_value=retention.MAX_AGE_DAYS)
    enabled = FlagField()


class ErasureForm(DashboardForm):
    keys = KeysField()
    confirmation = TextField()


def _back(record: MemoryRecord):
    return redirect(reverse("memories") + f"?id={record.pk}")


@require("memories")
@require_POST
def memory_expiry(request, memory_id: int):
    """Set or clear a memory's expiry date (an empty date: never) and pin or unpin it."""
    record = get_object_or_404(MemoryRecord, pk=memory_id)
    form = ExpiryForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    try:
        memory_set_expiry(
            record=record,
            actor=Actor.for_user(request.user),
            expires_at=form.cleaned_data["expires_at"],
            pinned=form.cleaned_data["pinned"],
        )
    except (Invalid, Forbidden) as exc:
        return bad_request(request, exc)
    return _back(record)


@require("purge")
@require_POST
def memory_legal_hold(request, memory_id: int):
    """Hold a memory (a reason) or lift its hold (no reason): admins only, audited."""
    record = get_object_or_404(MemoryRecord, pk=memory_id)
    form = LegalHoldForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    try:
        memory_set_legal_hold(
            record=record, actor=Actor.for_user(request.user), reason=form.cleaned_data["reason"]
        )
    except Invalid as exc:
        return bad_request(request, exc)
    return _back(record)


def _policies_page(request, *, form=None, status=200, **extra):
    context = {
        "policies": list(RetentionPolicy.objects.order_by("pk")),
        "kinds": RetentionKind.values,
        "form": form,
        "expired": retention.expired_count(),
        "nav_active": "retention",
        **extra,
    }
    return page(request, RETENTION, context, status=status)


@require("purge")
@require_http_methods(["GET", "POST"])
def retention_policies(request):
    """The retention policies: list, add, change (`policy` names one), delete (`delete`)."""
    if request.method == "GET":
        return _policies_page(request)
    actor = Actor.for_user(request.user)
    policy = None
    if request.POST.get("policy"):
        policy = get_object_or_404(RetentionPolicy, pk=request.POST["policy"])
        if request.POST.get("delete") == "1":
            retention.policy_delete(actor=actor, policy=policy)
            return redirect(reverse("retention"))
    form = PolicyForm(request.POST)
    if form.is_valid():
        try:
            retention.policy_save(actor=actor, fields=form.cleaned_data, policy=policy)
        except Invalid as exc:
            form.add_error(None, str(exc))
    if form.errors:
        return _policies_page(request, form=form, status=400)
    return redirect(reverse("retention"))


@require("purge")
@require_http_methods(["GET", "POST"])
def erasure_page(request):
    """Count what erasing a key subset removes, then erase it with the typed phrase."""
    form = ErasureForm(request.POST if request.method == "POST" else request.GET)
    context = {"phrase": erasure.ERASE_CONFIRMATION, "nav_active": "erasure", "form": form}
    if not form.is_valid() or not form.cleaned_data["keys"]:
        status = 400 if request.method == "POST" else 200
        return page(request, ERASURE, context, status=status)
    keys = form.cleaned_data["keys"]
    context["keys_text"] = json.dumps(keys, ensure_ascii=False)
    try:
        if request.method == "GET":
            context["preview"] = erasure.erase_preview(keys=keys)
            return page(request, ERASURE, context)
        context["done"] = erasure.erase(
            keys=keys,
            confirmation=form.cleaned_data["confirmation"],
            actor=Actor.for_user(request.user),
        )
    except (Invalid, Conflict) as exc:
        context["error"] = str(exc)
        context["preview"] = None
        return page(request, ERASURE, context, status=409 if isinstance(exc, Conflict) else 400)
    return page(request, ERASURE, context)
