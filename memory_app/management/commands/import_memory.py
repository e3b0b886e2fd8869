"""Import a JSON Lines backup written by `export_memory` (idempotent: twice changes nothing).

The file is read as bytes, line by line: its trailer's digest is over the bytes export wrote, so
no newline or encoding translation may come between the file and the check."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from memory_app import errors
from memory_app.audit import Actor
from memory_app.backup.restore import import_lines

IMPORTER = Actor.system("manage.py import_memory")


class Command(BaseCommand):
    help = "Import a JSON Lines backup (rows already present are left as they are)."

    def add_arguments(self, parser):
        parser.add_argument("path", help="backup file, or - for standard input")
        parser.add_argument(
            "--unchecked-version-1",
            action="store_true",
            help="import a version 1 file, written before backups ended with a trailer: "
            "whether it is whole (not cut short or edited) cannot be checked",
        )

    def handle(self, *args, path, unchecked_version_1=False, **options):
        try:
            if path == "-":
                result = import_lines(
                    sys.stdin.buffer, actor=IMPORTER, unchecked_version_1=unchecked_version_1
                )
            else:
                with open(path, "rb") as fh:
                    result = import_lines(
                        fh, actor=IMPORTER, unchecked_version_1=unchecked_version_1
                    )
        except (OSError, errors.BackupFormatError) as exc:
            raise CommandError(str(exc)) from exc
        for kind in sorted(set(result.created) | set(result.skipped)):
            self.stdout.write(
                f"{kind}: {result.created.get(kind, 0)} created, "
                f"{result.skipped.get(kind, 0)} already present"
            )
