"""`manage.py embedding_model add NAME --dimensions N | list`: the model names vectors may be
stored and searched under. Clients' vectors under any other name are refused (422)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from memory_app.audit import Actor
from memory_app.embeddings.registry import registered_models
from memory_app.errors import DomainError
from memory_app.services.embedding_models import embedding_model_register


class Command(BaseCommand):
    help = "Register an embedding model with its dimensions, or list the registered ones."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="register a model name with its dimensions")
        add.add_argument("name")
        add.add_argument("--dimensions", type=int, required=True)
        sub.add_parser("list", help="list the registered models")

    def handle(self, *args, action, **options):
        if action == "add":
            try:
                row, created = embedding_model_register(
                    name=options["name"],
                    dimensions=options["dimensions"],
                    actor=Actor.system("manage.py embedding_model"),
                )
            except DomainError as exc:
                raise CommandError(str(exc)) from None
            state = "registered" if created else "already registered"
            self.stdout.write(f"{state}: {row.name} ({row.dimensions} dimensions)")
            return
        for row in registered_models():
            self.stdout.write(
                f"{row.name}\t{row.dimensions}\t{row.created_at:%Y-%m-%d %H:%M}\t{row.created_by}"
            )
