"""API keys (admin): create with scopes and a context-key restriction, secret shown once, revoke."""

from __future__ import annotations

import json

from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_http_methods, require_POST

from memory_app.audit import Actor
from memory_app.errors import Invalid
from memory_app.models import ApiKey
from memory_app.roles import require
from memory_app.services import curation
from memory_app.views.common import render_page, wants_fragment


def _page(**extra) -> dict:
    keys = ApiKey.objects.select_related("created_by").order_by("revoked_at", "-created_at")[:200]
    return {"keys": keys, "scopes": ApiKey.SCOPES, "nav_active": "keys", **extra}


def _context_keys(raw: str) -> dict:
    raw = (raw or "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise Invalid(
            f'the context-key restriction must be a JSON object like {{"tenant": "acme"}}: {exc}'
        ) from exc
    if not isinstance(value, dict):
        raise Invalid('the context-key restriction must be a JSON object like {"tenant": "acme"}')
    return value


@require("keys")
@require_http_methods(["GET", "POST"])
def keys(request):
    if request.method == "GET":
        return render_page(request, "memory_app/curate/keys.html", _page(), fragment="keys-panel")
    form = {
        "name": request.POST.get("name", ""),
        "scopes": request.POST.getlist("scopes"),
        "context_keys": request.POST.get("context_keys", ""),
    }
    try:
        issued = curation.apikey_issue(
            name=form["name"],
            scopes=form["scopes"],
            context_keys=_context_keys(form["context_keys"]),
            actor=Actor.for_user(request.user),
        )
    except Invalid as exc:
        return render_page(
            request,
            "memory_app/curate/keys.html",
            _page(error=str(exc), form=form),
            fragment="keys-panel",
            status=400,
        )
    # The secret goes into this one response only (never into a redirect URL or the session).
    return render_page(
        request, "memory_app/curate/keys.html", _page(issued=issued), fragment="keys-panel"
    )


@require("keys")
@require_POST
def key_revoke(request, key_id: int):
    key = get_object_or_404(ApiKey, pk=key_id)
    curation.apikey_withdraw(key=key, actor=Actor.for_user(request.user))
    if not wants_fragment(request):
        return redirect("keys")
    return render_page(request, "memory_app/curate/keys.html", _page(), fragment="keys-panel")
