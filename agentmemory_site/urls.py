from django.contrib import admin
from django.urls import include, path

from memory_app.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("memory_app.urls")),
]
