"""Groups of users (teams) to give grants to: ``group create NAME``, ``group
delete NAME`` (its grants go with it), ``group add NAME USER``, ``group
remove NAME USER``, ``group list``. The roles viewer, operator and admin are
not groups here: ``manage.py user role`` gives those. Each change is an
audit event by the system."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from broker.management.verbs import VerbCommand
from console.grants import (
    group_add_member,
    group_create,
    group_delete,
    group_remove_member,
    groups_list,
)
from console.roles import Role


class Command(VerbCommand):
    help = "Create and delete groups of users, and change their members."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True)
        create = verbs.add_parser("create", help="a new group, without members")
        create.add_argument("name")
        delete = verbs.add_parser("delete", help="a group and its grants; its members stay")
        delete.add_argument("name")
        add = verbs.add_parser("add", help="make a user a member")
        add.add_argument("name")
        add.add_argument("user")
        remove = verbs.add_parser("remove", help="take a user out of the group")
        remove.add_argument("name")
        remove.add_argument("user")
        verbs.add_parser("list", help="every group with its members and grants")

    def _create(self, name: str, **options: Any) -> None:
        group_create(name=name, actor=None)
        self.stdout.write(f"Group {name} created.")

    def _delete(self, name: str, **options: Any) -> None:
        group_delete(name=name, actor=None)
        self.stdout.write(f"Group {name} deleted, with its grants.")

    def _add(self, name: str, user: str, **options: Any) -> None:
        group_add_member(name=name, user=user, actor=None)
        self.stdout.write(f"{user} is a member of {name}.")

    def _remove(self, name: str, user: str, **options: Any) -> None:
        group_remove_member(name=name, user=user, actor=None)
        self.stdout.write(f"{user} is no longer a member of {name}.")

    def _list(self, **options: Any) -> None:
        for group in groups_list():
            members = ", ".join(sorted(user.get_username() for user in group.user_set.all()))
            grants = ", ".join(
                f"{Role(grant.role).label} on {grant.pattern}" for grant in group.queue_grants.all()
            )
            self.stdout.write(f"{group.name}\tmembers: {members or '-'}\tgrants: {grants or '-'}")
