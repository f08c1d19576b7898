"""The blacklist: the way into NDLV (quarantine) and the operator's ways out
(release, fail, purge). A blacklisted message is never delivered again
automatically; its payload is dumped to a file for the operator, and every
move in or out leaves an audit event."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.db import connection, transaction

from broker.models import Message, PoisonAction, Queue
from broker.services.alarms import Alarm, alarms_record
from broker.services.audit import Actor, AuditEntry, audit_record_many
from broker.services.dumps import dump_write
from broker.services.transitions.table import Transition, guard, refuse
from broker.signals import messages_available

T = Transition

# The guard is the transition: only messages still waiting or in flight are
# set aside, so a message delivered meanwhile stays delivered. Both return the
# same columns: what the dump, the audit event and the alarm need.
_SET_ASIDE_COLUMNS = """
m.id, q.id, q.name, q.alarm_webhook_url, m.payload, m.content_type, m.headers,
m.attempts, m.crash_count, m.timeout_count, m.last_error, m.dead_letter,
m.put_application, m.put_user, m.created_at
"""
_QUARANTINE_SQL = f"""
UPDATE broker_message AS m
SET state = 'NDLV', lease_owner = '', lease_deadline = NULL, updated_at = now()
FROM broker_queue AS q
WHERE m.id = ANY(%(ids)s) AND {guard(T.QUARANTINE)} AND q.id = m.queue_id
RETURNING {_SET_ASIDE_COLUMNS}
"""  # noqa: S608
# The poison action "purge": only messages of queues that chose it.
_PURGE_POISON_SQL = f"""
DELETE FROM broker_message AS m USING broker_queue AS q
WHERE m.id = ANY(%(ids)s) AND {guard(T.PURGE_POISON)} AND q.id = m.queue_id
  AND q.poison_action = '{PoisonAction.PURGE.value}'
RETURNING {_SET_ASIDE_COLUMNS}
"""  # noqa: S608
_DUMP_PATH_SQL = """
UPDATE broker_message AS m SET dump_path = d.path
FROM unnest(%(ids)s::bigint[], %(paths)s::text[]) AS d(id, path)
WHERE m.id = d.id
"""
_SET_ASIDE_NAMES = (
    "id",
    "queue_id",
    "queue",
    "queue_webhook_url",
    "payload",
    "content_type",
    "headers",
    "attempts",
    "crash_count",
    "timeout_count",
    "last_error",
    "dead_letter",
    "put_application",
    "put_user",
    "created_at",
)


def messages_quarantine(*, reasons: Mapping[int, str]) -> list[int]:
    """TBDL/DLNG -> NDLV for each message id in ``reasons``, dumping each
    payload to a file, writing one audit event per message with its reason
    and raising a poison alarm (``broker.services.alarms``). Runs in the
    caller's transaction; returns the ids actually blacklisted."""
    return _set_aside(_QUARANTINE_SQL, PoisonAction.QUARANTINE, reasons)


def messages_purge_poison(*, reasons: Mapping[int, str]) -> list[int]:
    """TBDL/DLNG -> deleted for each message id in ``reasons`` whose queue's
    poison action is purge, dumping each payload to a file first; the audit
    event and the poison alarm keep its id, queue, reason and dump path.
    Runs in the caller's transaction; returns the ids actually purged."""
    return _set_aside(_PURGE_POISON_SQL, PoisonAction.PURGE, reasons)


def messages_set_aside_poison(*, reasons: Mapping[int, str]) -> tuple[list[int], list[int]]:
    """Apply each message's queue's poison action: purge, or quarantine
    (the default). Runs in the caller's transaction; returns the ids
    quarantined and the ids purged."""
    purged = messages_purge_poison(reasons=reasons)
    rest = {
        message_id: reason for message_id, reason in reasons.items() if message_id not in purged
    }
    return messages_quarantine(reasons=rest), purged


def _set_aside(sql: str, action: PoisonAction, reasons: Mapping[int, str]) -> list[int]:
    if not reasons:
        return []
    with connection.cursor() as cursor:
        cursor.execute(sql, {"ids": list(reasons)})
        rows = [dict(zip(_SET_ASIDE_NAMES, row, strict=True)) for row in cursor.fetchall()]
        for row in rows:  # jsonb arrives as text through Django's connection
            row["headers"] = json.loads(row["headers"])
            row["dead_letter"] = json.loads(row["dead_letter"]) if row["dead_letter"] else None
        paths = [str(dump_write(message=_dumped(row), reason=reasons[row["id"]])) for row in rows]
        ids = [row["id"] for row in rows]
        if ids and action == PoisonAction.QUARANTINE:
            cursor.execute(_DUMP_PATH_SQL, {"ids": ids, "paths": paths})
    audit_record_many(
        entries=(
            AuditEntry(
                action=_AUDIT_ACTIONS[action],
                queue_name=row["queue"],
                message_id=row["id"],
                reason=reasons[row["id"]],
                details={
                    "dump_path": path,
                    "crash_count": row["crash_count"],
                    "timeout_count": row["timeout_count"],
                    "attempts": row["attempts"],
                },
            )
            for row, path in zip(rows, paths, strict=True)
        )
    )
    alarms_record(
        alarms=[
            Alarm(
                queue_id=row["queue_id"],
                queue_name=row["queue"],
                message_id=row["id"],
                action=action.value,
                reason=reasons[row["id"]],
                crash_count=row["crash_count"],
                timeout_count=row["timeout_count"],
                attempts=row["attempts"],
                dump_path=path,
                queue_webhook_url=row["queue_webhook_url"],
            )
            for row, path in zip(rows, paths, strict=True)
        ]
    )
    return ids


