from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic.base import RedirectView

from memory_app.api.app import api
from memory_app.health import healthz

api_urls = api.urls  # built once: ninja registers its namespace when they are built


def _api_view(url_name: str):
    """The view of one Agent API operation (auth, limits and answers included)."""
    return next(p.callback for p in api_urls[0] if getattr(p, "name", None) == url_name)


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # Browsers ask for /favicon.ico on pages that name no icon (JSON answers, the API docs).
    path("favicon.ico", RedirectView.as_view(url=static("memory_app/favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    # Agent API: /api/v1/..., /api/openapi.json, /api/docs (see memory_app/api/__init__.py).
    path("api/", api_urls),
    # OTLP/HTTP at its standard path: exporters given OTEL_EXPORTER_OTLP_ENDPOINT=<server> post to
    # <server>/v1/traces (and /v1/logs). The same operations as POST /api/v1/traces and /logs.
    path("v1/traces", _api_view("traces_export"), name="otlp-traces"),
    path("v1/logs", _api_view("logs_export"), name="otlp-logs"),
    # Login and logout live in memory_app.urls (no e-mail password reset: nothing to send it with).
    path("", include("memory_app.urls")),
]

# Styled error pages; under htmx the message goes to the page's #flash region (views/errors.py).
handler400 = "memory_app.views.errors.bad_request"
handler403 = "memory_app.views.errors.permission_denied"
handler404 = "memory_app.views.errors.page_not_found"
handler500 = "memory_app.views.errors.server_error"
