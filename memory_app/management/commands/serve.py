"""`manage.py serve` (what `make run` calls): set up and serve the product with gunicorn.

This process holds the embedded database for the server's whole life: it migrates, creates an
operator account when none exists, loads the demo data once, then runs gunicorn as a child and
waits. Ctrl-C stops gunicorn, and when this process exits `pgserver` stops PostgreSQL cleanly
(the last process holding it stops it).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from memory_app.models import Context


def ensure_operator(*, username: str, password: str | None) -> tuple[str, str | None]:
    """Create a superuser when no user exists; returns (username, password shown once or None)."""
    User = get_user_model()
    if User.objects.exists():
        return username, None
    generated = password or secrets.token_urlsafe(12)
    # A superuser holds every role's permissions (viewer, curator, admin).
    User.objects.create_superuser(username=username, email="", password=generated)
    return username, (None if password else generated)


class Command(BaseCommand):
    help = "Migrate, create the operator account and demo data once, and serve with gunicorn."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("AGENTMEMORY_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("AGENTMEMORY_PORT", "8000")))
        parser.add_argument("--workers", type=int, default=int(os.environ.get("AGENTMEMORY_WORKERS", "3")))
        parser.add_argument("--no-demo", action="store_true", help="do not load the demo data")

    def handle(self, *args, host, port, workers, no_demo, **options):
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("database migrated")
        username = os.environ.get("AGENTMEMORY_OPERATOR_USERNAME", "operator")
        username, shown = ensure_operator(
            username=username, password=os.environ.get("AGENTMEMORY_OPERATOR_PASSWORD") or None
        )
        if not no_demo and not Context.objects.filter(keys__demo=True).exists():
            call_command("seed_demo")

        url = f"http://{host}:{port}/"
        self.stdout.write(self.style.SUCCESS(f"\nagentmemory is serving on {url}"))
        if shown:
            self.stdout.write(self.style.WARNING(f"operator login: {username} / {shown}  (shown once; change it in /admin/)"))
        else:
            self.stdout.write(f"operator login: your existing account (created as {username!r} on first run)")
        self.stdout.write(f"database: {'embedded PostgreSQL under ' + str(settings.DATA_DIR) if settings.EMBEDDED_DATABASE else 'DATABASE_URL'}")
        self.stdout.write("Ctrl-C stops the server and the database.\n")
        sys.stdout.flush()

        cmd = [
            sys.executable, "-m", "gunicorn", "agentmemory_site.wsgi:application",
            "--bind", f"{host}:{port}", "--workers", str(workers),
            "--access-logfile", "-", "--graceful-timeout", "10", "--timeout", "60",
        ]
        proc = subprocess.Popen(cmd)
        try:
            proc.wait()
        except KeyboardInterrupt:
            # The terminal delivers Ctrl-C to gunicorn too; make sure it ends before the DB stops.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
            self.stdout.write("\nserver stopped; stopping the database")
