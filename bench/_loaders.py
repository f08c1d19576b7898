"""Fixture loads that write message rows directly, bypassing the services.

A bench times one path; what it needs in place beforehand (a million
messages in every state, a million dead letters, delivered messages ten days
old), or cleared between two runs, would take the services longer than the
measurement, and going through them is not what is measured. Each loader
here says what it writes and why the service may be skipped there. Nothing outside bench/ writes rows this way: the console and
the workers change a message's state only through broker.services.transitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

if TYPE_CHECKING:
    from broker.services.publish import NewMessage

PUT_USER = "bench"
PUT_APPLICATION = "bench"

DELIVERED_SQL = """
UPDATE broker_message
SET state = 'DLVD', attempts = 1, created_at = now() - make_interval(days => %(days)s),
    available_at = now() - make_interval(days => %(days)s),
    enqueued_at = now() - make_interval(days => %(days)s),
    updated_at = now() - make_interval(days => %(days)s) + interval '1 second'
WHERE queue_id = %(queue)s
RETURNING id
"""
DEAD_LETTERED_SQL = """
UPDATE broker_message AS m
SET queue_id = (SELECT id FROM broker_queue WHERE name = %(dlq)s),
    dead_letter = jsonb_build_object('reason', r.reason, 'original_queue', %(origin)s),
    updated_at = now() - interval '1 second'
FROM unnest(%(ids)s::bigint[], %(reasons)s::text[]) AS r(id, reason)
WHERE m.id = r.id
"""
HANDLER_ERROR_SQL = """
UPDATE broker_message AS m
SET queue_id = %(dlq)s, attempts = 1, available_at = now(), enqueued_at = now(),
    updated_at = now(),
    dead_letter = jsonb_build_object(
        'reason', 'handler_error', 'original_queue', %(origin)s::text,
        'time', to_jsonb(now()) #>> '{}', 'put_application', m.put_application,
        'put_user', m.put_user, 'format', m.content_type,
        'error', 'bench: the handler raised')
WHERE m.queue_id = %(origin_id)s
"""
DLNG_LEASE = ", lease_owner = 'bench:1:1', lease_deadline = now() + interval '1 day'"


def copy_batch(
    conn: psycopg.Connection[Any], queue_id: int, messages: Sequence[NewMessage]
) -> None:
    """Writes ``messages`` TBDL on the queue in one transaction with the
    publish service's own COPY writer, on a bare psycopg connection: no
    queue lookup, validation or Django. The rows and their depth counters
    are the service's; what is skipped is checked once per queue by the
    bench, not per message."""
    from broker.services.publish import copy_messages

    with conn.transaction(), conn.cursor() as cursor:
        copy_messages(
            cursor,
            queue_id=queue_id,
            messages=messages,
            put_user=PUT_USER,
            put_application=PUT_APPLICATION,
        )


def age_delivered(conn: psycopg.Connection[Any], queue_id: int, days: int) -> list[int]:
    """Marks every message of the queue DLVD, published and delivered
    ``days`` days ago; returns their ids, sorted. The archive bench needs
    messages past their retention, which no service makes: delivering takes
    a consumer and a worker, and no service can move a clock back."""
    with conn.transaction():
        rows = conn.execute(DELIVERED_SQL, {"days": days, "queue": queue_id}).fetchall()
    return sorted(message_id for (message_id,) in rows)


def spread_states(states: Sequence[tuple[str, int]]) -> None:
    """Sets the state of every message by its id modulo 100 (``("DLVD", 60)``:
    60 of every 100, DLNG ones leased for a day), makes one NDLV in 1,000 a
    format error, then VACUUM ANALYZEs the table. The console bench reads a
    big table in every state; walking a million messages through the
    transitions would take longer than the bench and change nothing it reads."""
    from django.db import connection

    low = 0
    with connection.cursor() as cursor:
        for state, share in states:
            high = low + share
            if state != "TBDL":
                extra = DLNG_LEASE if state == "DLNG" else ""
                cursor.execute(
                    f"UPDATE broker_message SET state = %s{extra} "
                    "WHERE id %% 100 >= %s AND id %% 100 < %s",
                    [state, low, high],
                )
            low = high
        cursor.execute(
            'UPDATE broker_message SET dead_letter = \'{"reason": "format_error"}\'::jsonb '
            "WHERE state = 'NDLV' AND id % 1000 = 7"
        )
        cursor.execute("VACUUM ANALYZE broker_message")


def move_to_dead_letters(*, ids: list[int], reasons: list[str], origin: str, dlq: str) -> None:
    """Moves the messages ``ids`` onto the queue ``dlq`` as dead letters from
    ``origin``, each with its reason, as dead-lettering leaves them, in one
    statement. The dlq bench measures the handler over the dead letters, not
    the deliveries that would have failed to make them."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            DEAD_LETTERED_SQL, {"dlq": dlq, "origin": origin, "ids": ids, "reasons": reasons}
        )


