"""The Celery app. Redis carries only wake-ups; the messages themselves live
in PostgreSQL, so losing Redis loses no message.

Queues: ``deliveries`` for delivery tasks, ``control`` for the sweeper, the
dispatcher and the poison-alarm webhook, so that busy deliveries never delay
crash detection; ``pipeline`` for the Spark jobs (replay, archive), whose
tasks last as long as their job. The control worker runs two processes: only one of them at a
time posts alarms (an advisory lock), so a slow webhook never holds up a
sweep. Run one worker per queue and one beat:

    celery -A workers worker -Q deliveries
    celery -A workers worker -Q control -c 2 -n control@%h
    celery -A workers worker -Q pipeline -c 1 -n pipeline@%h
    celery -A workers beat
"""

import copy
import logging.config
import os
import time
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("lazaretto")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"])

# When a task was sent (epoch seconds, the sender's clock): how late a
# scheduled task starts is what the sweeper and dispatcher lag metrics show.
SENT_AT_HEADER = "lazaretto_sent_at"


@signals.before_task_publish.connect
def stamp_sent_at(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    if headers is not None:
        headers.setdefault(SENT_AT_HEADER, time.time())


@signals.setup_logging.connect
def setup_logging(loglevel: int | None = None, logfile: str | None = None, **kwargs: Any) -> None:
    """Django's LOGGING for Celery's processes too, instead of Celery's own
    set-up (which would replace the root logger's handlers and format), so
    LOG_FORMAT=json holds for workers and beat; ``--logfile`` and ``-l``
    still choose where to and from which level."""
    from django.conf import settings

    config = copy.deepcopy(settings.LOGGING)
    if logfile:
        for handler in config["handlers"].values():
            if handler.get("class") == "logging.StreamHandler":
                handler.pop("stream", None)
                handler.update(
                    {"class": "logging.handlers.WatchedFileHandler", "filename": logfile}
                )
    if loglevel:
        config["root"]["level"] = logging.getLevelName(loglevel)
    logging.config.dictConfig(config)


@signals.celeryd_init.connect
def no_banner_in_json(instance: Any = None, **kwargs: Any) -> None:
    """A worker prints a start-up banner (not a log line) unless quiet: with
    LOG_FORMAT=json its output must hold JSON lines only."""
    from django.conf import settings

    if instance is not None and settings.LOG_FORMAT == "json":
        instance.quiet = True


@signals.celeryd_after_setup.connect
def say_which_spark(instance: Any = None, **kwargs: Any) -> None:
    """A worker on the pipeline queue says once at start-up where its Spark
    jobs run (and which setting it ignores), and each of its processes has a
    driver ready for its first job (workers.pipeline.Standby)."""
    from workers.pipeline import PIPELINE_QUEUE, spark_choice

    if instance is not None and PIPELINE_QUEUE in instance.app.amqp.queues.consume_from:
        logging.getLogger("workers.pipeline").info(spark_choice())
        signals.worker_process_init.connect(ready_a_driver, weak=False)


def ready_a_driver(**kwargs: Any) -> None:
    from workers.pipeline import STANDBY

    STANDBY.start()


@signals.worker_init.connect
@signals.worker_process_init.connect
def bound_store_waits(**kwargs: Any) -> None:
    """Each of a worker's waits on the store ends after
    LAZARETTO_STORE_TIMEOUT_SECONDS (broker.store.deadline): a task on a
    frozen or cut-off server fails instead of holding the process, and the
    next one connects to wherever the read-write server is now."""
    from django.conf import settings

    from broker.store.deadline import limit_every_wait

    limit_every_wait(settings.LAZARETTO_STORE_TIMEOUT_SECONDS, "a worker's statement")


@signals.worker_process_shutdown.connect
def forget_process_metrics(pid: int | None = None, **kwargs: Any) -> None:
    """A prefork child's live metrics go with it (multiprocess mode)."""
    from broker.metrics import process_dead

    process_dead(pid or os.getpid())
