"""The primary's duties as Celery tasks: the node that is primary sends the
schedule of ``LAZARETTO_PRIMARY_DUTIES`` (the sweeper, the dispatcher, the
dead-letter scans, the archive, the alarm posts, the delivery heartbeat),
each task carrying the epoch it was issued under (``epoch=`` keyword, checked
by ``broker.ha.guard.primary_duty`` where it runs), and fires the replay
schedules (``broker.pipeline.schedules``), which beat reads from PostgreSQL.

Sending runs in a thread of its own, so a slow or absent Redis never holds
up the node's heartbeats.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from celery import Celery, beat, schedules
from django.db import DatabaseError
from django_celery_beat.schedulers import DatabaseScheduler

from broker.pipeline.schedules import FIRE_TASK

logger = logging.getLogger(__name__)

# The longest the sending thread sleeps between looks at the schedule.
MAX_WAIT_SECONDS = 0.5


# The longest a change to the replay schedules waits to be seen (a read of
# django-celery-beat's change stamp; beat ticks several times a second).
CHANGE_CHECK_SECONDS = 1.0


# celery and django-celery-beat ship no type hints for beat.
_DatabaseScheduler: Any = DatabaseScheduler
_ScheduleEntry: Any = beat.ScheduleEntry
_IntervalSchedule: Any = schedules.schedule


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


def spread(entries: dict[str, Any], now: datetime) -> None:
    """Set the duties that run every so many seconds at their phases
    (``duty_phases``) from ``now``; the others (the nightly archive, a
    crontab) keep their times."""
    every = {
        name: entry.schedule.run_every
        for name, entry in entries.items()
        if type(entry.schedule) is _IntervalSchedule
    }
    phases = duty_phases({name: interval.total_seconds() for name, interval in every.items()})
    for name, interval in every.items():
        # Due when its interval has passed since this: ``phase`` from now.
        entries[name].last_run_at = now - interval + timedelta(seconds=phases[name])


class DutiesAndSchedules(_DatabaseScheduler):
    """Beat's schedule: the primary's duties, from the settings and kept in
    memory, each at its phase (``spread``), and the replay schedules
    (broker.pipeline.schedules), django-celery-beat's periodic tasks read
    from PostgreSQL: a change there applies within CHANGE_CHECK_SECONDS,
    without a restart. A schedule's firing is stored as soon as it is sent,
    so that beat started again, or the new primary of a failover, knows
    which slots were fired and fires a missed one once."""

    def __init__(
        self, app: Celery, *, duties: dict[str, dict[str, Any]] | None = None, **kwargs: Any
    ) -> None:
        self.duties = app.conf.beat_schedule if duties is None else duties
        self._duty_entries: dict[str, Any] = {}
        self._next_change_check = 0.0
        self._read_again = False
        super().__init__(app, **kwargs)

    def duty_entry(self, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        return fields

    def adjust(self, n: float, drift: float = 0.0) -> float:
        """The wait until the next entry is due, whole. Celery's takes 10 ms
        off, and beat (as the node's sending thread) ticks again at once
        while the wait is not positive: it spun for the last 10 ms before
        every send, 11 % of a core with the sweep and the dispatch four
        times a second each."""
        return n

    def setup_schedule(self) -> None:
        """The duties only: django-celery-beat would store them (and its own
        result clean-up) as periodic tasks."""
        self._duty_entries = {
            name: _ScheduleEntry(**self.duty_entry(name, fields), name=name, app=self.app)
            for name, fields in self.duties.items()
        }
        spread(self._duty_entries, self.app.now())

    def enabled_models_qs(self) -> Any:
        return super().enabled_models_qs().filter(task=FIRE_TASK)

    def all_as_schedule(self) -> dict[str, Any]:
        try:
            stored = super().all_as_schedule()
        except DatabaseError as error:
            # The store is away: the duties go on, the schedules as last read.
            logger.warning("duties: the replay schedules could not be read: %s", error)
            self._read_again = True
            stored = {
                name: entry
                for name, entry in (self._schedule or {}).items()
                if name not in self._duty_entries
            }
        return {**stored, **self._duty_entries}

    def schedule_changed(self) -> bool:
        now = time.monotonic()
        if now < self._next_change_check:
            return False
        self._next_change_check = now + CHANGE_CHECK_SECONDS
        if self._read_again:
            self._read_again = False
            return True
        before = self._last_timestamp
        # django-celery-beat compares each change stamp with the one before,
        # so the first stamp ever (the first schedule saved after beat
        # started on an empty table) would pass unseen.
        return bool(super().schedule_changed()) or (
            before is None and self._last_timestamp is not None
        )

    def reserve(self, entry: Any) -> Any:
        if entry.name in self._duty_entries:
            following = self._duty_entries[entry.name] = next(entry)
            if self._schedule is not None:
                self._schedule[entry.name] = following
            return following
        following = super().reserve(entry)
        if self._schedule is not None:
            # Read again, the schedule starts from this: so does it when the
            # store cannot be read (``all_as_schedule``).
            self._schedule[entry.name] = following
        self.sync()
        return following


class PhasedScheduler(DutiesAndSchedules):
    """``celery beat``'s scheduler (CELERY_BEAT_SCHEDULER), where no broker
    node sends the duties: the settings' duties, spread as the node's are,
    and the replay schedules."""


class EpochScheduler(DutiesAndSchedules):
    """A broker node's scheduler while it is primary: every duty carries
    ``epoch``; the replay schedules' firings need none (a firing of a slot
    already fired is dropped where it runs)."""

    def __init__(
        self, app: Celery, *, duties: dict[str, dict[str, Any]], epoch: int, **kwargs: Any
    ) -> None:
        self.epoch = epoch
        super().__init__(app, duties=duties, **kwargs)

    def duty_entry(self, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        return {
            **fields,
            "kwargs": {**fields.get("kwargs", {}), "epoch": self.epoch},
            # Redis down: this send fails now, the next comes on time.
            "options": {**fields.get("options", {}), "retry": False},
        }


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
