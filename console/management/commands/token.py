"""API tokens from the command line: ``token create USER NAME`` prints a new
key (once), ``token list [USER]``, ``token revoke ID``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import CommandError, CommandParser

from broker.management.verbs import VerbCommand
from console.models import ApiToken
from console.tokens import token_create, token_revoke


class Command(VerbCommand):
    help = "Create, list and revoke API tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True)
        create = verbs.add_parser("create", help="make a token; its key is printed once")
        create.add_argument("username")
        create.add_argument("name", help="what will use it, e.g. billing-exporter")
        listing = verbs.add_parser("list", help="live tokens, a line each")
        listing.add_argument("username", nargs="?")
        revoke = verbs.add_parser("revoke", help="refuse a token from now on")
        revoke.add_argument("id", type=int)

    def _user(self, username: str) -> User:
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"There is no user {username!r}.")
        return user

    def _create(self, username: str, name: str, **options: Any) -> None:
        _token, key = token_create(user=self._user(username), name=name)
        self.stdout.write(key)

    def _list(self, username: str | None = None, **options: Any) -> None:
        tokens = ApiToken.objects.filter(revoked_at__isnull=True).select_related("user")
        if username:
            tokens = tokens.filter(user=self._user(username))
        for token in tokens.order_by("id"):
            used = token.last_used_at.isoformat() if token.last_used_at else "never"
            self.stdout.write(
                f"{token.id}\t{token.user.get_username()}\t{token.name}\t{token.prefix}…\t{used}"
            )

    def _revoke(self, id: int, **options: Any) -> None:
        token = ApiToken.objects.filter(id=id, revoked_at__isnull=True).first()
        if token is None:
            raise CommandError(f"There is no live token {id}.")
        token_revoke(token=token, actor=None)
        self.stdout.write(f"Token {id} ({token.name}) revoked.")
