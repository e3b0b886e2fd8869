"""A Citus coordinator and two workers as three PostgreSQL processes of one install tree (the
embedded package's copy that scripts/build_citus.sh built Citus into): no Docker, no root.

    python scripts/citus_cluster.py start TREE DATA [--database NAME] [--workers 2]
    python scripts/citus_cluster.py url DATA [--database NAME]
    python scripts/citus_cluster.py stop DATA

`start` creates each node's data folder on first use (initdb, `shared_preload_libraries =
'citus'`), starts the nodes on free local ports, creates the database with the citus and vector
extensions on every node and registers the workers with the coordinator; it prints the
coordinator's DATABASE_URL. The ports are kept in DATA/ports so `url` and `stop` find them, and
a later `start` of the same DATA starts the same cluster again, its data kept.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

HOST = "127.0.0.1"
USER = "postgres"
# PostgreSQL refuses to run as root; as the embedded package does, root runs the servers as an
# unprivileged system user of that name (created when missing).
SERVER_USER = "pgserver" if os.geteuid() == 0 else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def run(*args: str) -> str:
    # The tree's own lib/ holds the libraries its programs were linked with
    # (scripts/build_citus.sh copies them there).
    tree = Path(args[0]).parent.parent
    env = {**os.environ, "LD_LIBRARY_PATH": str(tree / "lib")}
    done = subprocess.run(args, capture_output=True, text=True, env=env, user=SERVER_USER)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:2])} failed:\n{done.stderr or done.stdout}")
    return done.stdout


def psql(tree: Path, port: int, database: str, sql: str) -> str:
    return run(
        str(tree / "bin" / "psql"),
        "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
        "-h", HOST, "-p", str(port), "-U", USER, "-d", database, "-c", sql,
    )  # fmt: skip


def ensure_server_user(data: Path) -> None:
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/sh", SERVER_USER], check=True)
    for folder in (data, *data.parents):  # the server user must reach its folders
        folder.chmod(folder.stat().st_mode | 0o055)


def init_node(tree: Path, folder: Path, port: int, settings: dict[str, str] | None = None) -> None:
    if not (folder / "PG_VERSION").exists():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if SERVER_USER:
            shutil.chown(folder, SERVER_USER, SERVER_USER)
        run(
            str(tree / "bin" / "initdb"),
            "-D", str(folder), "-U", USER, "--auth=trust", "-E", "UTF8", "--locale=C",
        )  # fmt: skip
    # Rewritten at every start: the ports are chosen afresh.
    (folder / "postgresql.auto.conf").write_text(
        "shared_preload_libraries = 'citus'\n"
        f"port = {port}\n"
        f"listen_addresses = '{HOST}'\n"
        f"unix_socket_directories = '{folder}'\n"
        "max_connections = 200\n"
        + "".join(f"{name} = '{value}'\n" for name, value in (settings or {}).items())
    )
    run(str(tree / "bin" / "pg_ctl"), "-D", str(folder), "-l", str(folder / "log"), "-w", "start")


def start(
    tree: Path, data: Path, database: str, workers: int, settings: dict[str, str] | None = None
) -> str:
    """Start (creating on first use) the coordinator and `workers` workers; `settings` go into
    every node's configuration (the benchmark gives each node the embedded server's own)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", database):
        raise SystemExit(f"not a plain database name: {database!r}")
    data.mkdir(parents=True, exist_ok=True)
    if SERVER_USER:
        ensure_server_user(data)
    nodes = ["coordinator", *(f"worker{i}" for i in range(1, workers + 1))]
    # A cluster started before keeps its ports: the coordinator's metadata names the workers
    # by host and port.
    saved = data / "ports"
    ports = json.loads(saved.read_text())["ports"] if saved.exists() else {}
    ports = {name: ports.get(name) or free_port() for name in nodes}
    (data / "ports").write_text(json.dumps({"tree": str(tree), "ports": ports}))
    for name in nodes:
        init_node(tree, data / name, ports[name], settings)
    for name in nodes:
        port = ports[name]
        query = f"SELECT 1 FROM pg_database WHERE datname = '{database}'"  # noqa: S608 - checked
        if not psql(tree, port, "postgres", query).strip():
            psql(tree, port, "postgres", f'CREATE DATABASE "{database}"')
        # Only the missing ones: once the workers are registered Citus refuses DDL on them,
        # even an extension's `IF NOT EXISTS` for one they hold (a cluster started again).
        held = psql(tree, port, database, "SELECT extname FROM pg_extension").split()
        for extension in ("citus", "vector"):
            if extension not in held:
                psql(tree, port, database, f"CREATE EXTENSION {extension}")
    coordinator = ports["coordinator"]
    psql(tree, coordinator, database, f"SELECT citus_set_coordinator_host('{HOST}', {coordinator})")
    for name in nodes[1:]:  # citus_add_node answers the node already there
        psql(tree, coordinator, database, f"SELECT citus_add_node('{HOST}', {ports[name]})")
    return url(data, database)


def url(data: Path, database: str) -> str:
    ports = json.loads((data / "ports").read_text())["ports"]
    return f"postgres://{USER}@{HOST}:{ports['coordinator']}/{database}"


def stop(data: Path) -> None:
    state = json.loads((data / "ports").read_text())
    for name in state["ports"]:
        try:
            run(str(Path(state["tree"]) / "bin" / "pg_ctl"), "-D", str(data / name), "-m", "fast",
                "-w", "stop")  # fmt: skip
        except subprocess.CalledProcessError:
            pass  # not running


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start")
    p_start.add_argument("tree", type=Path)
    p_start.add_argument("data", type=Path)
    p_start.add_argument("--database", default="agentmemory")
    p_start.add_argument("--workers", type=int, default=2)
    p_url = sub.add_parser("url")
    p_url.add_argument("data", type=Path)
    p_url.add_argument("--database", default="agentmemory")
    p_stop = sub.add_parser("stop")
    p_stop.add_argument("data", type=Path)
    args = parser.parse_args(argv)
    if args.command == "start":
        print(start(args.tree.resolve(), args.data.resolve(), args.database, args.workers))
    elif args.command == "url":
        print(url(args.data.resolve(), args.database))
    else:
        stop(args.data.resolve())


if __name__ == "__main__":
    main(sys.argv[1:])
