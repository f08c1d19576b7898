"""The state machine as one table: for every transition, the states a message
may leave from and the state it arrives in. The transition functions of this
package build their SQL guards (``guard``) and their refusals (``refuse``)
from it, so each rule is written once."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NoReturn

from broker.errors import IllegalTransition, MessageNotFound
from broker.models import Message, MessageState, QueueKind

S = MessageState


class Transition(StrEnum):
    CLAIM = "claim"
    ACK = "ack"
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"
    REQUEUE_UNANSWERED = "requeue_unanswered"
    QUARANTINE = "quarantine"
    RELEASE = "release"
    FAIL = "fail"
    PURGE = "purge"
    PURGE_POISON = "purge_poison"
    EXPIRE = "expire"
    FORWARD = "forward"
    RETRY_DEAD_LETTER = "retry_dead_letter"
    DISCARD = "discard"
    DISCARD_OLD = "discard_old"
    PURGE_WAITING = "purge_waiting"
    RESUBMIT = "resubmit"
    REPLAY = "replay"
    ARCHIVE = "archive"


@dataclass(frozen=True)
class Edge:
    # States a message may leave from, on any queue.
    sources: frozenset[str]
    # States it may leave from only while it sits on a dead-letter queue.
    dead_letter_sources: frozenset[str]
    # Where it arrives; None: it is deleted (a resubmit leaves it as it is).
    target: str | None
    # What the transition did, as an operator reads it.
    done: str


def _edge(
    sources: set[str], target: str | None, done: str, *, dead_letter: set[str] | None = None
) -> Edge:
    return Edge(frozenset(sources), frozenset(dead_letter or ()), target, done)


MACHINE: dict[Transition, Edge] = {
    Transition.CLAIM: _edge({S.TO_BE_DELIVERED}, S.DELIVERING, "claimed"),
    Transition.ACK: _edge({S.DELIVERING}, S.DELIVERED, "acknowledged"),
    Transition.RETRY: _edge({S.DELIVERING}, S.TO_BE_DELIVERED, "retried"),
    # To TBDL on the queue's dead-letter queue.
    Transition.DEAD_LETTER: _edge({S.DELIVERING}, S.TO_BE_DELIVERED, "dead-lettered"),
    Transition.REQUEUE_UNANSWERED: _edge({S.DELIVERING}, S.TO_BE_DELIVERED, "requeued as suspects"),
    Transition.QUARANTINE: _edge(
        {S.TO_BE_DELIVERED, S.DELIVERING}, S.NOT_DELIVERABLE, "blacklisted"
    ),
    Transition.RELEASE: _edge({S.NOT_DELIVERABLE}, S.TO_BE_DELIVERED, "released"),
    Transition.FAIL: _edge({S.NOT_DELIVERABLE}, S.FAILED, "failed"),
    Transition.PURGE: _edge({S.NOT_DELIVERABLE}, None, "purged"),
    # The poison action "purge": deleted where it would have been blacklisted.
    Transition.PURGE_POISON: _edge({S.TO_BE_DELIVERED, S.DELIVERING}, None, "purged as poison"),
    # To TBDL on the queue's dead-letter queue, reason "expired".
    Transition.EXPIRE: _edge({S.TO_BE_DELIVERED}, S.TO_BE_DELIVERED, "expired"),
    Transition.FORWARD: _edge(
        set(), S.TO_BE_DELIVERED, "forwarded", dead_letter={S.TO_BE_DELIVERED}
    ),
    Transition.RETRY_DEAD_LETTER: _edge(
        set(), S.TO_BE_DELIVERED, "retried", dead_letter={S.TO_BE_DELIVERED}
    ),
    Transition.DISCARD: _edge(set(), None, "discarded", dead_letter={S.TO_BE_DELIVERED}),
    # Deleted, or moved to the dead-letter queue (TBDL there).
    Transition.DISCARD_OLD: _edge({S.TO_BE_DELIVERED}, None, "discarded"),
    Transition.PURGE_WAITING: _edge({S.TO_BE_DELIVERED}, None, "purged"),
    # The original stays as it is; a corrected copy is published.
    Transition.RESUBMIT: _edge(
        {S.NOT_DELIVERABLE}, None, "resubmitted", dead_letter={S.TO_BE_DELIVERED}
    ),
    # The source stays as it is; a replay job writes a copy to its target.
    Transition.REPLAY: _edge(
        {S.NOT_DELIVERABLE, S.FAILED, S.DELIVERED},
        None,
        "replayed",
        dead_letter={S.TO_BE_DELIVERED},
    ),
    # Deleted once the archive holds it.
    Transition.ARCHIVE: _edge({S.DELIVERED, S.FAILED}, None, "archived"),
}

_STATE_WORDS = {
    S.TO_BE_DELIVERED: "waiting (TBDL)",
    S.DELIVERING: "in-flight (DLNG)",
    S.DELIVERED: "delivered (DLVD)",
    S.NOT_DELIVERABLE: "blacklisted (NDLV)",
    S.FAILED: "failed (FAIL)",
}


def _in(column: str, states: frozenset[str]) -> str:
    return f"{column} IN ({', '.join(repr(str(state)) for state in sorted(states))})"


def guard(transition: Transition, *, message: str = "m", queue: str = "q") -> str:
    """The transition's guard as a SQL condition on the message row aliased
    ``message`` (and, for moves off a dead-letter queue, its queue row
    aliased ``queue``). Made of the table's constants only: the state values
    are literals, so the planner can use the partial indexes they match."""
    edge = MACHINE[transition]
    parts = []
    if edge.sources:
        parts.append(_in(f"{message}.state", edge.sources))
    if edge.dead_letter_sources:
        on_dead_letter = f"{queue}.kind = '{QueueKind.DEAD_LETTER.value}'"
        parts.append(f"({_in(f'{message}.state', edge.dead_letter_sources)} AND {on_dead_letter})")
    return f"({' OR '.join(parts)})"


def allows(transition: Transition, *, state: str, on_dead_letter_queue: bool) -> bool:
    """Whether a message in ``state`` may take ``transition``."""
    edge = MACHINE[transition]
    return state in edge.sources or (on_dead_letter_queue and state in edge.dead_letter_sources)


def _allowed_words(edge: Edge) -> str:
    """``blacklisted (NDLV) messages``, ``waiting (TBDL) messages on a
    dead-letter queue``, or both."""
    phrases = []
    if edge.sources:
        states = " or ".join(_STATE_WORDS[S(state)] for state in sorted(edge.sources))
        phrases.append(f"{states} messages")
    if edge.dead_letter_sources:
        states = " or ".join(_STATE_WORDS[S(state)] for state in sorted(edge.dead_letter_sources))
        phrases.append(f"{states} messages on a dead-letter queue")
    return " and ".join(phrases)


def refuse(transition: Transition, *, message_id: int) -> NoReturn:
    """Explain why ``transition`` changed nothing for one message: it does
    not exist, or is in a state the transition does not start from."""
    row = (
        Message.objects.filter(id=message_id)
        .values_list("state", "queue__name", "queue__kind")
        .first()
    )
    if row is None:
        raise MessageNotFound(f"There is no message {message_id}.")
    state, queue_name, kind = row
    edge = MACHINE[transition]
    if allows(transition, state=state, on_dead_letter_queue=kind == QueueKind.DEAD_LETTER):
        # Another process moved it between the statement and this look.
        raise IllegalTransition(f"Message {message_id} changed meanwhile; it was not {edge.done}.")
    raise IllegalTransition(
        f"Message {message_id} is {state} on {queue_name}; only {_allowed_words(edge)} "
        f"are {edge.done}."
    )
