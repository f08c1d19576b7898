"""The primary's duties as Celery tasks: the node that is primary sends the
schedule of ``LAZARETTO_PRIMARY_DUTIES`` (the sweeper, the dispatcher, the
dead-letter scans, the archive, the alarm posts, the delivery heartbeat),
each task carrying the epoch it was issued under (``epoch=`` keyword, checked
by ``broker.ha.guard.primary_duty`` where it runs).

Sending runs in a thread of its own, so a slow or absent Redis never holds
up the node's heartbeats.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from celery import Celery, beat, schedules

logger = logging.getLogger(__name__)

# The longest the sending thread sleeps between looks at the schedule.
MAX_WAIT_SECONDS = 0.5


# celery ships no type hints for beat.
_Scheduler: Any = beat.Scheduler
_PersistentScheduler: Any = beat.PersistentScheduler


def duty_phases(intervals: dict[str, float]) -> dict[str, float]:
    """When each duty that runs every so many seconds (``intervals``) first
    runs, in seconds from the schedule's start: spread evenly over the
    shortest interval, in name order. The sweep and the dispatch, each every
    second, then never start together, nor with the alarm posts or the
    scans: each takes a few milliseconds of one core, where together they
    took both cores from the deliveries at once."""
    if not intervals:
        return {}
    shortest = min(intervals.values())
    return {name: shortest * k / len(intervals) for k, name in enumerate(sorted(intervals))}


def spread(scheduler: Any) -> None:
    """Set the schedule's duties that run every so many seconds at their
    phases (``duty_phases``) from now; the others (the nightly archive, a
    crontab) keep their times."""
    entries = {
        name: entry
        for name, entry in scheduler.schedule.items()
        if type(entry.schedule) is schedules.schedule
    }
    intervals = {name: entry.schedule.run_every for name, entry in entries.items()}
    phases = duty_phases({name: every.total_seconds() for name, every in intervals.items()})
    now = scheduler.app.now()
    for name, entry in entries.items():
        # Due when its interval has passed since this: ``phase`` from now.
        entry.last_run_at = now - intervals[name] + timedelta(seconds=phases[name])


class PhasedScheduler(_PersistentScheduler):
    """``celery beat``'s scheduler (CELERY_BEAT_SCHEDULER), where no broker
    node sends the duties: its duties spread as the node's are."""

    def setup_schedule(self) -> None:
        super().setup_schedule()
        spread(self)


class EpochScheduler(_Scheduler):
    """Celery beat's scheduler over ``duties``, every task with ``epoch``."""

    def __init__(
        self, app: Celery, *, duties: dict[str, dict[str, Any]], epoch: int, **kwargs: Any
    ) -> None:
        self.duties = duties
        self.epoch = epoch
        super().__init__(app, **kwargs)

    def setup_schedule(self) -> None:
        self.merge_inplace(
            {
                name: {
                    **entry,
                    "kwargs": {**entry.get("kwargs", {}), "epoch": self.epoch},
                    # Redis down: this send fails now, the next comes on time.
                    "options": {**entry.get("options", {}), "retry": False},
                }
                for name, entry in self.duties.items()
            }
        )
        spread(self)


class CeleryDuties:
    """Start (under an epoch) and stop sending the primary's duties."""

    def __init__(self, app: Celery, duties: dict[str, dict[str, Any]]) -> None:
        # Beat says "Sending due task" at INFO, several times a second: not
        # in the node's log.
        logging.getLogger("celery.beat").setLevel(logging.WARNING)
        self.app = app
        self.duties = duties
        self._stopping: threading.Event | None = None

    def start(self, epoch: int) -> None:
        self.stop()
        stopping = threading.Event()
        scheduler = EpochScheduler(self.app, duties=self.duties, epoch=epoch, lazy=False)
        thread = threading.Thread(
            target=self._send, args=(scheduler, stopping), name="duties", daemon=True
        )
        self._stopping = stopping
        thread.start()
        logger.info("duties: sending under epoch %s", epoch)

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
            self._stopping = None
            logger.info("duties: stopped")

    def _send(self, scheduler: EpochScheduler, stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                wait = scheduler.tick()
            except Exception:
                logger.exception("duties: the schedule failed")
                wait = MAX_WAIT_SECONDS
            stopping.wait(min(max(wait, 0.0), MAX_WAIT_SECONDS))
