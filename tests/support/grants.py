"""Two sides of one installation for the tests of per-queue grants: the
ORDERS queues and the PAYMENTS queues, each with messages in every state,
jobs, rules tables, a replay schedule, archived rows, alert episodes and the
audit events that come with them, all made through the services production
uses. Every PAYMENTS object carries text that no request of the tests
names (``Side.secrets``), so that a response holding it has leaked it."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from django.contrib.auth.models import Group, User
from django.utils import timezone

from broker.models import DivergedExport, QueueAlert, QueueKind, ReplaySource
from broker.pipeline.archive import archive_dir
from broker.pipeline.replay import replay_job_submit
from broker.pipeline.schedules import ScheduleSpec, Timing, schedule_create
from broker.pipeline.selection import MessageSelection, ReplaySpec
from broker.services.alerts import alerts_check
from broker.services.bulk import bulk_job_submit
from broker.services.publish import NewMessage
from broker.services.queues import queue_create
from broker.services.rule_tables import rule_table_create, rule_table_create_and_activate
from broker.services.topics import subscription_create, topic_create
from broker.services.transitions.blacklist import message_fail
from broker.services.transitions.in_flight import DeadLetterCause, messages_dead_letter
from console.grants import Grantee, grant_add, group_add_member, group_create
from console.roles import GROUP_ROLES
from console.tokens import token_create
from tests.support.archive import archived, message_row
from tests.support.messages import OWNER, claimed, delivered, quarantined
from tests.support.publishing import published

# The payload marker of each side: every message of the side starts with it.
PAYMENTS_MARKER = b"PAYMENTS-SECRET-7f3a"
ORDERS_MARKER = b"ORDERS-PAYLOAD-19c2"
# An id no message, job, table or schedule of the tests has.
GHOST_ID = 2_000_000_001


def marker_forms(marker: bytes) -> list[bytes]:
    """How a payload that starts with ``marker`` can show in a response:
    as it is, base64 (the API's ``payload_encoding: base64``; the marker's
    first 18 bytes are whole base64 groups at the payload's start), hex
    (a download's or a dump's) and a hex dump's spaced pairs (the console's)."""
    head = marker[:18]
    return [
        marker,
        base64.b64encode(head),
        base64.urlsafe_b64encode(head),
        marker[:8].hex().encode(),
        marker[:8].hex().upper().encode(),
        " ".join(f"{byte:02x}" for byte in marker[:8]).encode(),
        " ".join(f"{byte:02X}" for byte in marker[:8]).encode(),
    ]


@dataclass
class Side:
    """The objects of one side (ORDERS or PAYMENTS, or the ghost side:
    names and ids of nothing), by what a request may name."""

    label: str
    queue_in: str
    queue_dlq: str
    # Messages by state; ``binary`` is a blacklisted one whose payload is
    # not text (shown as hex or base64).
    messages: dict[str, int] = field(default_factory=dict)
    bulk_job: int = GHOST_ID
    replay_job: int = GHOST_ID
    rules_active: int = GHOST_ID
    rules_draft: int = GHOST_ID
    rules_versions: tuple[int, ...] = (1, 2)
    schedule: int = GHOST_ID
    topic: str = ""
    subscription: str = ""

    @property
    def topic_string(self) -> str:
        return self.topic.lower().replace(".", "/")

    token: int = GHOST_ID
    # The grant of the side's user (user management), and a team of theirs.
    grant: int = GHOST_ID
    group: str = ""
    user: str = "nobody"
    archived: tuple[int, ...] = ()
    alerts: tuple[int, ...] = ()
    # Text only this side's objects hold, which no request names.
    secrets: tuple[str, ...] = ()
    marker: bytes = b""

    @property
    def prefix(self) -> str:
        return self.label.upper()

    def object_ids(self) -> dict[str, set[int]]:
        """The ids a list would show of this side's objects, by kind."""
        return {
            "message": set(self.messages.values()) | set(self.archived),
            "bulk_job": {self.bulk_job},
            "replay_job": {self.replay_job},
            "schedule": {self.schedule},
            "rule_table": {self.rules_active, self.rules_draft},
            "alert": set(self.alerts),
        }


