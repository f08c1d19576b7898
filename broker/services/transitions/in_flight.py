"""A message in delivery: claimed under a worker's lease (TBDL -> DLNG), then
acknowledged (DLVD), put back for a later retry (TBDL), dead-lettered (TBDL
on the dead-letter queue), or, when the delivery ended without an answer,
requeued as a suspect (TBDL): ``crash_count + 1`` when its worker died within
the lease, ``timeout_count + 1`` when the lease ran out first. Each is one
set-based statement for a whole delivery unit; only rows still leased to the
caller move, so a late answer for a message the sweeper already took back
changes nothing.

The suspect back-off. A suspect's first retransmission goes at once: being
in a crashed batch is weak evidence (one message of the batch was to blame).
Each further unanswered delivery, which the message had alone, is strong
evidence, and the suspect waits longer before the next one: the queue's
``suspect_delay_seconds`` after its second, doubling with each one after,
never more than ``MAX_SUSPECT_DELAY_SECONDS``. Only the suspect waits; its
queue and the other suspects go on."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.backends.utils import CursorWrapper

from broker.models import MAX_SUSPECT_DELAY_SECONDS, DeliveredRetention, Message
from broker.services.counting import minute_count, minute_count_ctes, queue_ids_by_name
from broker.services.transitions.blacklist import messages_quarantine
from broker.services.transitions.headers import MAX_ERROR_LENGTH, dead_letter_header
from broker.services.transitions.table import Transition, guard
from broker.store.cursors import bound_cursor

T = Transition


def _due(*, suspect: bool, where: str = "", limit: str = "%(limit)s") -> str:
    """Up to ``limit`` due messages of the queue, crash suspects only or none
    (``suspect``), highest priority first, then oldest, locked with SKIP
    LOCKED so concurrent workers of one queue never wait for each other or
    claim the same message. ``where`` narrows the scan. Index:
    message_ready_idx, or message_suspect_idx for a suspect. ``suspect`` is a
    literal, not a parameter: the statement is prepared, and a generic plan
    would pick one index for both."""
    return f"""
    SELECT m.id FROM broker_message AS m
    WHERE m.queue_id = %(queue_id)s AND {guard(T.CLAIM)} AND m.available_at <= now()
      AND m.suspect = {str(suspect).lower()} AND (m.expires_at IS NULL OR m.expires_at > now())
      {where}
    ORDER BY m.priority DESC, m.id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED"""  # noqa: S608


# A claim that resumes where its courier's last one ended. The ready index
# keeps the entries of messages already delivered until VACUUM removes them,
# and VACUUM can remove none that a transaction older than their delivery
# might still see: while one is open (a long report, a forgotten session),
# a claim from the head of the queue reads every message delivered since, and
# slows down the longer it stays open. So the claim first reads on from the
# last message claimed, within its priority (``after``: one index range),
# and only for what that leaves of ``limit`` reads the rest of the queue from
# its head. The courier claims from the head at least once a second
# (``broker.services.delivery``), so a message of higher priority, or a retry
# that fell due behind the point, waits at most that long.
_AFTER = "m.priority = %(after_priority)s AND m.id > %(after_id)s"
_RESUMED_DUE = f"""
resumed AS ({_due(suspect=False, where=f"AND {_AFTER}")}
), rest AS ({
    _due(
        suspect=False,
        where=f"AND NOT ({_AFTER})",
        limit="%(limit)s - (SELECT count(*) FROM resumed)",
    )
}
), due AS (SELECT id FROM resumed UNION ALL SELECT id FROM rest)"""  # noqa: S608


def _claim_ctes(*, suspect: bool, resumed: bool = False) -> str:
    """The claim of due messages (the ``claimed`` CTE), crash suspects only
    or none (``suspect``), from the head of the queue or ``resumed`` after a
    point. They become DLNG under this worker's lease and count the
    attempt. The update fetches them by key (``id = ANY`` of the due ids):
    joined to ``due`` instead, a prepared statement's generic plan, which
    cannot tell how few rows ``due`` returns (the resumed claim's ``rest``
    is LIMIT limit minus a count), hashed the whole live partition to find
    them, 17 ms for a batch of 100 out of 24,000 waiting."""
    due = _RESUMED_DUE if resumed else f"due AS ({_due(suspect=suspect)}\n)"
    return f"""{due}, claimed AS (
    UPDATE broker_message AS m
    SET state = 'DLNG', lease_owner = %(owner)s,
        lease_deadline = now() + make_interval(secs => %(lease_seconds)s),
        attempts = m.attempts + 1, updated_at = now()
    WHERE m.id = ANY(ARRAY(SELECT id FROM due)) AND {guard(T.CLAIM)}
    RETURNING m.id, m.priority, m.payload, m.content_type, m.headers::text, m.attempts
)"""  # noqa: S608


CLAIM_SQL = f"WITH {_claim_ctes(suspect=False)} SELECT * FROM claimed"  # noqa: S608
CLAIM_SUSPECT_SQL = f"WITH {_claim_ctes(suspect=True)} SELECT * FROM claimed"  # noqa: S608
CLAIM_RESUMED_SQL = f"WITH {_claim_ctes(suspect=False, resumed=True)} SELECT * FROM claimed"  # noqa: S608

# The acknowledgement deletes the messages from the live partition and
# inserts them, DLVD, into the delivered one (migration 0011), rather than
# updating their state: a claim, sweep or expiry that meets one of these rows
# in a concurrent lock then finds it gone and skips it, where a row the UPDATE
# of the partition key had moved would fail its statement ("tuple to be locked
# was already moved to another partition"). The depth trigger counts the
# delete and the insert. Joined on the ids (primary key lookups) rather than
# "id = ANY(…)". message_in_flight_idx, which holds DLNG rows and the dead
# entries of every message delivered since the last VACUUM, names the lease
# in its predicate, not the state, so that the planner cannot read it whole
# instead (migration 0013).
_MESSAGE_COLUMNS = [field.column for field in Message._meta.concrete_fields]
# What is inserted of each acknowledged message follows its queue's
# delivered_retention as the queue row reads at the acknowledgement: the
# whole message ("full"), all but the payload ("headers": a null payload),
# or nothing ("none": the delete is all).
_ACKNOWLEDGED = {
    "payload": f"CASE WHEN q.delivered_retention = '{DeliveredRetention.FULL}' THEN a.payload END",
    "state": "'DLVD'",
    "lease_owner": "''",
    "lease_deadline": "NULL",
    "suspect": "false",
    "updated_at": "now()",
}
_ACK_CTES = f"""
acked AS (
    DELETE FROM broker_message AS m
    USING unnest(%(ids)s::bigint[]) AS a(id)
    WHERE m.id = a.id AND {guard(T.ACK)} AND m.lease_owner = %(owner)s
    RETURNING m.*
), delivered AS (
    INSERT INTO broker_message ({", ".join(_MESSAGE_COLUMNS)})
    SELECT {", ".join(_ACKNOWLEDGED.get(column, f"a.{column}") for column in _MESSAGE_COLUMNS)}
    FROM acked AS a JOIN broker_queue AS q ON q.id = a.queue_id
    WHERE q.delivered_retention <> '{DeliveredRetention.NONE}'
)"""  # noqa: S608

# The ack alone, uncounted: the benches' bare loop, the floor any delivery
# path is measured against. Returns each message's time from its publish to
# this ack, on the database's clock (the delivery latency /metrics shows).
BARE_ACK_SQL = f"""
WITH {_ACK_CTES}
SELECT extract(epoch FROM now() - created_at)::float8 AS seconds FROM acked
"""  # noqa: S608

# The ack that also counts the delivery unit on its queue (delivered: the
# rows it acknowledged; handler_errors: a parameter), in one statement:
# outside a transaction, one commit settles a batch its consumer
# acknowledged whole.
ACK_SQL = f"""
WITH {_ACK_CTES}, {
    minute_count_ctes(
        delivered="(SELECT count(*) FROM acked)::int", handler_errors="%(handler_errors)s::int"
    )
}
SELECT extract(epoch FROM now() - created_at)::float8 AS seconds FROM acked
"""  # noqa: S608


# The counted ack of one batch and the claim of the queue's next one (no
# suspects) under the same lease, in one statement: a worker that goes on
# delivering makes one commit per batch. The two touch different rows (DLNG
# leased to the caller, and TBDL). A row per message claimed (NULL, then the
# claim's columns), then a row per message acknowledged (its latency, the
# rest NULL): each value once, whatever the batch size.
#
# The claim runs first, as soon as the statement has its snapshot. A row
# that another courier claimed and committed after that snapshot still looks
# due to this claim's scan: FOR UPDATE then locks the row's new version,
# finds it no longer due and skips it, but keeps the lock until this
# statement commits, and the other courier's ack of that row waits for it.
# Run after the ack, the scan came a millisecond or more after the snapshot,
# time enough for the other courier's claim to commit in between: with two
# couriers draining one queue, four acks in five waited for the other's
# statement.
def _ack_counted_claim_sql(*, resumed: bool) -> str:
    return f"""
