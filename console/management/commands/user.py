"""Users from the command line: ``user create NAME --role ROLE`` (the
password from a prompt, or the first line of stdin when it is not a
terminal; never an argument), ``user list``, ``user role NAME ROLE``,
``user deactivate NAME``. Each change is an audit event by the system."""

from __future__ import annotations

import getpass
import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser

from broker.management.verbs import VerbCommand
from console.users import ROLES, user_create, user_deactivate, user_set_role, users_list


class Command(VerbCommand):
    help = "Create users, list them, change a user's role, deactivate a user."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True)
        create = verbs.add_parser("create", help="a new user; the password is asked for")
        create.add_argument("name")
        create.add_argument("--role", required=True, help=" | ".join(ROLES))
        verbs.add_parser("list", help="every user: name, role, active, last sign-in")
        role = verbs.add_parser("role", help="give a user another role")
        role.add_argument("name")
        role.add_argument("role", help=" | ".join(ROLES))
        deactivate = verbs.add_parser("deactivate", help="stop a user's sign-ins and tokens")
        deactivate.add_argument("name")

    def _password(self) -> str:
        if not sys.stdin.isatty():
            return sys.stdin.readline().rstrip("\n")
        first = getpass.getpass("Password: ")
        if getpass.getpass("Password (again): ") != first:
            raise CommandError("The two passwords differ.")
        return first

    def _create(self, name: str, role: str, **options: Any) -> None:
        user_create(name=name, role=role, password=self._password(), actor=None)
        self.stdout.write(f"User {name} created with role {role}.")

    def _list(self, **options: Any) -> None:
        for row in users_list():
            seen = row.last_login.isoformat(timespec="seconds") if row.last_login else "never"
            state = "active" if row.active else "deactivated"
            self.stdout.write(f"{row.name}\t{row.role}\t{state}\t{seen}")

    def _role(self, name: str, role: str, **options: Any) -> None:
        user_set_role(name=name, role=role, actor=None)
        self.stdout.write(f"{name} is now {role}.")

    def _deactivate(self, name: str, **options: Any) -> None:
        user_deactivate(name=name, actor=None)
        self.stdout.write(f"{name} is deactivated: their sessions and API tokens stop working.")
