"""Log lines for every process (web, Celery workers and beat, gunicorn,
management commands), built with structlog on top of the standard library's
logging, so a plain ``logging.getLogger(__name__)`` in any module is enough.

``LOG_FORMAT=json``: one JSON object per line with ``timestamp``, ``level``,
``logger``, ``event`` (the message), ``worker`` (``host:pid``), whatever the
code bound (``structlog.contextvars``: a delivery binds ``message_id`` and
``queue``) or passed as ``extra=``, and ``exception`` for a traceback.
``LOG_FORMAT=text`` (the default): the same fields on one human-readable line,
``timestamp LEVEL logger event key=value …``.

Pure configuration: no Django import, so gunicorn's master can use it too.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

LOG_FORMATS = ("text", "json")
_HOST = socket.gethostname()


def add_worker(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Name the process that logged: ``host:pid`` (as delivery leases do)."""
    event_dict.setdefault("worker", f"{_HOST}:{os.getpid()}")
    return event_dict


def summarize_request(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Django logs the request object itself (``extra={"request": …}``):
    keep its method and path, which is what a reader wants of it."""
    request = event_dict.get("request")
    if request is not None and hasattr(request, "get_full_path"):
        event_dict["request"] = f"{request.method} {request.get_full_path()}"
    return event_dict


# Every record goes through these, whether it came from structlog or from the
# standard library (Django, Celery, httpx, our own modules).
PRE_CHAIN: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.add_log_level,
    structlog.stdlib.ExtraAdder(),
    summarize_request,
    add_worker,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]

_TEXT_FIRST = ("timestamp", "level", "logger", "event")


def render_text(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
    """``timestamp LEVEL logger event key=value …``, then the traceback."""
    exception = event_dict.pop("exception", None)
    timestamp, level, name, event = (event_dict.pop(key, "") for key in _TEXT_FIRST)
    line = f"{timestamp} {str(level).upper()} {name} {event}"
    fields = " ".join(f"{key}={value}" for key, value in event_dict.items())
    line = f"{line} {fields}" if fields else line
    return f"{line}\n{exception}" if exception else line


def _formatter(log_format: str) -> dict[str, Any]:
    renderer: Processor = (
        structlog.processors.JSONRenderer() if log_format == "json" else render_text
    )
    return {
        "()": structlog.stdlib.ProcessorFormatter,
        "foreign_pre_chain": PRE_CHAIN,
        "processors": [
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    }


def logging_config(*, log_format: str, level: str = "INFO") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dictionary (Django's LOGGING): one
    handler on the root logger, in ``log_format``; every other logger
    propagates to it."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"structured": _formatter(log_format)},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            # Django's and gunicorn's own handlers would print their lines in
            # their own formats; they go to the root's handler instead.
            "django": {"handlers": [], "level": level, "propagate": True},
            "django.server": {"handlers": [], "level": level, "propagate": True},
            "gunicorn.error": {"handlers": [], "level": level, "propagate": True},
            "gunicorn.access": {"handlers": [], "level": level, "propagate": True},
            # billiard (Celery's pool) logs a pool process's death here and
            # turns the logger's propagation off, so it needs the handler
            # itself; without one Python prints the bare message.
            "multiprocessing": {"handlers": ["console"], "level": level, "propagate": False},
            "django.db.backends": {"level": "WARNING"},
            # httpx logs every request with its full URL, which for webhooks
            # may carry a token; the consumers and the alarm notifier log
            # outcomes themselves.
            "httpx": {"level": "WARNING"},
        },
    }


def configure_structlog() -> None:
    """structlog's own loggers (``structlog.get_logger()``) hand their events
    to the standard library, so they share its handler and format; so do
    Python's warnings (logger ``py.warnings``), which would otherwise be
    printed as they are."""
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *PRE_CHAIN,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