WITH {_ACK_CTES}, {
        minute_count_ctes(
            delivered="(SELECT count(*) FROM acked)::int", handler_errors="%(handler_errors)s::int"
        )
    }, {_claim_ctes(suspect=False, resumed=resumed)}
SELECT NULL::float8, c.* FROM claimed AS c
UNION ALL
SELECT extract(epoch FROM now() - created_at)::float8, NULL, NULL, NULL, NULL, NULL, NULL
FROM acked
"""  # noqa: S608


_ACK_COUNTED_CLAIM_SQL = _ack_counted_claim_sql(resumed=False)
_ACK_COUNTED_CLAIM_RESUMED_SQL = _ack_counted_claim_sql(resumed=True)

_RETRY_SQL = f"""
UPDATE broker_message AS m
SET state = 'TBDL', lease_owner = '', lease_deadline = NULL,
    available_at = now() + make_interval(secs => r.delay), last_error = r.error,
    updated_at = now()
FROM unnest(%(ids)s::bigint[], %(delays)s::float8[], %(errors)s::text[]) AS r(id, delay, error)
WHERE m.id = r.id AND {guard(T.RETRY)} AND m.lease_owner = %(owner)s
"""  # noqa: S608

# Locks the messages still leased to the caller and reads what their
# dead-letter headers need, in id order (the order every batch write uses).
_DEAD_LETTER_READ_SQL = f"""
SELECT m.id, q.name, q.dead_letter_queue_id, m.put_application, m.put_user, m.content_type
FROM broker_message AS m JOIN broker_queue AS q ON q.id = m.queue_id
WHERE m.id = ANY(%(ids)s) AND {guard(T.DEAD_LETTER)} AND m.lease_owner = %(owner)s
ORDER BY m.id
FOR UPDATE OF m
"""  # noqa: S608
_DEAD_LETTER_SQL = """
UPDATE broker_message AS m
SET state = 'TBDL', queue_id = d.queue_id, dead_letter = d.header, last_error = d.error,
    lease_owner = '', lease_deadline = NULL, suspect = false, expires_at = NULL,
    available_at = now(), enqueued_at = now(), updated_at = now()
