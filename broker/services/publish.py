"""Publishing, to a queue or to a topic: validate a batch, then write it in
one transaction within the targets' max-messages limits."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from broker.errors import (
    BatchTooLarge,
    InvalidInput,
    OutsideTopic,
    PayloadTooLarge,
    QueueIsDeadLetter,
    QueueNotFound,
    TopicNotFound,
)
from broker.models import MessageState, Queue, Topic
from broker.services.counting import minute_count, minute_count_ctes
from broker.services.delivery import RELIANCE_LOCK_CLASS, WAKE_CHANNEL, waiting_sql
from broker.services.limits import Limit, discard_excess, lock_and_measure, refuse_if_full
from broker.signals import messages_available
from broker.store.cursors import bound_cursor
from broker.topic_grammar import TopicError, is_under, topic_levels, topic_matches

MAX_HEADERS = 64
MAX_HEADER_NAME_LENGTH = 128
MAX_HEADERS_JSON_BYTES = 16 * 1024
MAX_DELAY_SECONDS = 15 * 60
MAX_EXPIRY_SECONDS = 365 * 24 * 60 * 60


@dataclass(frozen=True)
class NewMessage:
    payload: bytes
    content_type: str = "application/octet-stream"
    headers: Mapping[str, str] = field(default_factory=dict)
    priority: int = 4
    delay_seconds: int = 0
    # Not delivered, but dead-lettered with reason "expired", when still
    # waiting this long after the publish; None: it never expires.
    expires_in_seconds: float | None = None


COPY_COLUMNS = (
    "id",
    "queue_id",
    "payload",
    "content_type",
    "headers",
    "priority",
    "state",
    "available_at",
    "put_application",
    "put_user",
    "created_at",
    "updated_at",
)
COPY_TYPES = (
    "int8",
    "int8",
    "bytea",
    "varchar",
    "jsonb",
    "int2",
    "varchar",
    "timestamptz",
    "varchar",
    "varchar",
    "timestamptz",
    "timestamptz",
)
RESERVE_IDS_SQL = (
    "SELECT now(), array(SELECT nextval(pg_get_serial_sequence('broker_message', 'id'))"
    " FROM generate_series(1, %s))"
)
COPY_SQL = f"COPY broker_message ({', '.join(COPY_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
# A batch in which some message expires writes expires_at too; the others
# leave it to its default (NULL) and keep the narrower row.
EXPIRING_COPY_TYPES = (*COPY_TYPES, "timestamptz")
EXPIRING_COPY_SQL = (
    f"COPY broker_message ({', '.join((*COPY_COLUMNS, 'expires_at'))}) FROM STDIN (FORMAT BINARY)"
)


# A batch of up to INSERT_MAX_MESSAGES messages to one queue without a
# max-messages limit is written by one statement (_INSERT_SQL) that also
# counts it on the queue's minute and announces the queue; outside a
# transaction it commits on its own. Its messages can be claimed one round
# trip after the publish began (their created_at), where the COPY path's
# transaction (BEGIN, ids, COPY, count, announcement, COMMIT) takes seven.
# Bigger batches, and publishes that lock a limit or write several queues,
# go by COPY. One batch of the queue's, committed on its own, also says
# whether a courier waits for the queue's announcements, and relies on it
# (broker.services.delivery): then it needs no wake-up task.
INSERT_MAX_MESSAGES = 100
_INSERT_SQL = f"""
WITH inserted AS (
    INSERT INTO broker_message (
        queue_id, payload, content_type, headers, priority, state, available_at, expires_at,
        put_application, put_user, created_at, updated_at
    )
    SELECT %(queue_id)s, m.payload, m.content_type, m.headers::jsonb, m.priority,
        '{MessageState.TO_BE_DELIVERED.value}', now() + make_interval(secs => m.delay),
        now() + make_interval(secs => m.expiry), %(put_application)s, %(put_user)s, now(), now()
    FROM unnest(
        %(payloads)s::bytea[], %(content_types)s::text[], %(headers)s::text[],
        %(priorities)s::int2[], %(delays)s::float8[], %(expiries)s::float8[]
    ) WITH ORDINALITY AS m(payload, content_type, headers, priority, delay, expiry, n)
    ORDER BY m.n
    RETURNING id
), {minute_count_ctes(published="(SELECT count(*) FROM inserted)::int")}
SELECT array(SELECT id FROM inserted ORDER BY id), pg_notify(%(channel)s, %(queue_id)s::text),
    (SELECT %(rely)s AND EXISTS (
        SELECT FROM pg_stat_activity
        WHERE datname = current_database() AND state = 'idle' AND query = %(courier_waits)s
    ) FROM (
        SELECT pg_advisory_xact_lock_shared(%(reliance_class)s, %(queue_id)s::int4)
        WHERE %(rely)s
    ) AS relying)
