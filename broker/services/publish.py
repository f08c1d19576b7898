"""Publishing: validate a batch, then write it in one transaction."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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
    PayloadTooLarge,
    QueueIsDeadLetter,
    QueueNotFound,
)
from broker.models import MessageState, Queue
from broker.signals import messages_published

MAX_HEADERS = 64
MAX_HEADER_NAME_LENGTH = 128
MAX_HEADERS_JSON_BYTES = 16 * 1024
MAX_DELAY_SECONDS = 15 * 60


@dataclass(frozen=True)
class NewMessage:
    payload: bytes
    content_type: str = "application/octet-stream"
    headers: Mapping[str, str] = field(default_factory=dict)
    priority: int = 4
    delay_seconds: int = 0


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


def _validate(message: NewMessage, index: int, queue: Queue) -> None:
    """Raise for the first rule ``message`` (item ``index`` of its batch) breaks."""

    def invalid(field_name: str, problem: str) -> InvalidInput:
        return InvalidInput(
            f"Message {index}: {problem}",
            field_errors={f"messages[{index}].{field_name}": [problem]},
        )

    if not isinstance(message.payload, bytes):
        raise invalid("payload", "The payload must be bytes.")
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
    if not message.content_type or len(message.content_type) > 100:
        raise invalid("content_type", "The content type must be 1 to 100 characters.")
    headers = message.headers
    if not isinstance(headers, Mapping):
        raise invalid("headers", "Headers must be a JSON object of string values.")
    if len(headers) > MAX_HEADERS:
        raise invalid("headers", f"At most {MAX_HEADERS} headers are allowed.")
    for name, value in headers.items():
        if not isinstance(name, str) or not name or len(name) > MAX_HEADER_NAME_LENGTH:
            raise invalid(
                "headers", f"Header names must be 1 to {MAX_HEADER_NAME_LENGTH} characters."
            )
        if not isinstance(value, str):
            raise invalid(
                "headers", f"Header {name!r} must be a string, not {type(value).__name__}."
            )
    if len(json.dumps(headers).encode()) > MAX_HEADERS_JSON_BYTES:
        raise invalid("headers", f"Headers may take at most {MAX_HEADERS_JSON_BYTES:,} bytes.")


def _queue_for_publish(queue_name: str) -> Queue:
    try:
        queue = Queue.objects.get(name=queue_name)
    except Queue.DoesNotExist:
        raise QueueNotFound(f"There is no queue named {queue_name!r}.") from None
    if queue.is_dead_letter:
        raise QueueIsDeadLetter(
            f"{queue.name} is a dead-letter queue; messages arrive there only by dead-lettering."
        )
    return queue


def messages_publish(
    *,
    queue_name: str,
    messages: Sequence[NewMessage],
    put_user: str = "",
    put_application: str = "",
) -> list[int]:
    """Publish ``messages`` to a queue as TBDL, all or nothing.

    Every message is validated before anything is written; one bad item
    rejects the whole batch. The batch is written with one binary COPY, so a
    batch of 1000 costs about as much as a few single inserts. Returns the new
    message ids in the order given.
    """
    if not messages:
        raise InvalidInput(
            "A publish needs at least one message.", field_errors={"messages": ["Empty batch."]}
        )
    limit = settings.LAZARETTO_MAX_PUBLISH_BATCH
    if len(messages) > limit:
        raise BatchTooLarge(f"A batch holds at most {limit} messages, not {len(messages)}.")
    queue = _queue_for_publish(queue_name)
    for index, message in enumerate(messages):
        _validate(message, index, queue)
    with transaction.atomic():
        ids = _insert(
            queue, messages, put_user=put_user[:150], put_application=put_application[:28]
        )
        messages_published.send(sender=Queue, queue=queue, count=len(ids))
    return ids


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
    with cursor.copy(COPY_SQL) as copy:
        copy.set_types(COPY_TYPES)
        for message_id, message in zip(ids, messages, strict=True):
            available_at = (
                now + timedelta(seconds=message.delay_seconds) if message.delay_seconds else now
            )
            copy.write_row(
                (
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
            )
    return list(ids)
