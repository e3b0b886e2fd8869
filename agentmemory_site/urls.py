from django.contrib import admin
from django.urls import include, path

from memory_app.api.app import api
from memory_app.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    # Agent API: /api/v1/..., /api/openapi.json, /api/docs (see memory_app/api/__init__.py).
    path("api/", api.urls),
    # Login and logout live in memory_app.urls (no e-mail password reset: nothing to send it with).
    path("", include("memory_app.urls")),
]

# Styled error pages; under htmx the message goes to the page's #flash region (views/errors.py).
handler400 = "memory_app.views.errors.bad_request"
handler403 = "memory_app.views.errors.permission_denied"
handler404 = "memory_app.views.errors.page_not_found"
handler500 = "memory_app.views.errors.server_error"
