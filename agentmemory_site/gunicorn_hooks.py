"""gunicorn server hooks of `manage.py serve` (`--config python:agentmemory_site.gunicorn_hooks`).

Each process of the server dies with its parent: a worker with the gunicorn master, the master
with `serve`. A `kill -9` of either would otherwise leave orphans serving (and holding the port
and the embedded database) with nothing left to stop them, and the next `serve` could not start.

And each ends without the interpreter's last garbage collection (`skip_final_collection`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> None:
    """Ask Linux to send `sig` to this process when its parent ends (prctl PR_SET_PDEATHSIG);
    exits now when the parent has already gone. Does nothing where prctl is missing."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return
    prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before the request took effect
        os.kill(os.getpid(), sig)


def skip_final_collection() -> None:
    """Freeze every object now, so the collection Python runs as it exits skips them: over a
    loaded Django site it walks well over a hundred thousand objects (seconds on a busy
    machine, once per process) only to free memory the exit frees anyway. Exit handlers still
    run, and the objects they touch stay usable."""
    gc.freeze()


def on_starting(server) -> None:
    # The master stops like on `kill` (gracefully, its workers first) when `serve` is gone.
    die_with_parent(signal.SIGTERM)


def post_fork(server, worker) -> None:
    # A worker without its master has no one to stop or replace it: it ends at once and frees
    # the port (its requests' transactions roll back; acknowledged writes are committed).
    die_with_parent(signal.SIGKILL)


def worker_exit(server, worker) -> None:
    skip_final_collection()


def on_exit(server) -> None:
    skip_final_collection()
