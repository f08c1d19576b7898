"""Grants from the command line: ``grant add PATTERN ROLE --user NAME`` (or
``--group NAME``), ``grant list [--user NAME | --group NAME]``, ``grant
remove ID``. A grant gives a role on the queues the pattern (a queue name,
or a glob such as ``ORDERS.*``) matches. Each change is an audit event by
the system."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from broker.management.verbs import VerbCommand
from console.grants import Grantee, grant_add, grant_remove, grantee_of, grants_list
from console.roles import GROUP_ROLES, Role


def _grantee(parser: CommandParser) -> None:
    whom = parser.add_mutually_exclusive_group()
    whom.add_argument("--user", default="", help="a user's name")
    whom.add_argument("--group", default="", help="a group's name (manage.py group)")


class Command(VerbCommand):
    help = "Give a user or a group a role on the queues a pattern matches; list and remove grants."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True)
        add = verbs.add_parser("add", help="a role on the queues PATTERN matches")
        add.add_argument("pattern", help="a queue name, or a glob with * and ?, e.g. ORDERS.*")
        add.add_argument("role", help=" | ".join(GROUP_ROLES))
        _grantee(add)
        listing = verbs.add_parser("list", help="every grant, or a user's or a group's")
        _grantee(listing)
        remove = verbs.add_parser("remove", help="take a grant back, by its id (grant list)")
        remove.add_argument("grant_id", type=int)

    def _add(self, pattern: str, role: str, user: str, group: str, **options: Any) -> None:
        grant = grant_add(pattern=pattern, role=role, to=Grantee(user, group), actor=None)
        self.stdout.write(f"Grant {grant.id}: {role} on {pattern} to {user or group}.")

    def _list(self, user: str, group: str, **options: Any) -> None:
        for grant in grants_list(to=Grantee(user, group) if user or group else None):
            whom = grantee_of(grant)
            holder = f"user {whom.user}" if whom.user else f"group {whom.group}"
            self.stdout.write(f"{grant.id}\t{grant.pattern}\t{Role(grant.role).label}\t{holder}")

    def _remove(self, grant_id: int, **options: Any) -> None:
        grant_remove(grant_id=grant_id, actor=None)
        self.stdout.write(f"Grant {grant_id} removed.")
