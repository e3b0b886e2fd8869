from django.urls import path

from memory_app.views import home

urlpatterns = [
    path("", home.index, name="home"),
]
