from django.conf import settings

from memory_app import db, replica
from memory_app.url_prefixes import API_PREFIXES
from memory_app.views.common import error_response
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


class ReplicaPositionMiddleware:
    """Read-your-writes with a read replica (memory_app/replica.py): a write's response names
    the primary's WAL position (`X-Agentmemory-LSN`; for the dashboard also a cookie, dropped
    once the replica has replayed it), and a request that sends it back reads from the replica
    only once the replica has replayed that far. Nothing happens without a replica."""

    SAFE_METHODS = ("GET", "HEAD", "OPTIONS")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not replica.configured():
            return self.get_response(request)
        sent = request.headers.get(replica.LSN_HEADER, "").strip()
        if sent and not replica.LSN_FORMAT.fullmatch(sent):
            return error_response(
                request,
                400,
                f"{replica.LSN_HEADER} must be a WAL position as this server sent it "
                "(such as 0/16B3748)",
            )
        cookie = request.COOKIES.get(replica.LSN_COOKIE, "")
        lsn = sent or (cookie if replica.LSN_FORMAT.fullmatch(cookie) else "")
        position = replica.Position(lsn) if lsn else None
        with replica.reads_after(position):
            response = self.get_response(request)
        if request.method not in self.SAFE_METHODS:
            written = replica.written_position()
            if written:
                response[replica.LSN_HEADER] = written
                if not request.path.startswith(API_PREFIXES):
                    response.set_cookie(
                        replica.LSN_COOKIE,
                        written,
                        httponly=True,
                        samesite="Lax",
                        secure=settings.SESSION_COOKIE_SECURE,
                    )
        elif cookie and not sent and position is not None and position.replayed:
            response.delete_cookie(replica.LSN_COOKIE, samesite="Lax")
        return response
