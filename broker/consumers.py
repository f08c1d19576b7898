"""Consumers: what a queue delivers its messages to.

A queue names one consumer: either a handler registered here by name, or an
http(s) webhook URL. A handler receives one ``Delivery``; returning means the
message is handled (ack). Raising ``FormatError`` means the message itself is
unreadable and goes straight to the dead-letter queue; any other exception is
a handler error, retried with backoff while retries remain. A handler that
kills its process (or hangs until it is killed) is a crash, which the sweeper
notices.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.core.exceptions import ValidationError

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Delivery:
    message_id: int
    queue: str
    payload: bytes
    content_type: str
    headers: dict[str, str]
    attempt: int
    # True when the message is a crash suspect delivered on its own.
    isolated: bool


class HandlerError(Exception):
    """The consumer could not handle the message this time."""


class FormatError(HandlerError):
    """The message cannot be understood; retrying will not help."""


Handler = Callable[[Delivery], None]
_HANDLERS: dict[str, Handler] = {}


def register(name: str) -> Callable[[Handler], Handler]:
    """Register a handler under ``name`` (decorator)."""

    def decorate(handler: Handler) -> Handler:
        if name in _HANDLERS:
            raise ValueError(f"A handler named {name!r} is already registered.")
        _HANDLERS[name] = handler
        return handler

    return decorate


def handler_names() -> list[str]:
    return sorted(_HANDLERS)


def is_webhook(consumer: str) -> bool:
    return "://" in consumer


def validate_webhook_url(url: str) -> None:
    """Model-field validator: blank, or an http(s) URL with a host."""
    if not url:
        return
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ValidationError(
            "A webhook must be an http:// or https:// URL with a host.", code="bad_webhook"
        )


def validate_consumer(consumer: str) -> None:
    """Model-field validator: a registered handler name or an http(s) URL."""
    if not consumer:
        return
    if is_webhook(consumer):
        validate_webhook_url(consumer)
        return
    if consumer not in _HANDLERS:
        raise ValidationError(
            f"No handler is registered as {consumer!r}; known handlers: "
            f"{', '.join(handler_names())}, or an http(s) webhook URL.",
            code="unknown_handler",
        )


def consumer_for(consumer: str) -> Handler:
    """The callable that delivers to ``consumer``."""
    if is_webhook(consumer):
        return lambda delivery: _post_webhook(consumer, delivery)
    try:
        return _HANDLERS[consumer]
    except KeyError:
        raise HandlerError(f"No handler is registered as {consumer!r}.") from None


@cache
def _http_client() -> httpx.Client:
    # One client per process keeps connections to each webhook alive.
    return httpx.Client(timeout=WEBHOOK_TIMEOUT_SECONDS, follow_redirects=False)


def _post_webhook(url: str, delivery: Delivery) -> None:
    """POST the payload; any 2xx acknowledges it, anything else is an error."""
    try:
        response = _http_client().post(
            url,
            content=delivery.payload,
            headers={
                "Content-Type": delivery.content_type,
                "Lazaretto-Message-Id": str(delivery.message_id),
                "Lazaretto-Attempt": str(delivery.attempt),
                "Lazaretto-Queue": delivery.queue,
                "Lazaretto-Headers": json.dumps(delivery.headers),
            },
        )
    except httpx.HTTPError as error:
        raise HandlerError(f"webhook {url}: {type(error).__name__}: {error}") from None
    if not response.is_success:
        raise HandlerError(f"webhook {url} answered HTTP {response.status_code}")


# --- built-in handlers ------------------------------------------------------


@register("noop")
def noop(delivery: Delivery) -> None:
    """Acknowledge without looking (benchmarks)."""


@register("log")
def log(delivery: Delivery) -> None:
    """Log the message and acknowledge it."""
    logger.info(
        "message %s on %s, attempt %s, %s bytes",
        delivery.message_id,
        delivery.queue,
        delivery.attempt,
        len(delivery.payload),
    )


@register("json")
def json_handler(delivery: Delivery) -> None:
    """Decode the payload as a JSON object and log its keys; a payload that is
    not a JSON object is a format error."""
    try:
        document = json.loads(delivery.payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FormatError(f"payload is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise FormatError(f"payload is JSON {type(document).__name__}, not an object")
    logger.info("message %s: JSON keys %s", delivery.message_id, sorted(document))


@register("demo")
def demo(delivery: Delivery) -> None:
    """A consumer with bugs on demand, for demos and tests.

    Payload markers: ``CRASH`` kills the process (``os._exit(1)``), ``HANG``
    never returns, ``FAIL`` always raises. Headers: ``fail-attempts: N`` raises
    on the first N attempts; ``sleep-seconds: S`` sleeps before answering.
    When ``LAZARETTO_DEMO_RECORD`` names a file, every delivery is appended to
    it as a JSON line before the handler acts.
    """
    _record(delivery)
    if delivery.headers.get("sleep-seconds"):
        time.sleep(float(delivery.headers["sleep-seconds"]))
    if b"CRASH" in delivery.payload:
        os._exit(1)
    if b"HANG" in delivery.payload:
        while True:
            time.sleep(60)
    if b"FAIL" in delivery.payload:
        raise HandlerError("demo: the payload says FAIL")
    if delivery.attempt <= int(delivery.headers.get("fail-attempts", "0")):
        raise HandlerError(f"demo: failing attempt {delivery.attempt} on purpose")


def _record(delivery: Delivery) -> None:
    path = os.environ.get("LAZARETTO_DEMO_RECORD")
    if not path:
        return
    line: dict[str, Any] = {
        "id": delivery.message_id,
        "attempt": delivery.attempt,
        "isolated": delivery.isolated,
        "pid": os.getpid(),
        "time": time.time(),
    }
    # One write of a short line to a file opened for appending is atomic, so
    # several worker processes can share the file.
    with Path(path).open("a") as record:
        record.write(json.dumps(line) + "\n")