"""  # noqa: S608


def _unstorable(text: str) -> str | None:
    """Why PostgreSQL could not store ``text``, or None: its text types hold
    no NUL, and UTF-8 no lone surrogate."""
    if "\x00" in text:
        return "holds a NUL character"
    try:
        text.encode()
    except UnicodeEncodeError:
        return "holds a lone surrogate"
    return None


def _validate(message: NewMessage, index: int, queues: Sequence[Queue]) -> None:
    """Raise for the first rule ``message`` (item ``index`` of its batch)
    breaks, written into each of ``queues``. With none (a topic publish no
    subscription takes) the message's own rules still hold."""

    def invalid(field_name: str, problem: str) -> InvalidInput:
        return InvalidInput(
            f"Message {index}: {problem}",
            field_errors={f"messages[{index}].{field_name}": [problem]},
        )

    if not isinstance(message.payload, bytes):
        raise invalid("payload", "The payload must be bytes.")
    for queue in queues:
        if len(message.payload) > queue.max_payload_bytes:
            raise PayloadTooLarge(
                f"Message {index}: the payload is {len(message.payload):,} bytes; "
                f"queue {queue.name} accepts at most {queue.max_payload_bytes:,}.",
                index=index,
                size=len(message.payload),
                limit=queue.max_payload_bytes,
            )
    if isinstance(message.priority, bool) or not isinstance(message.priority, int):
        raise invalid("priority", "The priority must be a whole number from 0 to 9.")
    if not 0 <= message.priority <= 9:
        raise invalid("priority", f"The priority must be from 0 to 9, not {message.priority}.")
    if isinstance(message.delay_seconds, bool) or not isinstance(message.delay_seconds, int):
        raise invalid("delay_seconds", "The delay must be a whole number of seconds.")
    if not 0 <= message.delay_seconds <= MAX_DELAY_SECONDS:
        raise invalid("delay_seconds", f"The delay must be from 0 to {MAX_DELAY_SECONDS} seconds.")
    expiry = message.expires_in_seconds
    if expiry is not None:
        if isinstance(expiry, bool) or not isinstance(expiry, int | float):
            raise invalid("expires_in_seconds", "The expiry must be a number of seconds.")
        # NaN fails every comparison and infinity the upper bound.
        if not 0 < expiry <= MAX_EXPIRY_SECONDS:
            raise invalid(
                "expires_in_seconds",
                f"The expiry must be more than 0 and at most {MAX_EXPIRY_SECONDS:,} seconds "
                "(365 days).",
            )
    if not message.content_type or len(message.content_type) > 100:
        raise invalid("content_type", "The content type must be 1 to 100 characters.")
    if problem := _unstorable(message.content_type):
        raise invalid("content_type", f"The content type {problem}.")
    if problem := _headers_problem(message.headers):
        raise invalid("headers", problem)


def _headers_problem(headers: Any) -> str | None:
    """What is wrong with a message's ``headers``, or None."""
    if not isinstance(headers, Mapping):
        return "Headers must be a JSON object of string values."
    if len(headers) > MAX_HEADERS:
        return f"At most {MAX_HEADERS} headers are allowed."
    for name, value in headers.items():
        if not isinstance(name, str) or not name or len(name) > MAX_HEADER_NAME_LENGTH:
            return f"Header names must be 1 to {MAX_HEADER_NAME_LENGTH} characters."
        if not isinstance(value, str):
            return f"Header {name!r} must be a string, not {type(value).__name__}."
        if problem := _unstorable(name):
            return f"Header name {name!r} {problem}."
        if problem := _unstorable(value):
            return f"Header {name!r} {problem}."
    if len(json.dumps(headers).encode()) > MAX_HEADERS_JSON_BYTES:
        return f"Headers may take at most {MAX_HEADERS_JSON_BYTES:,} bytes."
    return None


