from django.conf import settings

from memory_app.embeddings.providers import describe_active


def runtime(request):
    """What the dashboard header shows: which database and embedding provider are active."""
    db = settings.DATABASES["default"]
    database = (
        "embedded PostgreSQL"
        if settings.EMBEDDED_DATABASE
        else f"PostgreSQL {db.get('HOST') or 'local'}/{db.get('NAME')}"
    )
    return {
        "runtime_database": database,
        "runtime_embedding_provider": describe_active(),
    }
