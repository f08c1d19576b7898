"""The demo's consumer module: handlers loaded like any user's, through
``LAZARETTO_CONSUMER_MODULES=demo_consumers`` (``make run`` and
``scripts/run.sh`` set it; the test suite's workers too).

``demo`` is a consumer with bugs on demand, for demos and tests.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from broker.consumers import Delivery, HandlerError, register


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
