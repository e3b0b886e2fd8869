from django.apps import AppConfig


class MemoryAppConfig(AppConfig):
    name = "memory_app"
    verbose_name = "Agent memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.backends.signals import connection_created

        from memory_app import (
            backlog,
            checks,  # noqa: F401 - registers the database checks
        )
        from memory_app.models.shared import json_as_text
        from memory_app.services import span_queue

        connection_created.connect(json_as_text, dispatch_uid="memory_app.json_as_text")
        # Queued OTLP exports are a backlog of the indexer thread too (it lives below services).
        backlog.register_drain(span_queue.spans_map_drain)
