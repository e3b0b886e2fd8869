"""Forget everything about a key subset: `manage.py erase --keys '{"user": "ada"}' [--yes]`.

Without `--yes` it only counts what would go. With it, every context whose keys contain the
subset goes with all it holds and every derived copy (see `memory_app.services.erasure`), and
the receipt of counts per kind is printed. A legal hold in the subset refuses the erasure.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from memory_app.audit import Actor
from memory_app.errors import Conflict, Invalid
from memory_app.services import erasure


class Command(BaseCommand):
    help = "Erase every row and derived copy of the contexts and memories of a key subset."

    def add_arguments(self, parser):
        parser.add_argument("--keys", required=True, help='a JSON object, e.g. {"user": "ada"}')
        parser.add_argument("--yes", action="store_true", help="erase (else only count)")

    def handle(self, *args, **opts):
        try:
            keys = json.loads(opts["keys"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--keys is not JSON: {exc}") from exc
        try:
            if not opts["yes"]:
                counts = erasure.erase_preview(keys=keys)
                self.stdout.write(json.dumps({"would_erase": counts}, indent=2))
                self.stdout.write("nothing erased: pass --yes to erase")
                return
            done = erasure.erase(
                keys=keys,
                confirmation=erasure.ERASE_CONFIRMATION,
                actor=Actor.system("system:erase-command"),
            )
        except (Invalid, Conflict) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(done, indent=2))
