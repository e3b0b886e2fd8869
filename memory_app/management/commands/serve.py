"""`manage.py serve` (what `make run` calls): set up and serve the product with gunicorn.

This process holds the embedded database for the server's whole life: it migrates, creates an
operator account when none exists, loads the demo data once, then runs gunicorn as a child and
maps the OTLP exports its web workers queue while it waits (`SpanMapper`). Ctrl-C (SIGINT),
SIGTERM and SIGHUP all stop gunicorn first, then this process exits normally and the embedded
server stops PostgreSQL cleanly (the last process holding it stops it). A port already in use
is reported before anything is announced.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from agentmemory_site.gunicorn_hooks import skip_final_collection
from memory_app import backlog
from memory_app.models import Context
from memory_app.services import span_queue

log = logging.getLogger(__name__)


def ensure_operator(*, username: str, password: str | None) -> tuple[str, str | None]:
    """Create a superuser when no user exists; returns (username, password shown once or None)."""
    User = get_user_model()
    if User.objects.exists():
        return username, None
    if password:
        # The password validators of every other account apply to the operator's too.
        try:
            validate_password(password, user=User(username=username))
        except ValidationError as exc:
            raise CommandError(
                f"AGENTMEMORY_OPERATOR_PASSWORD is refused: {' '.join(exc.messages)}"
            ) from exc
    generated = password or secrets.token_urlsafe(12)
    # A superuser holds every role's permissions (viewer, curator, admin).
    User.objects.create_superuser(username=username, email="", password=generated)
    return username, (None if password else generated)


class StopRequested(Exception):
    """SIGTERM or SIGHUP arrived: stop like Ctrl-C does, so that exit handlers run."""


def _raise_stop(signum, frame):
    raise StopRequested(signal.Signals(signum).name)


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port (gunicorn would fail to bind)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def wait_until_listening(proc: subprocess.Popen, host: str, port: int, timeout: float = 60) -> bool:
    """Wait for gunicorn to accept connections; False when it exited or did not within timeout."""
    # A wildcard bind is reached through loopback.
    target = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection((target, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def _hold_data_folder(data_dir: Path):
    """An exclusive lock on the data folder for this process's life (released by the kernel
    when it dies, even by kill -9); a CommandError naming the holder when another serve has it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = open(data_dir / "serve.lock", "a+")  # noqa: SIM115 - held until serve ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise CommandError(
            f"another `manage.py serve` ({holder}) is already serving the data folder {data_dir};"
            " stop it first, or give this one its own AGENTMEMORY_DATA_DIR"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}")
    lock.flush()
    return lock


class SpanMapper:
    """The OTLP mapping of everything the web workers queue, on a thread of this process: a
    process of its own, as `embed_worker` is, so that the mapping neither shares a web
    worker's interpreter lock with the acknowledgements nor, at its lower OS priority
    (`span_queue.spans_map_chore(background=True)`), their CPU. Batches are mapped one after
    another while spans are queued; an idle mapper starts when an export commits (told on a
    listening connection of its own, `span_queue.ExportWait`), and looks at the queue
    every RESCAN_SECONDS anyway, or BUSY_SECONDS while spans wait for contexts a writer holds. A
    database fault is waited out."""

    RESCAN_SECONDS = 10.0
    # Spans queued in contexts a writer holds: no export will tell of their release.
    BUSY_SECONDS = 0.2
    FAULT_SECONDS = 2.0

    def __init__(self):
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="span-mapper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        idle = span_queue.ExportWait(self._stopping)
        try:
            while not self._stopping.is_set():
                try:
                    idle.listen()
                    if not span_queue.spans_map_chore(background=True):
                        busy = span_queue.spans_busy()
                        idle(self.BUSY_SECONDS if busy else self.RESCAN_SECONDS)
                except Exception:  # a fault must not end the mapping for the server's life
                    log.exception("OTLP mapping failed; retrying")
                    connection.close()
                    idle.close()
                    self._stopping.wait(self.FAULT_SECONDS)
        finally:
            connection.close()
            idle.close()

    def stop(self) -> None:
        """After gunicorn has stopped: the batch being mapped commits (or rolls back) first."""
        self._stopping.set()
        self._thread.join(timeout=30)


