"""API keys (admin): create with scopes, a context-key restriction and a memory review policy,
secret shown once, set the review policy, revoke; and the embedding models agents may send
vectors under (admin): list, register."""

from __future__ import annotations

from django.shortcuts import get_object_or_404, redirect
from django.utils.cache import patch_cache_control
from django.views.decorators.http import require_http_methods, require_POST

from memory_app.audit import Actor
from memory_app.embeddings.registry import registered_models
from memory_app.errors import DomainError, Invalid
from memory_app.models import ApiKey
from memory_app.roles import require
from memory_app.services import apikeys
from memory_app.services.embedding_models import embedding_model_register
from memory_app.views.common import bad_request, htmx_partial, invalid_form, page, wants_fragment
from memory_app.views.forms import ApiKeyForm, EmbeddingModelForm, KeyReviewForm

KEYS = "memory_app/curate/keys.html"


def _page(**extra) -> dict:
    keys = ApiKey.objects.select_related("created_by").order_by("revoked_at", "-created_at")[:200]
    return {
        "keys": keys,
        "scopes": ApiKey.SCOPES,
        "embedding_models": registered_models(),
        "nav_active": "keys",
        **extra,
    }


@require("keys")
@require_http_methods(["GET", "POST"])
@htmx_partial("keys-panel")
def keys(request):
    if request.method == "GET":
        return page(request, KEYS, _page())
    form = ApiKeyForm(request.POST)
    if form.is_valid():
        try:
            issued = apikeys.apikey_issue(
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                context_keys=form.cleaned_data["context_keys"],
                actor=Actor.for_user(request.user),
                memory_review=form.cleaned_data["memory_review"] or "live",
            )
        except Invalid as exc:
            form.add_error(None, str(exc))
    if form.errors:
        # Back in its panel with the reason, and with what was typed.
        return page(request, KEYS, _page(form=form), status=400)
    # The secret goes into this one response only (never into a redirect URL or the session),
    # and no cache (the browser's back/forward or disk cache, a proxy) keeps a copy of it.
    response = page(request, KEYS, _page(issued=issued))
    patch_cache_control(response, no_store=True)
    return response


@require("keys")
@require_POST
@htmx_partial("keys-panel")
def key_revoke(request, key_id: int):
    key = get_object_or_404(ApiKey, pk=key_id)
    apikeys.apikey_withdraw(key=key, actor=Actor.for_user(request.user))
    if not wants_fragment(request):
        return redirect("keys")
    return page(request, KEYS, _page())


@require("keys")
@require_POST
@htmx_partial("keys-panel")
def key_review(request, key_id: int):
    """Whether the memories a key records are live at once or proposed for review."""
    key = get_object_or_404(ApiKey, pk=key_id)
    form = KeyReviewForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    try:
        apikeys.apikey_set_review(
            key=key,
            memory_review=form.cleaned_data["memory_review"],
            actor=Actor.for_user(request.user),
        )
    except Invalid as exc:
        return bad_request(request, exc)
    if not wants_fragment(request):
        return redirect("keys")
    return page(request, KEYS, _page())


@require("keys")
@require_POST
def embedding_model_add(request):
    """Register an embedding model (name and dimensions) on the keys page; a refusal comes back
    on that page with the reason."""
    model_form = EmbeddingModelForm(request.POST)
    if model_form.is_valid():
        try:
            embedding_model_register(
                name=model_form.cleaned_data["name"],
                dimensions=model_form.cleaned_data["dimensions"],
                actor=Actor.for_user(request.user),
            )
        except DomainError as exc:
            model_form.add_error(None, str(exc))
    if model_form.errors:
        return page(request, KEYS, _page(model_form=model_form), status=400)
    return redirect("keys")
