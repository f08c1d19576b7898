"""Load a realistic demo: queues, messages in every state, a draft rules
table, a paused replay schedule, and users."""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from broker.consumers import handler_names
from broker.models import Message, MessageState, Queue, ReplaySource
from broker.pipeline.schedules import ScheduleSpec, Timing, schedule_create
from broker.pipeline.selection import MessageSelection, ReplaySpec
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_create
from broker.services.sweeper import messages_sweep
from broker.services.transitions.blacklist import message_fail
from broker.services.transitions.in_flight import (
    DeadLetterCause,
    messages_ack,
    messages_claim,
    messages_dead_letter,
)
from console.roles import GROUP_ROLES

# A lease owner without a lease lock: to the sweeper, a worker that died.
DEMO_WORKER = "demo-worker"

QUEUES: list[dict[str, Any]] = [
    {
        "name": "ORDERS.IN",
        "description": "Orders from the web shop",
        "consumer": "demo",
        "batch_size": 20,
        # Alerts: a backlog, any blacklisted order, a consumer that stopped.
        "alert_waiting_above": 500,
        "alert_blacklisted_above": 0,
        "alert_stalled_seconds": 300,
    },
    {"name": "PAYMENTS.IN", "description": "Card and bank payment events", "consumer": "json"},
    {
        "name": "PAYMENTS.PARKED",
        "description": "Payments for a person to look at",
        "alert_oldest_waiting_seconds": 4 * 3600,
    },
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
        if "demo" not in handler_names():
            raise CommandError(
                "ORDERS.IN's consumer is the demo handler of the demo_consumers module: "
                "set LAZARETTO_CONSUMER_MODULES=demo_consumers (make run does) for this "
                "command, the console and the workers."
            )
        for name in GROUP_ROLES:
            Group.objects.get_or_create(name=name)
        if Queue.objects.filter(name="ORDERS.IN").exists():
            self.stdout.write("Demo queues already exist; leaving their messages alone.")
        else:
            self._load_messages()
        passwords = {name: self._user(name) for name in ("admin", "operator", "viewer")}
        port = os.environ.get("PORT") or "8000"  # make run serves the console there
        self.stdout.write(self.style.SUCCESS(f"Demo ready. Log in at http://127.0.0.1:{port}/"))
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
        """The queues, their messages in every state and a draft rules
        table, in one transaction."""
        for spec in QUEUES:
            queue_create(**spec)
        _publish_backlog()
        _walk_through_states(
            orders_queue=Queue.objects.get(name="ORDERS.IN"),
            payments_queue=Queue.objects.get(name="PAYMENTS.IN"),
        )
        # A rules table for the dead-letter queue, left as a draft: dry-run it
        # before activating.
        rule_table_create(
            queue=Queue.objects.get(name="SYSTEM.DEAD.LETTER.QUEUE"),
            text=DEMO_RULES,
        )
        # A replay schedule for the orders that failed, left paused: resume
        # it to have them put back every half hour, three times at most.
        schedule_create(
            spec=ScheduleSpec(
                name="retry-failed-orders",
                replay=ReplaySpec(
                    source=ReplaySource.DEAD_LETTER,
                    source_queue="SYSTEM.DEAD.LETTER.QUEUE",
                    filter=MessageSelection(queues=("ORDERS.IN",), reason="handler_error"),
                ),
                timing=Timing(cron="*/30 * * * *", time_zone="Europe/Paris"),
                cool_off_minutes=10,
                enabled=False,
            ),
            actor=None,
        )
        _publish_poison_messages()


def _publish_backlog() -> None:
    """Publish the orders, payments and notifications the demo starts from."""
    messages_publish(
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
    messages_publish(
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


def _walk_through_states(*, orders_queue: Queue, payments_queue: Queue) -> None:
    """Walk some messages through the state machine as workers would.

    Delivered, crashed twice (so blacklisted, with a dump file), failed by
    an operator, dead-lettered, and in flight.
    """
    for queue, count in ((orders_queue, 80), (payments_queue, 20)):
        messages_ack(queue_id=queue.id, message_ids=_claim(queue, count), owner=DEMO_WORKER)
    for queue, count in ((orders_queue, 5), (payments_queue, 3)):
        _claim(queue, count)
        messages_sweep()  # the demo worker holds no lease lock: a crash
        for _ in range(count):
            _claim(queue, 1, suspect=True)
            messages_sweep()  # the second crash blacklists the suspect
    rejected = Message.objects.filter(queue=orders_queue, state=MessageState.NOT_DELIVERABLE)
    message_fail(
        message_id=rejected.earliest("id").id,
        actor=None,
        reason="demo: consumer rejects this SKU",
    )
    for queue, count in ((orders_queue, 5), (payments_queue, 3)):
        messages_dead_letter(
            causes=dict.fromkeys(
                _claim(queue, count),
                DeadLetterCause("handler_error", "ValueError: unknown currency 'XYZ'"),
            ),
            owner=DEMO_WORKER,
        )
    _claim(orders_queue, 3)


def _publish_poison_messages() -> None:
    """Leave two messages waiting for the workers.

    A poison order that crashes its consumer (blacklisted after two crashes)
    and a payment that is not JSON (dead-lettered as a format error).
    """
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


def _claim(queue: Queue, count: int, *, suspect: bool = False) -> list[int]:
    claimed = messages_claim(
        queue_id=queue.id, owner=DEMO_WORKER, lease_seconds=300, limit=count, suspect=suspect
    )
    return [message.id for message in claimed]