FROM jsonb_to_recordset(%(rows)s::jsonb) AS d(id bigint, queue_id bigint, header jsonb, error text)
WHERE m.id = d.id
"""

# A delivery ended without an answer when its worker is dead (its lease owner
# is in %(dead)s) or when it outlived its lease by %(overdue)s seconds (the
# time Celery takes to kill a hung task, and some): a worker that died before
# the lease ran out crashed; past it, the delivery timed out. SKIP LOCKED: a
# row another transaction is settling right now (an ack in progress, another
# sweeper) is left for the next sweep instead of waited on. Index:
# message_in_flight_idx (lease_deadline IS NOT NULL, which only DLNG has).
_REQUEUE_UNANSWERED_SQL = f"""
WITH ended AS (
    SELECT m.id, m.lease_owner, m.lease_owner = ANY(%(dead)s) AND m.lease_deadline >= now() AS crashed
    FROM broker_message AS m
    WHERE {guard(T.REQUEUE_UNANSWERED)} AND m.lease_deadline IS NOT NULL
      AND (m.lease_deadline < now() - make_interval(secs => %(overdue)s)
           OR m.lease_owner = ANY(%(dead)s))
    FOR UPDATE SKIP LOCKED
), counted AS (
    SELECT m.id, e.crashed, e.lease_owner,
           m.crash_count + e.crashed::int AS crash_count,
           m.timeout_count + (NOT e.crashed)::int AS timeout_count
    FROM ended AS e JOIN broker_message AS m ON m.id = e.id AND {guard(T.REQUEUE_UNANSWERED)}
)
UPDATE broker_message AS m
SET state = 'TBDL', suspect = true, crash_count = c.crash_count,
    timeout_count = c.timeout_count, lease_owner = '', lease_deadline = NULL,
    updated_at = now(),
    available_at = now() + make_interval(secs => CASE
        WHEN c.crash_count + c.timeout_count <= 1 THEN 0
        ELSE least(q.suspect_delay_seconds * 2 ^ (c.crash_count + c.timeout_count - 2),
                   {MAX_SUSPECT_DELAY_SECONDS})
    END),
    last_error = CASE WHEN c.crashed THEN 'the delivering worker died'
                      ELSE 'no answer within the lease (' || q.lease_seconds || ' s)' END
FROM counted AS c, broker_queue AS q
WHERE m.id = c.id AND {guard(T.REQUEUE_UNANSWERED)} AND q.id = m.queue_id
RETURNING m.id, m.queue_id, c.crashed, m.crash_count, m.timeout_count, m.attempts,
          q.crash_threshold, q.poison_limit, q.name, c.lease_owner
