"""Selector playground: try a selector on a context, compare two settings, copy the API call.

It calls `memory_app.selectors.select`, the function behind `POST /api/v1/contexts/{id}/select`,
so what the playground shows is what an agent gets. It stays cheap on long histories: one
context lookup and the selector's own bounded reads, nothing else (no counts, no tag lists).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_GET

from memory_app import errors, selectors, tokens
from memory_app.errors import Invalid
from memory_app.models import Context
from memory_app.roles import require
from memory_app.selectors import CompositeSpec, SearchSpec, TokenWindowSpec, WindowSpec
from memory_app.views.common import htmx_partial, page, replica_page
from memory_app.views.forms import PlaygroundForm

# The environment variable the copied snippets read the API key from.
API_KEY_VARIABLE = "AGENTMEMORY_API_KEY"
SELECTORS = ("window", "token_window", "search", "composite")
DEFAULTS = {
    "selector": "window",
    "k": "10",
    "semantics": "plain",
    "max_tokens": "1000",
    "policy": "contiguous",
    "tokenizer": "",
    "query": "",
    "mode": "auto",
    "search_k": "3",
    "search_mode": "auto",
    "window": "window",
}


def _int(params: dict, name: str) -> int:
    raw = str(params.get(name, "")).strip()
    try:
        return int(raw)
    except ValueError as exc:
        raise Invalid(f"{name} must be a whole number, got {raw!r}") from exc


def spec_from_params(params: dict) -> selectors.SelectorSpec:
    """A selector spec from the playground's flat form fields (strings)."""
    kind = params.get("selector") or "window"
    if kind == "window":
        return WindowSpec(k=_int(params, "k"), semantics=params.get("semantics") or "plain")
    if kind == "token_window":
        return TokenWindowSpec(
            max_tokens=_int(params, "max_tokens"),
            policy=params.get("policy") or "contiguous",
            tokenizer=params.get("tokenizer") or None,
            semantics=params.get("semantics") or "plain",
        )
    if kind == "search":
        query = (params.get("query") or "").strip()
        if not query:
            raise Invalid("type a query for the search selector")
        return SearchSpec(query=query, k=_int(params, "k"), mode=params.get("mode") or "auto")
    if kind == "composite":
        inner = {**params, "selector": params.get("window") or "window"}
        if inner["selector"] not in ("window", "token_window"):
            raise Invalid("the composite window must be window or token_window")
        return CompositeSpec(
            window=spec_from_params(inner),
            search_k=_int(params, "search_k"),
            search_mode=params.get("search_mode") or "auto",
        )
    raise Invalid(f"selector must be one of {list(SELECTORS)}")


def api_body(spec: selectors.SelectorSpec) -> dict:
    """The JSON body of `POST /api/v1/contexts/{id}/select` for this spec."""
    if isinstance(spec, WindowSpec):
        return {"selector": "window", "k": spec.k, "semantics": spec.semantics}
    if isinstance(spec, TokenWindowSpec):
        body = {
            "selector": "token_window",
            "max_tokens": spec.max_tokens,
            "policy": spec.policy,
            "semantics": spec.semantics,
        }
        if spec.tokenizer:
            body["tokenizer"] = spec.tokenizer
        return body
    if isinstance(spec, SearchSpec):
        return {"selector": "search", "query": spec.query, "k": spec.k, "mode": spec.mode}
    window = api_body(spec.window)
    window.pop("selector")
    window["kind"] = spec.window.kind
    return {
        "selector": "composite",
        "window": window,
        "search_k": spec.search_k,
        "search_mode": spec.search_mode,
    }


def _snippets(request, context: Context, body: dict) -> dict[str, str]:
    url = (
        request.build_absolute_uri(reverse("api:select", args=[context.pk]))
        if _has_select_route()
        else (request.build_absolute_uri("/api/v1/") + f"contexts/{context.pk}/select")
    )
    data = json.dumps(body)
    # The key header in double quotes: the shell must expand the variable (in single quotes the
    # server would get the literal text "$AGENTMEMORY_API_KEY" and answer 401).
    curl = (
        f"curl -X POST {shlex.quote(url)} \\\n"
        f'  -H "Authorization: Bearer ${API_KEY_VARIABLE}" \\\n'
        f"  -H 'Content-Type: application/json' \\\n  -d {shlex.quote(data)}"
    )
    base = request.build_absolute_uri("/")
    python = (
        "import os\nfrom memory_app.client import MemoryClient\n\n"
        f'client = MemoryClient({base!r}, api_key=os.environ["{API_KEY_VARIABLE}"])\n'
        f"selection = client.select({context.pk}, **{json.dumps(body, indent=4)})\n"
        'for item in selection["items"]:\n    print(item["reason"], item["message"]["text"])\n'
    )
    return {"curl": curl, "python": python}


def _has_select_route() -> bool:
    from django.urls import NoReverseMatch

    try:
        reverse("api:select", args=[1])
    except NoReverseMatch:
        return False
    return True


@dataclass
class Side:
    name: str
    form: PlaygroundForm
    params: dict
    selection: selectors.Selection | None = None
    snippets: dict | None = None

    @property
    def error(self) -> str:
        """The form's errors in one line; empty when the selector ran."""
        return " ".join(str(e) for errors in self.form.errors.values() for e in errors)


def _run(request, context: Context, name: str, form: PlaygroundForm) -> Side:
    """One side: the selection, or the form with the selector's refusal among its errors."""
    side = Side(name=name, form=form, params=form.params())
    if not form.is_valid():
        return side
    try:
        spec = spec_from_params(side.params)
        side.selection = selectors.select(context=context, spec=spec)
        side.snippets = _snippets(request, context, api_body(spec))
    except (Invalid, errors.UnknownTokenizer) as exc:
        form.add_error(None, str(exc))
    return side


# Bad parameters are shown beside the form (a 200): the page stays usable while typing.
@require("view")
@require_GET
@replica_page
@htmx_partial("playground-results")
def playground(request, context_id: int):
    # The counters too: a search reads last_seq, search_seq and message_count.
    context = get_object_or_404(
        Context.objects.only("id", "title", "keys", "last_seq", "search_seq", "message_count"),
        pk=context_id,
    )
    a_form = PlaygroundForm(request.GET, defaults=DEFAULTS)
    sides = [_run(request, context, "A", a_form)]
    a_params = sides[0].params
    compare = a_form.cleaned_data.get("compare", False)
    if compare:
        b_form = PlaygroundForm(request.GET, defaults=a_params, prefix="b")
        sides.append(_run(request, context, "B", b_form))
        a, b = sides
        if a.selection and b.selection:
            a_ids, b_ids = set(a.selection.ids), set(b.selection.ids)
            for side, other in ((a, b_ids), (b, a_ids)):
                side.only = {pk for pk in side.selection.ids if pk not in other}
    for side in sides:
        side.only = getattr(side, "only", set())
    context_vars = {
        "ctx": context,
        "sides": sides,
        "compare": compare,
        "a": a_params,
        "b": sides[1].params if compare else a_params,
        "selectors": SELECTORS,
        "tokenizers": tokens.available_tokenizers(),
        "nav_active": "contexts",
    }
    return page(request, "memory_app/curate/playground.html", context_vars)
