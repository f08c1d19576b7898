"""Celery with Redis alone, as bench/peers.py runs it: one task per message,
no database, the project's pinned Celery (in .venv).

The worker is started as::

    celery -A bench._peer_celery worker -Q bench.peers.idle -c 2 ...

with BENCH_PEERS_BROKER_URL naming the bench's private redis-server. It
consumes nothing until the bench tells it to (``add_consumer``) once the
tasks are all sent. Tasks are acknowledged late, after the no-op body
returned, so that "acknowledged" means the same as for the other systems;
prefetch is Celery's default (4 per process).
"""

from __future__ import annotations

import os

from celery import Celery

BROKER_ENV = "BENCH_PEERS_BROKER_URL"
QUEUE = "bench.peers"
IDLE_QUEUE = "bench.peers.idle"
TASK = "bench.peers.noop"
NODE = "peers@%h"


def make_app(broker_url: str) -> Celery:
    app = Celery("bench_peers", set_as_current=False)
    # broker_url yields to a CELERY_BROKER_URL environment variable (the shared
    # Redis of var/services.env); the read and write URLs do not.
    app.conf.update(
        broker_url=broker_url,
        broker_read_url=broker_url,
        broker_write_url=broker_url,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_ignore_result=True,
        task_default_queue=QUEUE,
    )

    @app.task(name=TASK)
    def noop(payload: str) -> None:
        """The no-op consumer."""

    return app


app = make_app(os.environ.get(BROKER_ENV, "redis://127.0.0.1:6379/0"))
