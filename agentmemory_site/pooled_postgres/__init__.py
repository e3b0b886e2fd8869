"""Django's PostgreSQL backend with this site's pool health check; see `base`."""
