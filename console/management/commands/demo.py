"""Load a realistic demo: queues, messages in every state, and users."""

from __future__ import annotations

import json
import secrets
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from broker.models import MessageState, Queue
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_create
from broker.services.transitions import (
    message_ack,
    message_dead_letter,
    message_fail,
    message_transition,
)
from console.roles import GROUP_ROLES

QUEUES: list[dict[str, Any]] = [
    {
        "name": "ORDERS.IN",
        "description": "Orders from the web shop",
        "consumer": "demo",
        "batch_size": 20,
    },
    {"name": "PAYMENTS.IN", "description": "Card and bank payment events", "consumer": "json"},
    {"name": "PAYMENTS.PARKED", "description": "Payments for a person to look at"},
    {
        "name": "NOTIFY.OUT",
        "description": "E-mail and SMS notifications",
        "consumer": "https://notify.example.com/hooks/lazaretto",
        "max_messages": 5000,
    },
]


DEMO_RULES = """\
* Dead-letter rules for the demo (IBM MQ runmqdlq syntax).
INPUTQ(SYSTEM.DEAD.LETTER.QUEUE) RETRYINT(30) WAIT(YES)
* Unreadable payments go to a parking queue, without the dead-letter header.
REASON(MQRC_FORMAT_ERROR) DESTQ(PAYMENTS.*) ACTION(FWD) FWDQ(PAYMENTS.PARKED) HEADER(NO)
* Orders whose consumer failed get three more chances.
REASON(LZRC_HANDLER_ERROR) DESTQ(ORDERS.IN) ACTION(RETRY) RETRY(3)
* Everything else waits for an operator.
ACTION(IGNORE)
"""


class Command(BaseCommand):
    help = "Create demo queues, messages in several states, and demo users (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        for name in GROUP_ROLES:
            Group.objects.get_or_create(name=name)
        if Queue.objects.filter(name="ORDERS.IN").exists():
            self.stdout.write("Demo queues already exist; leaving their messages alone.")
        else:
            self._load_messages()
        passwords = {name: self._user(name) for name in ("admin", "operator", "viewer")}
        self.stdout.write(self.style.SUCCESS("Demo ready. Log in at http://127.0.0.1:8000/"))
        for name, password in passwords.items():
            self.stdout.write(f"  {name:<9} password: {password}")

    def _user(self, name: str) -> str:
        password = secrets.token_urlsafe(12)
        user, _ = User.objects.get_or_create(username=name)
        user.set_password(password)
        user.is_superuser = user.is_staff = name == "admin"
        user.save()
        user.groups.set([Group.objects.get(name=name)])
        return password

    @transaction.atomic
    def _load_messages(self) -> None:
        for spec in QUEUES:
            queue_create(**spec)
        orders = messages_publish(
            queue_name="ORDERS.IN",
            messages=[
                NewMessage(
                    payload=json.dumps(
                        {"order": 10_000 + n, "sku": f"SKU-{n % 17:03}", "qty": 1 + n % 4}
                    ).encode(),
                    content_type="application/json",
                    headers={"source": "webshop", "region": ("eu", "us", "apac")[n % 3]},
                    priority=4 + (n % 3 == 0),
                )
                for n in range(120)
            ],
            put_application="webshop",
        )
        payments = messages_publish(
            queue_name="PAYMENTS.IN",
            messages=[
                NewMessage(
                    payload=json.dumps({"payment": f"PAY-{n:05}", "amount": 12.5 * n}).encode(),
                    content_type="application/json",
                    headers={"currency": "EUR"},
                )
                for n in range(40)
            ],
            put_application="payments-gw",
        )
        messages_publish(
            queue_name="NOTIFY.OUT",
            messages=[
                NewMessage(
                    payload=f"Your order {10_000 + n} has shipped.".encode(),
                    content_type="text/plain",
                )
                for n in range(25)
            ],
            put_application="shipping",
        )
        # Walk some messages through the state machine as a worker would.
        for message_id in orders[:80] + payments[:20]:
            self._deliver(message_id)
            message_ack(message_id=message_id)
        for message_id in orders[80:85] + payments[20:23]:
            self._deliver(message_id)
            message_transition(
                message_id=message_id,
                to_state=MessageState.NOT_DELIVERABLE,
                changes={
                    "crash_count": 2,
                    "suspect": True,
                    "lease_deadline": None,
                    "lease_owner": "",
                },
            )
        message_fail(message_id=orders[84], actor=None, reason="demo: consumer rejects this SKU")
        for message_id in orders[85:90] + payments[23:26]:
            self._deliver(message_id)
            message_dead_letter(
                message_id=message_id,
                reason="handler_error",
                error="ValueError: unknown currency 'XYZ'",
            )
        for message_id in orders[90:93]:
            self._deliver(message_id)
        # A rules table for the dead-letter queue, left as a draft: dry-run it
        # before activating.
        rule_table_create(
            queue=Queue.objects.get(name="SYSTEM.DEAD.LETTER.QUEUE"),
            text=DEMO_RULES,
        )
        # Left waiting for the workers: a poison order that crashes its
        # consumer (blacklisted after two crashes) and a payment that is not
        # JSON (dead-lettered as a format error).
        messages_publish(
            queue_name="ORDERS.IN",
            messages=[NewMessage(payload=b'{"order": 66666, "note": "CRASH"}')],
            put_application="webshop",
        )
        messages_publish(
            queue_name="PAYMENTS.IN",
            messages=[NewMessage(payload=b"PAY-99999;EUR;12.50", content_type="text/csv")],
            put_application="payments-gw",
        )

    def _deliver(self, message_id: int) -> None:
        message_transition(
            message_id=message_id,
            to_state=MessageState.DELIVERING,
            changes={
                "attempts": 1,
                "lease_owner": "demo-worker",
                "lease_deadline": timezone.now() + timedelta(minutes=5),
            },
        )
