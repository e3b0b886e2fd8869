"""The Agent API (django-ninja), mounted at `/api/`: endpoints under `/api/v1/`, the schema at
`/api/openapi.json`, Swagger UI at `/api/docs` (served from django-ninja's bundled static files
through whitenoise: no CDN).

Layout:
  app.py       the `NinjaAPI` instance `api`, JSON parser/renderer, domain-error -> HTTP mapping,
               and the list of routers
  common.py    auth (`api_key_auth`), `require_scope`, `context_for` / `run_for` / `message_for` /
               `step_for` (404 for unknown or other-tenant ids), `actor_for` (audit actor),
               field types (`Text`, `Short(n)`, `JsonValue`, `JsonObject`, `Id`, ...), `ErrorOut`,
               `responses()`
  schemas.py   input (`...In`) and output (`...Out`) schemas, explicit fields
  contexts.py, messages.py, runs.py   one router per area

Adding a router (e.g. `memories.py`):

    from ninja import Router
    from memory_app.api.common import context_for, require_scope, responses, WRITE_ERRORS

    router = Router(tags=["memories"])

    @router.post("/contexts/{context_id}/select", response=responses({200: SelectOut}))
    def select(request, context_id: int, body: SelectIn):
        require_scope(request, "read")               # 403 without the scope
        context = context_for(request, context_id)   # 404 when unknown or outside the key
        return 200, selectors.select(context=context, ...)

then register it in `app.py` with `api.add_router("/v1/", memories.router)`. Authentication is
global (every operation needs a key); `request.auth` is the `ApiKey`. Raise
`memory_app.errors` (NotFound, Conflict, Invalid, ...) or `ninja.errors.HttpError` for errors;
they become `{"detail": ...}` with 404/409/422 or the given status. Document errors with
`responses()` so the schema (and the schemathesis fuzz test) knows them, and give schemas examples.
"""