def dead_letter_queue(
    conn: psycopg.Connection[Any], *, dlq_id: int, origin: str, origin_id: int
) -> int:
    """Moves every message of the queue ``origin`` onto the dead-letter queue
    with reason handler_error and the header a failed delivery writes, in one
    transaction; returns how many moved. The replay bench measures the way
    back, from a million dead letters that deliveries would take an hour to
    make."""
    with conn.transaction():
        params = {"dlq": dlq_id, "origin": origin, "origin_id": origin_id}
        return conn.execute(HANDLER_ERROR_SQL, params).rowcount


REPLAY_UNDO_SQL = (
    "DELETE FROM broker_message WHERE queue_id = %(queue)s",
    "DELETE FROM broker_schedulefiring",
    "DELETE FROM broker_replayjob",
    "TRUNCATE broker_replaystage",
)


def replay_undo(url: str, queue_id: int) -> None:
    """Deletes, in one transaction, what a replay wrote: every message of the
    queue it replayed to (the copies, which carry their job), the replay
    jobs (and the schedule firings that name them) and their staging table. The replay bench moves the same dead letters
    four ways and undoes each before the next; no service takes a replay
    back, and the dead letters themselves stay as they were."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for statement in REPLAY_UNDO_SQL:
            conn.execute(statement, {"queue": queue_id})


def queue_empty(url: str, queue_id: int) -> None:
    """Deletes every message of the queue. Between the soak's phases the
    delivered messages of a measuring queue go, so that the next phase starts
    from the same table; purging through the service would also take the
    queue's lock and log an audit row the soak does not measure."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM broker_message WHERE queue_id = %s", [queue_id])


