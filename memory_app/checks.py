"""System checks against the database (run by `migrate`, hence by `manage.py serve` at startup,
and by `manage.py check --database default`)."""

from __future__ import annotations

from django.core import checks
from django.db import connections

# hnsw.iterative_scan (filtered HNSW searches that return k rows) arrived in pgvector 0.8.0.
MIN_PGVECTOR = (0, 8)


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return None


def pgvector_problem(installed: str | None, available: str | None) -> str | None:
    """Why the server's pgvector will not do (None when it will): `installed` is the version
    created in the database (pg_extension), `available` what CREATE/ALTER EXTENSION would give."""
    need = ".".join(map(str, MIN_PGVECTOR))
    if available is None and installed is None:
        return f"the server has no pgvector extension; install pgvector >= {need}"
    if installed is not None and _version(installed) >= MIN_PGVECTOR:
        return None
    if _version(available) is None or _version(available) < MIN_PGVECTOR:
        return (
            f"the server's pgvector is {available or installed}; "
            f"agentmemory needs pgvector >= {need}"
            " (install a newer pgvector on the server)"
        )
    if installed is not None:
        return (
            f"the database's vector extension is at {installed} although the server has "
            f"{available}; run `ALTER EXTENSION vector UPDATE;` in it (agentmemory needs >= {need})"
        )
    return None  # not created yet: the first migration creates it at `available`


@checks.register(checks.Tags.database)
def check_pgvector(app_configs, databases=None, **kwargs):
    errors = []
    for alias in databases or ():
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT extversion FROM pg_extension WHERE extname = 'vector'),"
                " (SELECT default_version FROM pg_available_extensions WHERE name = 'vector')"
            )
            installed, available = cursor.fetchone()
        problem = pgvector_problem(installed, available)
        if problem:
            errors.append(checks.Error(f"{alias}: {problem}", id="memory_app.E001"))
    return errors


@checks.register()
def check_model_prices(app_configs, **kwargs):
    """A malformed AGENTMEMORY_MODEL_PRICES stops startup with its reason, not a run page later."""
    from django.core.exceptions import ImproperlyConfigured

    from memory_app import pricing

    try:
        pricing.price_table()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="memory_app.E002")]
    return []


@checks.register(checks.Tags.database)
def check_hnsw_parameters(app_configs, databases=None, **kwargs):
    """An index built before AGENTMEMORY_HNSW_M / _EF_CONSTRUCTION changed keeps its old graph:
    say so, and how to rebuild it, instead of leaving the change silently without effect."""

    # Imported here: the checks module loads with the app registry in every process, and the
    # indexer brings the embedding providers (numpy, httpx) only a database check needs.
    from memory_app.embeddings import indexer

    warnings = []
    for alias in databases or ():
        for index in indexer.built_indexes(using=alias):
            if index.stale:
                m, efc = index.configured
                warnings.append(
                    checks.Warning(
                        f"{alias}: the HNSW index of {index.describe()} was built with other "
                        f"parameters than the settings ask for (m={m}, ef_construction={efc})",
                        hint="run `python manage.py hnsw_rebuild` (searches keep using the old "
                        "index until the new one is ready)",
                        id="memory_app.W001",
                    )
                )
    return warnings