def ghost_side() -> Side:
    """Names and ids of nothing: what a request about an object that does
    not exist names."""
    return Side(
        label="GHOST",
        queue_in="GHOST.IN",
        queue_dlq="GHOST.DLQ",
        messages=dict.fromkeys(
            ("waiting", "blacklisted", "dead", "delivered", "failed", "binary"), GHOST_ID
        ),
        rules_versions=(77, 78),
        topic="NOWHERE.EVENTS",
        group="NOWHERE-TEAM",
        subscription="GHOST.SUB",
    )


@dataclass
class World:
    orders: Side
    payments: Side
    ghost: Side
    # orders_op: operator on ORDERS.* by a grant, in no role group.
    orders_op: User
    # payments_pat: operator on PAYMENTS.* by a grant; acts on that side.
    payments_pat: User
    # oscar: an installation-wide operator (the operator role group), to
    # tell an operation that needs admin from a grant not honoured.
    oscar: User
    export: int


def _user(username: str, group: str | None = None) -> User:
    user = User.objects.create_user(username=username, password=f"{username}-password-1")
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return user


def _side(label: str, actor: User, marker: bytes, grant: int) -> Side:
    """The queues, messages, jobs, tables, schedule, topic, archive rows and
    alerts of one side; ``label`` is ORDERS or PAYMENTS."""
    up = label.upper()
    secret = f"{up}-{'c0ffee' if up == 'PAYMENTS' else 'beef42'}"
    side = Side(
        label=up,
        queue_in=f"{up}.IN",
        queue_dlq=f"{up}.DLQ",
        # A topic is installation-wide (its name says nothing of a side); its
        # subscription feeds a queue of the side.
        topic="LEDGER.EVENTS" if up == "PAYMENTS" else "SHOP.EVENTS",
        subscription=f"{up}.SUB",
        marker=marker,
        grant=grant,
        group=f"{up}-TEAM",
        user=actor.get_username(),
    )
    group_create(name=side.group, actor=None)
    group_add_member(name=side.group, user=actor.get_username(), actor=None)
    texts = {
        "description": f"{secret}-DESCRIPTION",
        "header": f"{secret}-HEADER",
        "reason": f"{secret}-REASON",
        "rules": f"{secret}-RULES",
        "schedule": f"{secret}-SCHEDULE",
        "token": f"{secret}-TOKEN",
        "application": f"{secret}-APP",
    }
    side.secrets = tuple(texts.values())
    dlq = queue_create(
        name=side.queue_dlq,
        kind=QueueKind.DEAD_LETTER,
        description=texts["description"],
        alert_waiting_above=0,
        actor=actor,
    )
    queue = queue_create(
        name=side.queue_in,
        description=texts["description"],
        dead_letter_queue=dlq,
        alert_waiting_above=0,
        alert_blacklisted_above=0,
        actor=actor,
    )

    def message(state: str, payload: bytes | None = None) -> list[int]:
        body = payload if payload is not None else marker + f" {state} message".encode()
        return published(
            queue,
            1,
            NewMessage(
                payload=body,
                content_type="text/plain",
                headers={"trace": texts["header"]},
            ),
        )

    # One at a time, so that each claim takes the message just published.
    [side.messages["delivered"]] = message("delivered")
    assert delivered(queue, 1) == [side.messages["delivered"]]
    [side.messages["dead"]] = message("dead-lettered")
    assert claimed(queue, 1) == [side.messages["dead"]]
    messages_dead_letter(
        causes={side.messages["dead"]: DeadLetterCause("handler_error", texts["reason"])},
        owner=OWNER,
    )
    [side.messages["blacklisted"]] = quarantined(message("blacklisted"), texts["reason"])
    [side.messages["binary"]] = quarantined(
        message("binary", marker + b"\x00\xff\xfe binary payload"), texts["reason"]
    )
    [side.messages["failed"]] = quarantined(message("failed"), texts["reason"])
    message_fail(message_id=side.messages["failed"], actor=actor, reason=texts["reason"])
    [side.messages["waiting"]] = message("waiting")

    side.bulk_job = bulk_job_submit(
        action="release",
        actor=actor,
        message_ids=[side.messages["blacklisted"]],
        reason=texts["reason"],
    ).id
    side.replay_job = replay_job_submit(
        spec=ReplaySpec(
            source=ReplaySource.DEAD_LETTER,
            source_queue=side.queue_dlq,
            filter=MessageSelection(queues=(side.queue_in,)),
            target_queue=side.queue_in,
            rules_text=f"* {texts['rules']}\nACTION(IGNORE)\n",
        ),
        actor=actor,
    ).id
    rules = f"* {texts['rules']}\nACTION(IGNORE)\n"
    active = rule_table_create_and_activate(queue=dlq, text=rules, actor=actor)
    draft = rule_table_create(queue=dlq, text=rules + "* draft\n", actor=actor)
    side.rules_active, side.rules_draft = active.id, draft.id
    side.rules_versions = (active.version, draft.version)
    side.schedule = schedule_create(
        spec=ScheduleSpec(
            name=texts["schedule"],
            replay=ReplaySpec(
                source=ReplaySource.DEAD_LETTER,
                source_queue=side.queue_dlq,
                filter=MessageSelection(queues=(side.queue_in,)),
                target_queue=side.queue_in,
            ),
            timing=Timing(cron="0 3 * * *", time_zone="UTC"),
        ),
        actor=actor,
    ).id
    topic = topic_create(name=side.topic, topic_string=side.topic_string, actor=actor)
    subscription_create(
        name=side.subscription,
        topic=topic,
        queue_name=f"{up}.FEED",
        topic_filter=f"{side.topic_string}/#",
        actor=actor,
    )
    side.token = token_create(user=actor, name=texts["token"])[0].id

    # Archived rows (the archive job's Parquet files, written without
    # Spark) of both queues, published an hour ago so that a default time
    # window holds them.
    base = 9_000_000 if up == "ORDERS" else 9_500_000
    at = timezone.now() - timedelta(hours=1)
    side.archived = (base + 1, base + 2, base + 3)
    archived(
        archive_dir(),
        side.queue_in,
        [
            message_row(
                base + 1,
                at,
                payload=marker + b" archived message",
                headers=json.dumps({"trace": texts["header"]}),
                put_application=texts["application"],
            ),
            message_row(base + 2, at + timedelta(minutes=1), payload=marker + b" archived 2"),
        ],
    )
    archived(
        archive_dir(),
        side.queue_dlq,
        [
            message_row(
                base + 3,
                at,
                state="TBDL",
                payload=marker + b" archived dead letter",
                dead_letter=json.dumps(
                    {"reason": "handler_error", "original_queue": side.queue_in}
                ),
            )
        ],
    )
    return side