# One row per series number n of a chunk [low, high): of every 100 messages
# (n % 100) 1 is blacklisted, 2 are dead letters (one on each dead-letter
# queue), 1 in flight, 3 failed, 8 waiting and 85 delivered. Each run of 100
# consecutive ids (block n / 100) belongs to one of the standard queues, and
# the block chooses the dead letters' reason: 1 block in 1,000 the rare
# max_messages_reached. Payloads are 1,024 bytes of JSON-ish text: one in 20
# says "express delivery", one in 1,000,003 "recall lot 77-A". Headers carry
# a source, a region (1 in 3 apac) and a tenant (t0 .. t996).
CONSOLE_SEED_SQL = """
INSERT INTO broker_message (
    queue_id, state, payload, content_type, headers, priority, attempts, crash_count,
    lease_owner, lease_deadline, last_error, dead_letter, put_application, put_user,
    created_at, available_at, enqueued_at, updated_at)
SELECT
    CASE WHEN s.n %% 100 IN (1, 2) THEN (%(dlqs)s::bigint[])[s.n %% 100]
         ELSE (%(queues)s::bigint[])[1 + s.block %% %(queue_count)s] END,
    s.state,
    convert_to(rpad(format(
        '{"order": %%s, "customer": "C%%s", "sku": "SKU-%%s", "channel": "%%s", '
        '"note": "%%s", "lines": [', s.n, s.n %% 7919, s.n %% 503,
        (ARRAY['web', 'shop', 'phone', 'partner'])[1 + s.n %% 4],
        CASE WHEN s.n %% 1000003 = 17 THEN 'recall lot 77-A'
             WHEN s.n %% 20 = 3 THEN 'express delivery' ELSE 'standard' END),
        1022, '{"item": 1, "qty": 2}, ') || ']}', 'UTF8'),
    'application/json',
    jsonb_build_object(
        'source', (ARRAY['web', 'batch', 'partner', 'mobile', 'legacy'])[1 + s.block %% 5],
        'region', (ARRAY['eu', 'us', 'apac'])[1 + s.n %% 3],
        'tenant', 't' || s.n %% 997),
    s.n %% 10,
    CASE WHEN s.state = 'TBDL' AND s.n %% 100 > 2 THEN 0 ELSE 1 END,
    CASE s.state WHEN 'NDLV' THEN 2 ELSE 0 END,
    CASE s.state WHEN 'DLNG' THEN 'bench:1:1' ELSE '' END,
    CASE s.state WHEN 'DLNG' THEN now() + interval '1 day' END,
    CASE s.state WHEN 'NDLV' THEN 'bench: the consumer crashed'
                 WHEN 'FAIL' THEN 'bench: failed by an operator' ELSE '' END,
    CASE WHEN s.n %% 100 IN (1, 2) THEN jsonb_build_object(
        'reason', CASE WHEN s.block %% 1000 = 999 THEN 'max_messages_reached'
                       WHEN s.block %% 1000 < 650 THEN 'handler_error'
                       WHEN s.block %% 1000 < 800 THEN 'expired'
                       ELSE 'format_error' END,
        'original_queue', (%(queue_names)s::text[])[1 + s.block %% %(queue_count)s],
        'time', to_jsonb(s.at + interval '1 second') #>> '{}',
        'put_application', 'bench', 'put_user', 'bench', 'format', 'application/json') END,
    'bench', 'bench', s.at, s.at, s.at, s.at + interval '1 second'
FROM (
    SELECT n, n / 100 AS block,
           now() - (%(total)s - n) * interval '100 milliseconds' AS at,
           CASE WHEN n %% 100 = 0 THEN 'NDLV' WHEN n %% 100 IN (1, 2) THEN 'TBDL'
                WHEN n %% 100 = 3 THEN 'DLNG' WHEN n %% 100 < 7 THEN 'FAIL'
                WHEN n %% 100 < 15 THEN 'TBDL' ELSE 'DLVD' END AS state
    FROM generate_series(%(low)s::bigint, %(high)s::bigint - 1) AS n
) AS s
ORDER BY s.n
"""
CONSOLE_SEED_CHUNK = 1_000_000


def seed_console(
    url: str, *, total: int, queues: Sequence[tuple[int, str]], dead_letter_queues: Sequence[int]
) -> None:
    """Writes ``total`` messages of 1 KB over ``queues`` (id, name) and two
    dead-letter queues in every state (``CONSOLE_SEED_SQL``), a million rows
    a statement and a commit, then VACUUM ANALYZEs the table. Every row is
    made in the server from its series number: ten million through the
    publish path and then the transitions would take hours and measure
    nothing the console bench reads. The depth triggers count each
    statement's rows, so the counters hold what the table does."""
    params = {
        "queues": [queue_id for queue_id, _ in queues],
        "queue_names": [name for _, name in queues],
        "queue_count": len(queues),
        "dlqs": list(dead_letter_queues),
        "total": total,
    }
    with psycopg.connect(url, autocommit=True) as conn:
        for low in range(1, total + 1, CONSOLE_SEED_CHUNK):
            high = min(total + 1, low + CONSOLE_SEED_CHUNK)
            conn.execute(CONSOLE_SEED_SQL, {**params, "low": low, "high": high})
        conn.execute("VACUUM (ANALYZE) broker_message")