"""  # noqa: S608


# The statements every delivery unit runs go through ``bound_cursor``:
# planned once per connection. For the ack, whose CTEs reach two partitions,
# four tables and their triggers, planning cost as much as running it on a
# batch of 100. The claims ask for their rows in binary (``binary=True``): a
# payload comes as its bytes, where in text the server writes it out in hex,
# twice its size, for the worker to decode again. Headers come as text
# (``headers::text``): most messages have none, and ``_headers`` parses only
# the others.


@dataclass(frozen=True)
class Claimed:
    """A message as its consumer gets it."""

    id: int
    priority: int
    payload: bytes
    content_type: str
    headers: dict[str, str]
    attempts: int


@dataclass(frozen=True)
class Retry:
    message_id: int
    delay_seconds: float
    error: str


@dataclass(frozen=True)
class DeadLetterCause:
    reason: str
    error: str


@dataclass(frozen=True)
class Unanswered:
    """A message requeued after a delivery that ended without an answer, with
    what decides whether it is poison."""

    id: int
    queue_id: int
    # This delivery ended in a crash (else in a timeout).
    crashed: bool
    crash_count: int
    timeout_count: int
    attempts: int
    crash_threshold: int
    poison_limit: int
    queue_name: str = ""
    # The lease this delivery ended under: the worker (host:pid) that had it.
    lease_owner: str = ""

    @property
    def retransmissions(self) -> int:
        """Deliveries of the message that ended without an answer."""
        return self.crash_count + self.timeout_count


def messages_claim(
    *,
    queue_id: int,
    owner: str,
    lease_seconds: float,
    limit: int,
    suspect: bool,
    after: tuple[int, int] | None = None,
) -> list[Claimed]:
    """TBDL -> DLNG for up to ``limit`` due messages of a queue, highest
    priority first, then oldest, under ``owner``'s lease of ``lease_seconds``;
    crash suspects only, or none (``suspect``); those after ``after``
    (priority, id) first, when given (``_RESUMED_DUE``; not for suspects).
    One statement, so called outside a transaction it commits at once
    (autocommit, no BEGIN or COMMIT round trip): the lease must be visible
    before the consumer runs."""
    sql = CLAIM_SUSPECT_SQL if suspect else CLAIM_SQL if after is None else CLAIM_RESUMED_SQL
    with bound_cursor() as cursor:
        cursor.execute(
            sql,
            {
                "queue_id": queue_id,
                "limit": limit,
                "owner": owner,
                "lease_seconds": lease_seconds,
                **_after(after),
            },
            prepare=True,
            binary=True,
        )
        return _claimed(cursor.fetchall())


def _after(after: tuple[int, int] | None) -> dict[str, int]:
    if after is None:
        return {}
    priority, message_id = after
    return {"after_priority": priority, "after_id": message_id}


def _claimed(rows: Sequence[Sequence[Any]]) -> list[Claimed]:
    """The claim's rows as the consumer gets them, highest priority first,
    then oldest."""
    claimed = [
        Claimed(id, priority, payload, content_type, _headers(headers), attempts)
        for id, priority, payload, content_type, headers, attempts in rows
    ]
    claimed.sort(key=lambda message: (-message.priority, message.id))
    return claimed


def _headers(text: str) -> dict[str, str]:
    # Most messages carry none: no parse for those.
    return {} if text == "{}" else json.loads(text)


def _id_array(ids: Sequence[int]) -> str:
    """Message ids as a bigint[] literal (the statement casts it). psycopg
    dumps a list of ints by looking for the widest of them first: 7 % of a
    worker's time at batch 100."""
    return "{" + ",".join(map(str, ids)) + "}"


def messages_ack(
    *, queue_id: int, message_ids: Sequence[int], owner: str, handler_errors: int = 0
) -> list[float]:
    """DLNG -> DLVD for the messages of queue ``queue_id`` still leased to
    ``owner`` (their consumer handled them), and in the same statement the
    messages acknowledged (delivered) and ``handler_errors`` added to the
    queue's per-minute counts (``broker.services.counting.minute_count``).
    Returns, for each message acknowledged, the seconds from its publish to
    this ack. In the caller's transaction; outside one it commits at once."""
    with bound_cursor() as cursor:
        cursor.execute(
            ACK_SQL,
            {
                "ids": _id_array(message_ids),
                "owner": owner,
                "queue_id": queue_id,
                "handler_errors": handler_errors,
            },
            prepare=True,
        )
        return [seconds for (seconds,) in cursor.fetchall()]


