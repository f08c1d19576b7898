"""Consumers: what a queue delivers its messages to.

A queue names one consumer: either a handler registered here by name, or an
http(s) webhook URL. A handler receives one ``Delivery``; returning means the
message is handled (ack). Raising ``FormatError`` means the message itself is
unreadable and goes straight to the dead-letter queue; any other exception is
a handler error, retried with backoff while retries remain. A handler that
kills its process (or hangs until it is killed) is a crash, which the sweeper
notices.

Handlers beyond the built-in ones live in consumer modules, which
``LAZARETTO_CONSUMER_MODULES`` names and ``load_consumer_modules`` imports at
start-up in every process (web and workers alike: saving a queue checks its
consumer against this registry).
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured, ValidationError

from broker.outbound import DestinationRefused, check_url, outbound_client

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

# A queue's webhook_timeout: the default and its bounds, in seconds.
WEBHOOK_TIMEOUT_SECONDS = 10.0
MIN_WEBHOOK_TIMEOUT_SECONDS = 0.1
MAX_WEBHOOK_TIMEOUT_SECONDS = 300.0
# The headers of a signed webhook POST (see ``webhook_signature``).
SIGNATURE_HEADER = "Lazaretto-Signature"
TIMESTAMP_HEADER = "Lazaretto-Timestamp"


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


class DuplicateHandler(ValueError):
    """A handler name registered a second time."""

    def __init__(self, name: str, first: Handler, second: Handler) -> None:
        super().__init__(
            f"A handler named {name!r} is already registered (by {first.__module__}); "
            f"{second.__module__} registers it again."
        )
        self.name = name
        self.first_module = first.__module__
        self.second_module = second.__module__


_HANDLERS: dict[str, Handler] = {}


def register(name: str) -> Callable[[Handler], Handler]:
    """Register a handler under ``name`` (decorator)."""

    def decorate(handler: Handler) -> Handler:
        if name in _HANDLERS:
            raise DuplicateHandler(name, _HANDLERS[name], handler)
        _HANDLERS[name] = handler
        return handler

    return decorate


def handler_names() -> list[str]:
    return sorted(_HANDLERS)


def load_consumer_modules(
    modules: Iterable[str], *, variable: str = "LAZARETTO_CONSUMER_MODULES"
) -> None:
    """Import each consumer module, whose ``@register`` decorators add its
    handlers. A module that cannot be found, one that fails while it is
    imported (its own ImportError included) and a handler name registered
    twice stop start-up with ``ImproperlyConfigured`` naming ``variable`` and
    the module."""
    for module in modules:
        if not all(part.isidentifier() for part in module.split(".")):
            raise ImproperlyConfigured(
                f"{variable}: {module!r} is not a module name; expected dotted Python "
                "names such as billing_consumers or acme.billing.consumers."
            )
        try:
            importlib.import_module(module)
        except DuplicateHandler as error:
            raise ImproperlyConfigured(
                f"{variable}: consumer module {module!r} registers the handler name "
                f"{error.name!r}, which {error.first_module} already registered; "
                "each handler name may be registered once."
            ) from error
        except ModuleNotFoundError as error:
            if error.name is not None and _names_part_of(error.name, module):
                raise ImproperlyConfigured(
                    f"{variable}: consumer module {module!r} not found (no module named "
                    f"{error.name!r}); put the directory that holds it on PYTHONPATH."
                ) from error
            raise _failed(variable, module, error) from error
        except Exception as error:
            raise _failed(variable, module, error) from error


def _names_part_of(missing: str, module: str) -> bool:
    """Whether ``missing`` is ``module`` itself or one of its parent packages."""
    return module == missing or module.startswith(f"{missing}.")


def _failed(variable: str, module: str, error: Exception) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"{variable}: consumer module {module!r} was found but failed while it was "
        f"imported: {type(error).__name__}: {error}"
    )


def is_webhook(consumer: str) -> bool:
    return "://" in consumer


def validate_webhook_url(url: str) -> None:
    """Model-field validator: blank, or an http(s) URL whose host a webhook
    may go to (broker.outbound; a name that does not resolve now is checked
    at each connection)."""
    if not url:
        return
    problem = ValidationError(
        "A webhook must be an http:// or https:// URL with a host.", code="bad_webhook"
    )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port out of range raises here
    except ValueError:  # "http://[", "http://host:99999/"
        raise problem from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise problem
    try:
        # What DNS would be asked: a label over 63 characters, say, is no name.
        parts.hostname.encode("idna")
    except UnicodeError:
        raise problem from None
    try:
        check_url(url, unresolved_ok=True)
    except DestinationRefused as refused:
        raise ValidationError(
            f"Not an allowed webhook: {refused}.", code="webhook_not_allowed"
        ) from None


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


@dataclass(frozen=True)
class WebhookOptions:
    """A queue's webhook settings: how long a POST may take (seconds, for
    each of connecting, sending and waiting for the answer) and the shared
    secret that signs it (blank: unsigned)."""

    timeout: float = WEBHOOK_TIMEOUT_SECONDS
    secret: str = ""


def consumer_for(consumer: str, webhook: WebhookOptions | None = None) -> Handler:
    """The callable that delivers to ``consumer``; a webhook URL is posted to
    with ``webhook``'s timeout and secret."""
    if is_webhook(consumer):
        options = webhook or WebhookOptions()
        return lambda delivery: _post_webhook(consumer, delivery, options)
    try:
        return _HANDLERS[consumer]
    except KeyError:
        raise HandlerError(f"No handler is registered as {consumer!r}.") from None


