"""gunicorn's settings for the console (``gunicorn -c python:console.gunicorn_conf
console.wsgi``; scripts/run.sh starts it so). The bind address and anything
else given on the command line win over these.

* ``WEB_WORKERS`` worker processes (2 unless set).
* Its error and access logs go through the same logging set-up as Django's
  (console.logs), on standard error: ``LOG_FORMAT=json`` makes them JSON too.
* A worker that exits takes its live metrics with it (prometheus-client's
  multiprocess mode, when ``PROMETHEUS_MULTIPROC_DIR`` is set).
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import multiprocess

from console.logs import LOG_FORMATS, logging_config


def _workers() -> int:
    value = os.environ.get("WEB_WORKERS", "").strip() or "2"
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(
            f"WEB_WORKERS: {value!r} is not valid; expected a whole number of at least 1."
        )
    return int(value)


workers = _workers()
accesslog = "-"
# The longest request line gunicorn takes (its default, 4094, is shorter than
# a message search with every filter at its longest, percent-encoded).
limit_request_line = 8190
# The log format is checked again (naming the variable) when Django starts.
_format = os.environ.get("LOG_FORMAT", "text").strip().lower()
logconfig_dict = logging_config(log_format=_format if _format in LOG_FORMATS else "text")


def child_exit(server: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(worker.pid)
