from django.conf import settings

from memory_app import db
from memory_app.views.errors import database_unavailable

# Agent-written content is untrusted: no inline script, no outside hosts, no plugins.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'self'; "
    "form-action 'self'; frame-ancestors 'none'"
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.policy = getattr(settings, "CONTENT_SECURITY_POLICY", CONTENT_SECURITY_POLICY)

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", self.policy)
        return response


class DatabaseUnavailableMiddleware:
    """A database fault raised by any view or page (not only the API's, which its own handler
    answers) is a 503 with Retry-After: the styled page on the dashboard, JSON elsewhere."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if db.is_database_fault(exception):
            return database_unavailable(request, exception)
        return None
