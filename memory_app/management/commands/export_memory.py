"""Export contexts (all, some ids, or those whose keys contain a subset) as JSON Lines."""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from memory_app.backup.export import contexts_matching, export_lines
from memory_app.replica import replica_stream


class Command(BaseCommand):
    help = (
        "Export memory (contexts, messages, runs, steps, tool calls, scores, labels, comments, "
        "LangGraph checkpoints, memory records and their versions) as JSON Lines."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--context",
            type=int,
            action="append",
            dest="context_ids",
            help="a context id (repeatable); default: every context",
        )
        parser.add_argument(
            "--keys",
            help='only contexts whose keys contain this JSON object, e.g. \'{"user": "ada"}\'',
        )
        parser.add_argument("--embeddings", action="store_true", help="include embedding vectors")
        parser.add_argument("-o", "--output", help="file to write (default: standard output)")

    def handle(self, *args, context_ids=None, keys=None, embeddings=False, output=None, **options):
        subset = None
        if keys:
            try:
                subset = json.loads(keys)
            except json.JSONDecodeError as exc:
                raise CommandError(f"--keys is not JSON: {exc.msg}") from exc
            if not isinstance(subset, dict):
                raise CommandError("--keys must be a JSON object")
        contexts = contexts_matching(context_ids=context_ids, keys=subset)
        # From the read replica when there is one, as the API's export reads.
        # Without context ids, key-subset memories under no exported context come along too.
        subsets = None if context_ids else (subset or {})
        # The operator's backup is whole: memory versions too (an API key's holds them only
        # with the admin scope, see memory_app.api.backup).
        lines = replica_stream(
            export_lines(
                contexts=contexts, embeddings=embeddings, subsets=subsets, memory_versions=True
            )
        )
        # Bytes, not text: a text stream would translate newlines on some platforms, and the
        # trailer's digest is over the bytes as written.
        data = (line.encode("utf-8") for line in lines)
        if output:
            with open(output, "wb") as fh:
                fh.writelines(data)
        else:
            sys.stdout.flush()
            sys.stdout.buffer.writelines(data)
            sys.stdout.buffer.flush()
