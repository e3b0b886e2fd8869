"""The typed shapes of what agents send and get back, shared by the REST API (django-ninja) and
the MCP tools, so both validate alike and answer alike. Neither imports the other: both import
these and the services."""