@functools.cache
def _queue_by_name() -> tuple[str, list[str]]:
    """The statement that reads a queue by name, and its columns' attributes."""
    fields = Queue._meta.concrete_fields
    columns = ", ".join(connection.ops.quote_name(field.column) for field in fields)
    return (
        f"SELECT {columns} FROM {Queue._meta.db_table} WHERE name = %s",  # noqa: S608
        [field.attname for field in fields],
    )


def _queue_for_publish(queue_name: str) -> Queue:
    # Read with a statement made once: the ORM compiled its query of the
    # queue's 31 columns on every publish, 0.35 ms of processor time, a
    # quarter of a small publish's. No column needs a converter.
    sql, attributes = _queue_by_name()
    with connection.cursor() as cursor:
        cursor.execute(sql, [queue_name])
        row = cursor.fetchone()
    if row is None:
        raise QueueNotFound(f"There is no queue named {queue_name!r}.")
    queue = Queue.from_db(connection.alias, attributes, row)
    if queue.is_dead_letter:
        raise QueueIsDeadLetter(
            f"{queue.name} is a dead-letter queue; messages arrive there only by dead-lettering."
        )
    return queue


@dataclass(frozen=True)
class TopicDelivery:
    """The copies a topic publish wrote for one subscription."""

    subscription: str
    queue: str
    ids: list[int]


def _check_batch(messages: Sequence[NewMessage]) -> None:
    if not messages:
        raise InvalidInput(
            "A publish needs at least one message.", field_errors={"messages": ["Empty batch."]}
        )
    limit = settings.LAZARETTO_MAX_PUBLISH_BATCH
    if len(messages) > limit:
        raise BatchTooLarge(f"A batch holds at most {limit} messages, not {len(messages)}.")


def messages_publish(
    *,
    queue_name: str,
    messages: Sequence[NewMessage],
    put_user: str = "",
    put_application: str = "",
) -> list[int]:
    """Publish ``messages`` to a queue as TBDL, all or nothing, within the
    queue's max-messages limit.

    Every message is validated before anything is written; one bad item
    rejects the whole batch. The batch is written with one binary COPY, so a
    batch of 1000 costs about as much as a few single inserts. Returns the new
    message ids in the order given.
    """
    _check_batch(messages)
    queue = _queue_for_publish(queue_name)
    written = _publish([Limit.of_queue(queue)], messages, put_user, put_application)
    return written[queue.id]


def topic_publish(
    *,
    topic_name: str,
    messages: Sequence[NewMessage],
    topic_string: str = "",
    put_user: str = "",
    put_application: str = "",
) -> list[TopicDelivery]:
    """Publish ``messages`` on ``topic_string`` (default: the topic's own
    string): one copy into the queue of every subscription whose filter
    matches, in one transaction. A full ``reject_new`` subscription fails
    the whole publish and nothing is written anywhere."""
    _check_batch(messages)
    topic = Topic.objects.filter(name=topic_name).first()
    if topic is None:
        raise TopicNotFound(f"There is no topic named {topic_name!r}.")
    topic_string = topic_string or topic.topic_string
    try:
        levels = topic_levels(topic_string)
    except TopicError as error:
        raise InvalidInput(str(error), field_errors={"topic_string": [str(error)]}) from None
    if not is_under(levels, topic_levels(topic.topic_string)):
        problem = f"The topic string must be {topic.topic_string!r} or below it."
        raise OutsideTopic(problem, field_errors={"topic_string": [problem]})
    subscriptions = [
        subscription
        for subscription in topic.subscriptions.select_related("queue").order_by("name")
        if topic_matches(subscription.topic_filter, topic_string)
    ]
    targets = [
        Limit(
            queue=subscription.queue,
            max_messages=subscription.max_messages,
            overflow=subscription.overflow,
            discard_to_dead_letter=subscription.discard_to_dead_letter,
            owner=f"subscription {subscription.name}",
            subscription=subscription.name,
        )
        for subscription in subscriptions
    ]
    written = _publish(targets, messages, put_user, put_application)
    return [
        TopicDelivery(
            subscription=subscription.name,
            queue=subscription.queue.name,
            ids=written[subscription.queue_id],
        )
        for subscription in subscriptions
    ]