_AUDIT_ACTIONS = {
    PoisonAction.QUARANTINE: "message_quarantine",
    PoisonAction.PURGE: "message_purge_poison",
}


def _dumped(row: dict[str, Any]) -> dict[str, Any]:
    """What the dump file keeps of a message: everything but the queue's
    alarm webhook, which is configuration, not message data."""
    return {key: value for key, value in row.items() if key != "queue_webhook_url"}


# Operator actions, set-based so that a bulk job and a single click share one
# statement each; RETURNING tells which messages the guard let through.
_RELEASE_SQL = f"""
UPDATE broker_message AS m
SET state = 'TBDL', attempts = 0, crash_count = 0, timeout_count = 0, suspect = false,
    available_at = now(), enqueued_at = now(), lease_owner = '', lease_deadline = NULL, updated_at = now()
FROM broker_queue AS q
WHERE m.id = ANY(%s) AND {guard(T.RELEASE)} AND q.id = m.queue_id
RETURNING m.id, q.name, m.dump_path
"""  # noqa: S608
_FAIL_SQL = f"""
UPDATE broker_message AS m SET state = 'FAIL', updated_at = now()
FROM broker_queue AS q
WHERE m.id = ANY(%s) AND {guard(T.FAIL)} AND q.id = m.queue_id
RETURNING m.id, q.name, m.dump_path
"""  # noqa: S608
_PURGE_SQL = f"""
DELETE FROM broker_message AS m USING broker_queue AS q
WHERE m.id = ANY(%s) AND {guard(T.PURGE)} AND q.id = m.queue_id
RETURNING m.id, q.name, m.dump_path
"""  # noqa: S608


def _triage(
    sql: str, action: str, message_ids: Sequence[int], actor: Actor, reason: str
) -> list[tuple[int, str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, [list(message_ids)])
        rows: list[tuple[int, str, str]] = cursor.fetchall()
    audit_record_many(
        entries=(
            AuditEntry(
                action=action,
                queue_name=queue_name,
                message_id=message_id,
                reason=reason,
                details={"dump_path": dump_path} if action == "message_purge" else {},
            )
            for message_id, queue_name, dump_path in rows
        ),
        actor=actor,
    )
    return rows


@transaction.atomic
def messages_release(*, message_ids: Sequence[int], actor: Actor, reason: str = "") -> list[int]:
    """NDLV -> TBDL for the blacklisted messages among ``message_ids``, with
    counters reset and suspicion cleared; they join the back of their queue.
    Others are left alone. One audit event each; returns the ids released."""
    rows = _triage(_RELEASE_SQL, "message_release", message_ids, actor, reason)
    released = Counter(queue_name for _, queue_name, _ in rows)
    for queue in Queue.objects.filter(name__in=released):
        messages_available.send(sender=Queue, queue=queue, count=released[queue.name])
    return [message_id for message_id, _, _ in rows]


@transaction.atomic
def messages_fail(*, message_ids: Sequence[int], actor: Actor, reason: str = "") -> list[int]:
    """NDLV -> FAIL (terminal) for the blacklisted messages among
    ``message_ids``; others are left alone. One audit event each; returns
    the ids failed."""
    rows = _triage(_FAIL_SQL, "message_fail", message_ids, actor, reason)
    return [message_id for message_id, _, _ in rows]


@transaction.atomic
def messages_purge(*, message_ids: Sequence[int], actor: Actor, reason: str = "") -> list[int]:
    """NDLV -> deleted for the blacklisted messages among ``message_ids``;
    others are left alone. Each audit event keeps the message's id, queue
    and dump file; returns the ids purged."""
    rows = _triage(_PURGE_SQL, "message_purge", message_ids, actor, reason)
    return [message_id for message_id, _, _ in rows]


TRIAGE: dict[str, Callable[..., list[int]]] = {
    "release": messages_release,
    "fail": messages_fail,
    "purge": messages_purge,
}
TRIAGE_ACTIONS = tuple(TRIAGE)


def _one(transition: Transition, message_id: int, acted: list[int]) -> None:
    if not acted:
        refuse(transition, message_id=message_id)


@transaction.atomic
def message_release(*, message_id: int, actor: Actor, reason: str = "") -> Message:
    """NDLV -> TBDL for one message (see ``messages_release``)."""
    _one(
        T.RELEASE,
        message_id,
        messages_release(message_ids=[message_id], actor=actor, reason=reason),
    )
    return Message.objects.select_related("queue").get(id=message_id)


@transaction.atomic
def message_fail(*, message_id: int, actor: Actor, reason: str = "") -> Message:
    """NDLV -> FAIL for one message (see ``messages_fail``)."""
    _one(T.FAIL, message_id, messages_fail(message_ids=[message_id], actor=actor, reason=reason))
    return Message.objects.select_related("queue").get(id=message_id)


@transaction.atomic
def message_purge(*, message_id: int, actor: Actor, reason: str = "") -> None:
    """NDLV -> deleted for one message (see ``messages_purge``)."""
    _one(T.PURGE, message_id, messages_purge(message_ids=[message_id], actor=actor, reason=reason))
