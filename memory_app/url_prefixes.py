"""Where the site's URL spaces begin, for code on either side of them (API middleware, dashboard
error pages) without one importing the other."""

# The Agent API, and the OTLP receiver at its standard path (agentmemory_site/urls.py).
API_PREFIXES = ("/api/", "/v1/")

# The backup import: its body is streamed, under a limit of its own (memory_app/api/limits.py).
IMPORT_PATH = "/api/v1/import"