def webhook_signature(*, secret: str, timestamp: int, body: bytes) -> str:
    """The ``Lazaretto-Signature`` value: ``sha256=`` and the hex HMAC-SHA256,
    keyed with the secret (a queue's, or the alarm webhook's), of the
    timestamp (Unix seconds, as sent in ``Lazaretto-Timestamp``), a dot, and
    the raw body. Receivers compute the same and compare in constant time;
    the timestamp lets them refuse an old request replayed."""
    signed = f"{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def signature_headers(*, secret: str, body: bytes) -> dict[str, str]:
    """``Lazaretto-Timestamp`` (now) and the ``Lazaretto-Signature`` of
    ``body`` at that time: what a signed POST adds to its headers."""
    timestamp = int(time.time())
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: webhook_signature(secret=secret, timestamp=timestamp, body=body),
    }


@cache
def _http_client() -> httpx.Client:
    # One client per process keeps connections to each webhook alive; each
    # request carries its queue's timeout.
    return outbound_client(timeout=WEBHOOK_TIMEOUT_SECONDS)


def _post_webhook(url: str, delivery: Delivery, options: WebhookOptions) -> None:
    """POST the payload; any 2xx acknowledges it, anything else is an error."""
    import httpx  # imported by the first webhook delivery (broker.outbound)

    headers = {
        "Content-Type": delivery.content_type,
        "Lazaretto-Message-Id": str(delivery.message_id),
        "Lazaretto-Attempt": str(delivery.attempt),
        "Lazaretto-Queue": delivery.queue,
        "Lazaretto-Headers": json.dumps(delivery.headers),
    }
    if options.secret:
        headers.update(signature_headers(secret=options.secret, body=delivery.payload))
    try:
        response = _http_client().post(
            url, content=delivery.payload, headers=headers, timeout=options.timeout
        )
    except DestinationRefused as refused:
        raise HandlerError(f"webhook {url}: not an allowed destination: {refused}") from None
    except httpx.HTTPError as error:
        # The error's class, not the socket's text: a message's error is read
        # by viewers, and says no more about the network than that.
        raise HandlerError(f"webhook {url}: no answer ({type(error).__name__})") from None
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