def messages_ack_and_claim(
    *,
    queue_id: int,
    message_ids: Sequence[int],
    owner: str,
    handler_errors: int,
    lease_seconds: float,
    limit: int,
    after: tuple[int, int] | None = None,
) -> tuple[list[float], list[Claimed]]:
    """``messages_ack`` and, in the same statement, ``messages_claim``
    of up to ``limit`` due messages of the queue (no suspects; ``after`` as
    there) under the same lease. Returns the ack's latencies and the
    messages claimed. Outside a transaction it commits at once."""
    with bound_cursor() as cursor:
        cursor.execute(
            _ACK_COUNTED_CLAIM_SQL if after is None else _ACK_COUNTED_CLAIM_RESUMED_SQL,
            {
                "ids": _id_array(message_ids),
                "owner": owner,
                "queue_id": queue_id,
                "handler_errors": handler_errors,
                "lease_seconds": lease_seconds,
                "limit": limit,
                **_after(after),
            },
            prepare=True,
            binary=True,
        )
        rows = cursor.fetchall()
    latencies = [row[0] for row in rows if row[0] is not None]
    return latencies, _claimed([row[1:] for row in rows if row[0] is None])


def messages_retry(*, retries: Sequence[Retry], owner: str) -> int:
    """DLNG -> TBDL, due again after each one's delay, for the messages
    still leased to ``owner`` whose consumer failed with retries left.
    Runs in the caller's transaction; returns how many were put back."""
    if not retries:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            _RETRY_SQL,
            {
                "ids": [retry.message_id for retry in retries],
                "delays": [retry.delay_seconds for retry in retries],
                "errors": [retry.error[:MAX_ERROR_LENGTH] for retry in retries],
                "owner": owner,
            },
        )
        return cursor.rowcount


def messages_dead_letter(*, causes: Mapping[int, DeadLetterCause], owner: str) -> list[int]:
    """DLNG -> TBDL on the queue's dead-letter queue, with a dead-letter
    header saying why, for the messages still leased to ``owner``. A message
    whose queue has no dead-letter queue is blacklisted instead (NDLV), its
    reason saying so. Runs in the caller's transaction; returns the ids that
    left delivery either way."""
    if not causes:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_DEAD_LETTER_READ_SQL, {"ids": list(causes), "owner": owner})
        return dead_letter_locked(cursor, rows=cursor.fetchall(), causes=causes)


def dead_letter_locked(
    cursor: CursorWrapper,
    *,
    rows: Sequence[tuple[int, str, int | None, str, str, str]],
    causes: Mapping[int, DeadLetterCause],
) -> list[int]:
    """Move messages the caller has locked to TBDL on their queue's
    dead-letter queue with a dead-letter header from ``causes``, or blacklist
    them when their queue has none. ``rows`` are (id, queue name, dead-letter
    queue id, put application, put user, content type). Returns the ids that
    moved either way."""
    moves = []
    nowhere: dict[int, str] = {}
    for message_id, queue_name, target, application, user, content_type in rows:
        cause = causes[message_id]
        if target is None:
            nowhere[message_id] = (
                f"{cause.reason}, and queue {queue_name} has no dead-letter queue: {cause.error}"
            )
            continue
        header = dead_letter_header(
            reason=cause.reason,
            original_queue=queue_name,
            put_application=application,
            put_user=user,
            content_type=content_type,
            error=cause.error,
        )
        moves.append(
            {"id": message_id, "queue_id": target, "header": header, "error": header["error"]}
        )
    if moves:
        cursor.execute(_DEAD_LETTER_SQL, {"rows": json.dumps(moves)})
        moved_from = Counter(queue_name for _, queue_name, target, *_ in rows if target is not None)
        for name, queue_id in queue_ids_by_name(moved_from).items():
            minute_count(queue_id=queue_id, dead_lettered=moved_from[name])
    return sorted([move["id"] for move in moves] + messages_quarantine(reasons=nowhere))


def messages_requeue_unanswered(
    *, dead_owners: Sequence[str], overdue_seconds: float
) -> list[Unanswered]:
    """DLNG -> TBDL as a suspect for every delivery whose lease owner is in
    ``dead_owners`` (its worker died: a crash if within the lease, else a
    timeout) or that outlived its lease by ``overdue_seconds`` (a timeout),
    each due again after its evidence-based back-off. Runs in the caller's
    transaction; the caller decides which of them are poison."""
    with connection.cursor() as cursor:
        cursor.execute(
            _REQUEUE_UNANSWERED_SQL, {"dead": list(dead_owners), "overdue": overdue_seconds}
        )
        return [Unanswered(*row) for row in cursor.fetchall()]
