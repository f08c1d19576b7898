"""What admins do to the pair, from the console, the API or
``manage.py broker_node``: look at it, pick the survivor of a split brain,
swap the roles.

Commands go to the nodes themselves (``wire``), at the addresses the nodes
recorded (Node.address) or the one given; the nodes record the role changes
that follow.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError

from broker.errors import HaCommandRefused, HaNodeUnreachable, HaNotConfigured, InvalidInput
from broker.ha import wire
from broker.models import DivergedExport, HaEvent, HaPair, Node
from broker.services.audit import audit_record

logger = logging.getLogger(__name__)

NODE_NAME_MAX_LENGTH = 64
# ASCII, as the API's schema states it.
NODE_NAME_PATTERN = rf"\A[A-Za-z0-9._-]{{1,{NODE_NAME_MAX_LENGTH}}}\Z"
COMMAND_TIMEOUT_SECONDS = 3.0


def ha_secret() -> bytes:
    """The key the nodes sign heartbeats and commands with."""
    configured = settings.HA_SECRET
    if configured:
        return configured.encode()
    return hashlib.sha256(b"lazaretto-ha:" + settings.SECRET_KEY.encode()).digest()


@dataclass(frozen=True)
class PairOverview:
    pair: HaPair | None
    nodes: list[Node]
    events: list[HaEvent]
    exports: list[DivergedExport]

    @property
    def maintenance(self) -> bool:
        return any(node.role == "maintenance" for node in self.nodes)

    @property
    def synchronising(self) -> bool:
        return any(node.role == "synchronising" for node in self.nodes)

    @property
    def alone(self) -> bool:
        return any(node.role == "primary" and node.mode == "alone" for node in self.nodes)


def ha_overview(*, events: int = 50) -> PairOverview:
    """The pair as the store has it: epoch, both nodes, recent events and
    the exports of diverged messages."""
    return PairOverview(
        pair=HaPair.objects.filter(id=1).first(),
        nodes=list(Node.objects.all()),
        events=list(HaEvent.objects.all()[:events]),
        exports=list(DivergedExport.objects.all()[:20]),
    )


def node_addresses() -> list[str]:
    """Where the nodes answer: the addresses they recorded, primary first."""
    nodes = sorted(Node.objects.exclude(address=""), key=lambda node: node.role != "primary")
    return list(dict.fromkeys(node.address for node in nodes))


def send(op: str, *, addresses: Sequence[str], **fields: Any) -> dict[str, Any]:
    """Send a command to the first node that answers; a refusal is final."""
    if not addresses:
        raise HaNotConfigured(
            "This instance runs no HA pair: no broker node has recorded where it answers "
            "(start one with `python manage.py broker_node`; see docs/ha.md)."
        )
    unreachable: list[str] = []
    for address in addresses:
        try:
            return wire.call(
                address, op, secret=ha_secret(), timeout=COMMAND_TIMEOUT_SECONDS, **fields
            )
        except HaNodeUnreachable as error:
            unreachable.append(error.detail)
    raise HaNodeUnreachable(" ".join(unreachable))


def validate_node_name(name: str) -> str:
    name = name.strip()
    if not re.fullmatch(NODE_NAME_PATTERN, name):
        raise InvalidInput(
            f"{name!r} is not a node name: 1 to {NODE_NAME_MAX_LENGTH} letters, digits, '.', "
            "'_' or '-'.",
            field_errors={"primary": ["Not a node name."]},
        )
    return name


def ha_resolve(*, primary: str, actor: User | None, addresses: Sequence[str]) -> dict[str, Any]:
    """Pick ``primary`` as the survivor of a split brain; the other node
    exports what only it had and rejoins as standby."""
    primary = validate_node_name(primary)
    known = set(Node.objects.values_list("name", flat=True))
    if known and primary not in known:
        raise HaCommandRefused(
            f"There is no node named {primary!r}; the pair is {' and '.join(sorted(known))}."
        )
    answer = send("resolve", addresses=addresses, primary=primary, relay=True)
    _audit("ha.resolve", actor, f"{primary} picked as primary to end the split brain")
    return answer


def ha_switchover(*, actor: User | None, addresses: Sequence[str]) -> dict[str, Any]:
    """Swap the roles: the primary hands over to its synchronised standby."""
    answer = send("switchover", addresses=addresses)
    _audit("ha.switchover", actor, "switchover requested")
    return answer


def ha_status(*, addresses: Sequence[str]) -> dict[str, Any]:
    return send("status", addresses=addresses)


def _audit(action: str, actor: User | None, reason: str) -> None:
    """The admin's request, once a node accepted it. The nodes record the
    role changes that follow themselves; by now the store may have ended
    this session (a switchover does), so a failure here is only logged."""
    try:
        audit_record(action=action, actor=actor, reason=reason)
    except DatabaseError as error:
        logger.warning("%s accepted, but its audit event could not be written: %s", action, error)
