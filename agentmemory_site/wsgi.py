import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentmemory_site.settings")
application = get_wsgi_application()

from agentmemory_site.embedded_postgres.base import start_embedded_database  # noqa: E402

# The process serving this app holds the embedded server (no DATABASE_URL), before gunicorn
# forks its workers under --preload; with DATABASE_URL this does nothing.
start_embedded_database()
