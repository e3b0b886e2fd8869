"""`manage.py apikey create|list|revoke`: API keys for agents. The secret is printed once."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from memory_app.audit import Actor
from memory_app.errors import Invalid
from memory_app.models import ApiKey
from memory_app.services import apikeys

# Keys are issued and revoked as on the dashboard's keys page, audited with this actor.
COMMAND = Actor.system("manage.py apikey")


class Command(BaseCommand):
    help = "Create, list or revoke API keys."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key and print its secret (shown once)")
        create.add_argument("name")
        create.add_argument(
            "--scopes",
            default="read,write",
            help="comma-separated subset of read,write,admin (default read,write)",
        )
        create.add_argument(
            "--context-keys",
            default="",
            help='confine the key to contexts containing these keys, e.g. \'{"tenant": "acme"}\'',
        )
        create.add_argument(
            "--memory-review",
            default="live",
            choices=["live", "proposed"],
            help="memories the key records are live at once (default) or proposed for review",
        )
        review = sub.add_parser("review", help="set a key's memory review policy")
        review.add_argument("prefix")
        review.add_argument("memory_review", choices=["live", "proposed"])
        sub.add_parser("list", help="list keys (never their secrets)")
        revoke = sub.add_parser("revoke", help="revoke a key by its prefix")
        revoke.add_argument("prefix")

    def handle(self, *args, action, **options):
        getattr(self, f"_{action}")(**options)

    def _create(self, *, name, scopes, context_keys, memory_review, **_):
        try:
            confinement = json.loads(context_keys) if context_keys else {}
        except ValueError as exc:
            raise CommandError(f"--context-keys is not JSON: {exc}") from None
        try:
            issued = apikeys.apikey_issue(
                name=name,
                scopes=[s.strip() for s in scopes.split(",") if s.strip()],
                context_keys=confinement,
                actor=COMMAND,
                memory_review=memory_review,
            )
        except Invalid as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"created key {issued.key.prefix} ({name}) scopes={','.join(issued.key.scopes)} "
            f"memory_review={issued.key.memory_review}"
        )
        self.stdout.write("secret (shown once, store it now):")
        self.stdout.write(issued.secret)

    def _list(self, **_):
        for key in ApiKey.objects.order_by("created_at"):
            state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
            used = f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never"
            self.stdout.write(
                f"{key.prefix}  {key.name}  scopes={','.join(key.scopes)}  "
                f"context_keys={json.dumps(key.context_keys)}  "
                f"memory_review={key.memory_review}  last_used={used}  {state}"
            )

    def _revoke(self, *, prefix, **_):
        key = ApiKey.objects.filter(prefix=prefix).first()
        if key is None:
            raise CommandError(f"no key with prefix {prefix!r}")
        apikeys.apikey_withdraw(key=key, actor=COMMAND)
        self.stdout.write(f"revoked key {key.prefix} ({key.name})")

    def _review(self, *, prefix, memory_review, **_):
        key = ApiKey.objects.filter(prefix=prefix).first()
        if key is None:
            raise CommandError(f"no key with prefix {prefix!r}")
        apikeys.apikey_set_review(key=key, memory_review=memory_review, actor=COMMAND)
        self.stdout.write(f"key {key.prefix} ({key.name}) memory_review={memory_review}")