class Command(BaseCommand):
    help = "Migrate, create the operator account and demo data once, and serve with gunicorn."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("AGENTMEMORY_HOST", "127.0.0.1"))
        parser.add_argument(
            "--port", type=int, default=int(os.environ.get("AGENTMEMORY_PORT", "8000"))
        )
        parser.add_argument(
            "--workers", type=int, default=int(os.environ.get("AGENTMEMORY_WORKERS", "3"))
        )
        parser.add_argument("--no-demo", action="store_true", help="do not load the demo data")

    def handle(self, *args, **options):
        # One server per data folder: a second one would attach to the same database and serve
        # it from another port, and each stop would pull the database from under the other.
        lock = _hold_data_folder(settings.DATA_DIR)
        previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            self._serve(**options)
        except StopRequested as stop:  # arrived while migrating or seeding: nothing to stop yet
            self.stdout.write(f"\n{stop}: stopped before serving")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if settings.EMBEDDED_DATABASE:
                # Workers killed without running their exit handlers would otherwise keep the
                # database "held" and it would never stop.
                self._forget_dead_holders()
            lock.close()
            # Stopping ends here: the embedded server's exit handler runs, not a last garbage
            # collection that only delays the exit.
            skip_final_collection()

    def _serve(self, *, host, port, workers, no_demo, **options):
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("database migrated")
        username = os.environ.get("AGENTMEMORY_OPERATOR_USERNAME", "operator")
        username, shown = ensure_operator(
            username=username, password=os.environ.get("AGENTMEMORY_OPERATOR_PASSWORD") or None
        )
        if not no_demo and not Context.objects.filter(keys__demo=True).exists():
            call_command("seed_demo")
        # What the last run left to the indexers (deferred vectors, full-text vectors of large
        # batches): drained by this process's indexer thread while gunicorn starts. The web
        # workers' own threads only wake when a batch of theirs commits.
        backlog.wake_indexer()

        if port_in_use(host, port):
            raise CommandError(
                f"port {port} on {host} is already in use (is agentmemory already running?); "
                "stop that process or choose another port with --port or AGENTMEMORY_PORT"
            )

        cmd = [
            # ASGI (uvicorn workers): Django, and the MCP server at /mcp (agentmemory_site/asgi.py).
            sys.executable,
            "-m",
            "gunicorn",
            "agentmemory_site.asgi:application",
            "--worker-class",
            "uvicorn_worker.UvicornWorker",
            "--preload",
            # Its processes die with their parents (a kill -9 leaves no orphan on the port).
            "--config",
            "python:agentmemory_site.gunicorn_hooks",
            "--bind",
            f"{host}:{port}",
            "--workers",
            str(workers),
            "--access-logfile",
            "-",
            "--graceful-timeout",
            "10",
            "--timeout",
            "60",
            # Above the idle timeouts of pooled HTTP clients (httpx keeps a connection 5 s, most
            # others longer, load balancers often 60 s): a connection the client reuses must not
            # have been closed under it by the server a moment before.
            "--keep-alive",
            str(settings.AGENTMEMORY_KEEPALIVE_SECONDS),
        ]
        # The web workers leave the OTLP mapping to this process, which has nothing else to do
        # while gunicorn serves (an operator's own AGENTMEMORY_OTLP_MAP_THREAD is kept as set).
        maps_here = "AGENTMEMORY_OTLP_MAP_THREAD" not in os.environ
        env = {**os.environ, "AGENTMEMORY_OTLP_MAP_THREAD": "false"} if maps_here else None
        proc = subprocess.Popen(cmd, env=env)
        mapper = SpanMapper() if maps_here else None
        try:
            if not wait_until_listening(proc, host, port):
                raise CommandError(
                    f"gunicorn did not start serving on {host}:{port} (exit code {proc.poll()}); "
                    "see its messages above"
                )
            self._announce(host, port, username, shown)
            code = proc.wait()
            if code:
                raise CommandError(f"gunicorn stopped unexpectedly (exit code {code})")
        except (KeyboardInterrupt, StopRequested) as stop:
            # A terminal's Ctrl-C reaches gunicorn too, `kill` of the process group as well; a
            # signal sent to this process alone must still reach it. Either way gunicorn ends
            # before the database stops.
            reason = "SIGINT" if isinstance(stop, KeyboardInterrupt) else str(stop)
            self.stdout.write(f"\n{reason}: stopping the server")
            self._stop_gunicorn(proc, signal.SIGINT if reason == "SIGINT" else signal.SIGTERM)
            self.stdout.write("server stopped; stopping the database")
        finally:
            if proc.poll() is None:
                self._stop_gunicorn(proc, signal.SIGTERM)
            if mapper is not None:
                mapper.stop()

    @staticmethod
    def _stop_gunicorn(proc: subprocess.Popen, sig: int) -> None:
        while True:
            try:
                proc.send_signal(sig)
                proc.wait(timeout=20)
                return
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                return
            except (KeyboardInterrupt, StopRequested):
                continue  # a second Ctrl-C or signal while stopping: keep stopping

    @staticmethod
    def _forget_dead_holders() -> None:
        from agentmemory_site.embedded_db import forget_dead_holders, server_class

        forget_dead_holders(server_class(), settings.DATA_DIR / "pgdata")

    def _announce(self, host, port, username, shown) -> None:
        url = f"http://{host}:{port}/"
        self.stdout.write(self.style.SUCCESS(f"\nagentmemory is serving on {url}"))
        if shown:
            self.stdout.write(
                self.style.WARNING(
                    f"operator login: {username} / {shown}  (shown once; change it in /admin/)"
                )
            )
        else:
            self.stdout.write(
                f"operator login: your existing account (created as {username!r} on first run)"
            )
        database = (
            "embedded PostgreSQL under " + str(settings.DATA_DIR)
            if settings.EMBEDDED_DATABASE
            else "DATABASE_URL"
        )
        self.stdout.write(f"database: {database}")
        self.stdout.write("Ctrl-C (or SIGTERM) stops the server and the database.\n")
        sys.stdout.flush()
