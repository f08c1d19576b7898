"""Commands made of verbs (``dlq import``, ``token create``, ``user list``):
``handle`` runs the method ``_<verb>`` with the parsed options, and a
``BrokerError`` becomes the command's error, its detail the message."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from broker.errors import BrokerError


class VerbCommand(BaseCommand):
    # The subparsers' ``dest``: the option naming the verb.
    verb_option = "verb"

    def handle(self, *args: Any, **options: Any) -> None:
        verb = options.pop(self.verb_option)
        try:
            getattr(self, f"_{verb}")(**options)
        except BrokerError as error:
            raise CommandError(error.detail) from None