def build_world(archive: Path) -> World:
    """Both sides, their users and grants, and the alert episodes the
    thresholds open. ``archive`` is where the archive's files go (the
    test's own ARCHIVE_DIR)."""
    assert archive_dir() == archive
    for name in GROUP_ROLES:
        Group.objects.get_or_create(name=name)
    orders_op = _user("orders_op")
    payments_pat = _user("payments_pat")
    oscar = _user("oscar", "operator")
    orders_grant = grant_add(
        pattern="ORDERS.*", role="operator", to=Grantee(user="orders_op"), actor=None
    )
    payments_grant = grant_add(
        pattern="PAYMENTS.*", role="operator", to=Grantee(user="payments_pat"), actor=None
    )
    orders = _side("ORDERS", orders_op, ORDERS_MARKER, orders_grant.id)
    payments = _side("PAYMENTS", payments_pat, PAYMENTS_MARKER, payments_grant.id)
    # A queue orders_op may operate on, for the narrowed token's test.
    queue_create(name="ORDERS.OUT", description="orders going out")
    published("ORDERS.OUT", 1, NewMessage(payload=ORDERS_MARKER + b" outgoing"))
    fired = alerts_check().fired
    assert fired, "the thresholds of 0 opened no alert episode"
    for side in (orders, payments):
        side.alerts = tuple(
            QueueAlert.objects.filter(
                id__in=fired, queue__name__startswith=side.prefix
            ).values_list("id", flat=True)
        )
        assert side.alerts, f"no alert episode on the {side.label} side"
    export = DivergedExport.objects.create(
        node="B", path=str(archive.parent / "diverged-B.jsonl"), messages=1
    ).id
    return World(
        orders=orders,
        payments=payments,
        ghost=ghost_side(),
        orders_op=orders_op,
        payments_pat=payments_pat,
        oscar=oscar,
        export=export,
    )
