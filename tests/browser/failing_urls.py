"""The site's URLs plus one view that fails, so a browser test can see the real 500 page."""

from django.urls import path

from agentmemory_site import urls as site


def fail(request):
    raise RuntimeError("a bug in a view")


urlpatterns = [path("fail/", fail), *site.urlpatterns]
handler400 = site.handler400
handler403 = site.handler403
handler404 = site.handler404
handler500 = site.handler500