def _publish(
    targets: list[Limit], messages: Sequence[NewMessage], put_user: str, put_application: str
) -> dict[int, list[int]]:
    """Validate, then write the batch into every target queue in one
    transaction, enforcing each target's limit (broker.services.limits).
    Returns the new ids by queue id."""
    queues = [target.queue for target in targets]
    for index, message in enumerate(messages):
        _validate(message, index, queues)
    limited = [target for target in targets if target.max_messages is not None]
    if not limited and len(targets) == 1 and len(messages) <= INSERT_MAX_MESSAGES:
        queue = targets[0].queue
        ids, courier_waits = _insert_announced(
            queue, messages, put_user=put_user[:150], put_application=put_application[:28]
        )
        messages_available.send(
            sender=Queue,
            queue=queue,
            count=len(messages),
            announced=True,
            courier_waits=courier_waits,
        )
        return {queue.id: ids}
    with transaction.atomic():
        if limited:
            depths = lock_and_measure(target.queue.id for target in limited)
            refuse_if_full(limited, depths, len(messages))
        written = {
            target.queue.id: _insert(
                target.queue,
                messages,
                put_user=put_user[:150],
                put_application=put_application[:28],
            )
            for target in targets
        }
        discard_excess(limited)
        for target in targets:
            minute_count(queue_id=target.queue.id, published=len(messages))
            messages_available.send(sender=Queue, queue=target.queue, count=len(messages))
    return written


def _insert_announced(
    queue: Queue, messages: Sequence[NewMessage], *, put_user: str, put_application: str
) -> tuple[list[int], bool]:
    """Write validated messages with _INSERT_SQL; returns their ids in order
    and whether a courier waiting for the queue will claim them. Inside the
    caller's transaction, a savepoint: a failed publish leaves that
    transaction usable, as the COPY path's does; and it does not rely on a
    waiting courier, who would have to wait for that transaction's end."""
    in_transaction = connection.in_atomic_block
    savepoint = transaction.atomic() if in_transaction else nullcontext()
    with savepoint, bound_cursor() as cursor:
        cursor.execute(
            _INSERT_SQL,
            {
                "queue_id": queue.id,
                "payloads": [message.payload for message in messages],
                "content_types": [message.content_type for message in messages],
                "headers": [json.dumps(dict(message.headers)) for message in messages],
                "priorities": [message.priority for message in messages],
                "delays": [float(message.delay_seconds) for message in messages],
                "expiries": [message.expires_in_seconds for message in messages],
                "put_application": put_application,
                "put_user": put_user,
                "channel": WAKE_CHANNEL,
                "rely": not in_transaction and len(messages) <= queue.batch_size,
                "reliance_class": RELIANCE_LOCK_CLASS,
                "courier_waits": waiting_sql(queue.id),
            },
            prepare=True,
        )
        row = cursor.fetchone()
    assert row is not None
    return list(row[0]), bool(row[2])


def _insert(
    queue: Queue, messages: Sequence[NewMessage], *, put_user: str, put_application: str
) -> list[int]:
    with connection.cursor() as cursor:
        return copy_messages(
            cursor.cursor,
            queue_id=queue.id,
            messages=messages,
            put_user=put_user,
            put_application=put_application,
        )


def copy_messages(
    cursor: psycopg.Cursor[Any],
    *,
    queue_id: int,
    messages: Sequence[NewMessage],
    put_user: str,
    put_application: str,
) -> list[int]:
    """Write validated messages with one binary COPY on a raw psycopg cursor,
    inside the caller's transaction; returns their ids in order.

    Ids are reserved up front so COPY (which returns nothing) can write them
    and the caller gets them back in order.
    """
    cursor.execute(RESERVE_IDS_SQL, [len(messages)])
    row = cursor.fetchone()
    assert row is not None
    now, ids = row
    state = MessageState.TO_BE_DELIVERED.value
    expiring = any(message.expires_in_seconds is not None for message in messages)
    with cursor.copy(EXPIRING_COPY_SQL if expiring else COPY_SQL) as copy:
        copy.set_types(EXPIRING_COPY_TYPES if expiring else COPY_TYPES)
        for message_id, message in zip(ids, messages, strict=True):
            available_at = (
                now + timedelta(seconds=message.delay_seconds) if message.delay_seconds else now
            )
            values: tuple[Any, ...] = (
                message_id,
                queue_id,
                message.payload,
                message.content_type,
                Jsonb(dict(message.headers)),
                message.priority,
                state,
                available_at,
                put_application,
                put_user,
                now,
                now,
            )
            if expiring:
                # From the publish: the transaction's now(), as every row's times.
                expiry = message.expires_in_seconds
                values = (*values, None if expiry is None else now + timedelta(seconds=expiry))
            copy.write_row(values)
    return list(ids)
