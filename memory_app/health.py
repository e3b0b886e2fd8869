"""`/healthz`: 200 when the database answers, 503 when it does not."""

from django.db import DatabaseError, connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET


@never_cache
@require_GET
def healthz(request):
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            row = cursor.fetchone()
    except DatabaseError as exc:
        # A dead connection stays dead in this worker; drop it so the next probe reconnects.
        connection.close_if_unusable_or_obsolete()
        return JsonResponse({"status": "error", "database": "unavailable", "detail": str(exc).strip()[:200]}, status=503)
    return JsonResponse({"status": "ok", "database": "ok", "pgvector": row[0] if row else None})
