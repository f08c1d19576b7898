"""Replay schedules: a saved replay that runs by the clock.

A schedule is a replay spec, a cool-off and a give-up limit
(``ReplaySchedule``), and a periodic task of django-celery-beat that says
when it fires: a crontab in a named time zone, or an interval; enabled or
paused. Beat reads the periodic tasks from PostgreSQL
(``workers.duties``), so a change applies without restarting it; each
firing is the task ``lazaretto.replay_schedule_fire``, which calls
``schedule_fire``.

A firing submits an ordinary replay job linked to its schedule, limited to
sources that have been dead (or blacklisted, or failed) for the cool-off,
whose generation is below the give-up limit, and that no schedule's job
copied before (``broker.pipeline.selection.ScheduleLimits``). A firing
while the schedule's previous job still runs submits nothing and is
recorded as skipped. Beat fires a slot it missed (beat down, a failover)
once when it is back; a firing of a slot already fired (the new primary of
a failover sending it again) is dropped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from celery import schedules
from celery.schedules import ParseException
from django.db import IntegrityError, transaction
from django.db.models import Prefetch, Q
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask
from django_celery_beat.tzcrontab import TzAwareCrontab

from broker.errors import (
    AlreadyExists,
    InvalidInput,
    NamesNothing,
    ScheduleBusy,
    ScheduleDeleted,
    ScheduleNotFound,
    SchedulePaused,
)
from broker.models import (
    Message,
    ReplayJob,
    ReplayJobStatus,
    ReplaySchedule,
    ReplaySource,
    ScheduleFiring,
)
from broker.pipeline.replay import STALE_AFTER, replay_job_submit
from broker.pipeline.selection import (
    MessageSelection,
    ReplaySpec,
    ScheduleLimits,
    replay_validate,
)
from broker.services.audit import Actor, audit_record

logger = logging.getLogger(__name__)

FIRE_TASK = "lazaretto.replay_schedule_fire"
NAME_MAX_LENGTH = 100
MAX_INTERVAL_SECONDS = 365 * 24 * 3600
MAX_COOL_OFF_MINUTES = 365 * 24 * 60
MAX_GIVE_UP_AFTER = 100
DEFAULT_GIVE_UP_AFTER = 3
# Sources a schedule reads: messages that stay where they are until someone
# acts. Delivered messages would be replayed over and over, and the archive
# holds what is no longer dead.
SCHEDULE_SOURCES = (ReplaySource.DEAD_LETTER, ReplaySource.BLACKLIST, ReplaySource.FAILED)
CRON_FIELDS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
# An interval firing this much of its interval after the last one fired the
# same slot (beat's firings are never early, so the next is a whole interval on).
_SAME_SLOT_SHARE = 0.5


# --- when a schedule fires -----------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """When a schedule fires: ``cron`` (five fields: minute, hour, day of
    month, month, day of week) at the wall-clock times of ``time_zone``, or
    every ``every_seconds``."""

    cron: str = ""
    time_zone: str = "UTC"
    every_seconds: int | None = None

    @property
    def is_cron(self) -> bool:
        return self.every_seconds is None

    def describe(self) -> str:
        if self.is_cron:
            return f"{self.cron} ({self.time_zone})"
        return f"every {self.every_seconds} s"


@cache
def time_zones() -> frozenset[str]:
    """The IANA time zones, without the two that name no place: the
    server's own clock (localtime) and a build machine's (Factory)."""
    return frozenset(zoneinfo.available_timezones() - {"localtime", "Factory"})


def timing_problems(timing: Timing) -> dict[str, list[str]]:
    """What is wrong with ``timing``, by field (cron, time_zone, every_seconds)."""
    if timing.every_seconds is not None:
        if timing.cron.strip():
            return {"cron": ["Give a cron line or an interval, not both."]}
        if not 1 <= timing.every_seconds <= MAX_INTERVAL_SECONDS:
            return {"every_seconds": [f"Give from 1 to {MAX_INTERVAL_SECONDS:,} seconds (a year)."]}
        return {}
    errors: dict[str, list[str]] = {}
    fields = timing.cron.split()
    if not fields:
        errors["cron"] = ["Give a cron line (five fields) or an interval."]
    elif len(fields) != len(CRON_FIELDS):
        errors["cron"] = [
            "A cron line has five fields (minute hour day-of-month month day-of-week); "
            f"this one has {len(fields)}."
        ]
    elif too_long := [
        name
        for name, value in zip(CRON_FIELDS, fields, strict=True)
        if len(value) > CrontabSchedule._meta.get_field(name).max_length
    ]:
        errors["cron"] = [f"The {too_long[0].replace('_', ' ')} field is too long."]
    else:
        try:
            schedules.crontab(*_in_celery_order(fields))
        except (ValueError, ParseException) as error:
            errors["cron"] = [f"Not a valid cron line: {error}"]
    if "cron" not in errors and timing.time_zone in time_zones():
        try:
            next_firings(timing, after=timezone.now(), count=1)
        except RuntimeError:  # celery's search for the next time gave up
            errors["cron"] = ["This cron line names no time that ever comes (31 February?)."]
    if timing.time_zone not in time_zones():
        errors["time_zone"] = [f"{timing.time_zone!r} is not a time zone (Europe/Paris, UTC, ...)."]
    return errors


def _in_celery_order(fields: list[str]) -> tuple[str, str, str, str, str]:
    """A cron line's fields in the order of celery's crontab arguments."""
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    return minute, hour, day_of_week, day_of_month, month_of_year


def _crontab(timing: Timing) -> TzAwareCrontab:
    """The crontab beat keeps for a cron timing (as django-celery-beat's model makes it)."""
    return TzAwareCrontab(
        *_in_celery_order(timing.cron.split()), tz=zoneinfo.ZoneInfo(timing.time_zone)
    )


def next_firings(timing: Timing, *, after: datetime, count: int = 5) -> list[datetime]:
    """The ``count`` times ``timing`` fires after ``after`` (in UTC). A
    wall-clock time a daylight-saving change skips comes an hour later
    that day, as beat fires it."""
    if not timing.is_cron:
        every = timedelta(seconds=timing.every_seconds or 1)
        return [after + every * k for k in range(1, count + 1)]
    crontab = _crontab(timing)
    times = []
    last = after.astimezone(crontab.tz)
    for _ in range(count):
        start, delta, _now = crontab.remaining_delta(last, tz=crontab.tz)
        last = (start + delta).astimezone(crontab.tz)
        times.append(last.astimezone(UTC))
    return times


def fired_this_slot(timing: Timing, *, last_fired: datetime | None, now: datetime) -> bool:
    """Whether a firing at ``now`` repeats the slot beat last fired at
    ``last_fired``: no slot of ``timing`` has come since."""
    if last_fired is None:
        return False
    if not timing.is_cron:
        return (now - last_fired).total_seconds() < _SAME_SLOT_SHARE * (timing.every_seconds or 1)
    [following] = next_firings(timing, after=last_fired, count=1)
    return following > now


def timing_of(schedule: ReplaySchedule) -> Timing:
    """The timing stored in the schedule's periodic task."""
    task = schedule.periodic_task
    if task is not None and task.interval is not None:
        return Timing(every_seconds=int(task.interval.every))
    if task is not None and task.crontab is not None:
        crontab = task.crontab
        return Timing(
            cron=" ".join(str(getattr(crontab, name)) for name in CRON_FIELDS),
            time_zone=str(crontab.timezone),
        )
    return Timing()


def _store_timing(task: PeriodicTask, timing: Timing) -> None:
    if timing.is_cron:
        fields = dict(zip(CRON_FIELDS, timing.cron.split(), strict=True))
        task.crontab, _ = CrontabSchedule.objects.get_or_create(**fields, timezone=timing.time_zone)
        task.interval = None
    else:
        task.interval, _ = IntervalSchedule.objects.get_or_create(
            every=timing.every_seconds, period=IntervalSchedule.SECONDS
        )
        task.crontab = None


# --- what a schedule is ---------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleSpec:
    """A replay schedule as submitted: its name, the replay it runs (never
    a dry run), when, its cool-off and give-up limit, enabled or paused."""

    name: str
    replay: ReplaySpec
    timing: Timing
    cool_off_minutes: int = 0
    give_up_after: int = DEFAULT_GIVE_UP_AFTER
    enabled: bool = True


def schedule_validate(spec: ScheduleSpec, *, schedule_id: int | None = None) -> None:
    """Refuse a schedule that cannot fire as asked (InvalidInput, every
    problem by field), or whose name another schedule has (AlreadyExists)."""
    errors: dict[str, list[str]] = {}
    name = spec.name.strip()
    if not name:
        errors["name"] = ["Give the schedule a name."]
    elif len(name) > NAME_MAX_LENGTH:
        errors["name"] = [f"At most {NAME_MAX_LENGTH} characters."]
    try:
        replay_validate(spec.replay)
    except InvalidInput as error:
        errors.update(error.field_errors)
    if spec.replay.source not in SCHEDULE_SOURCES and "source" not in errors:
        errors["source"] = [
            "A schedule replays from a dead-letter queue, the blacklist or failed messages."
        ]
    if spec.replay.dry_run:
        errors["dry_run"] = ["A schedule writes; preview with a one-off dry run instead."]
    errors.update(timing_problems(spec.timing))
    if not 0 <= spec.cool_off_minutes <= MAX_COOL_OFF_MINUTES:
        errors["cool_off_minutes"] = [f"Give from 0 to {MAX_COOL_OFF_MINUTES:,} minutes."]
    if not 1 <= spec.give_up_after <= MAX_GIVE_UP_AFTER:
        errors["give_up_after"] = [f"Give from 1 to {MAX_GIVE_UP_AFTER} replays."]
    if errors:
        raise InvalidInput("The replay schedule is not valid.", field_errors=errors)
    taken = ReplaySchedule.objects.filter(name=name, deleted_at__isnull=True)
    if schedule_id is not None:
        taken = taken.exclude(id=schedule_id)
    if taken.exists():
        raise _name_taken(name)


def _name_taken(name: str) -> AlreadyExists:
    return AlreadyExists(
        f"A replay schedule named {name!r} already exists.",
        field_errors={"name": ["Another schedule has this name."]},
    )


def replay_spec_of(schedule: ReplaySchedule) -> ReplaySpec:
    return ReplaySpec(
        source=schedule.source,
        source_queue=schedule.source_queue,
        filter=MessageSelection.from_stored(schedule.filters),
        target_queue=schedule.target_queue,
        rules_text=schedule.rules_text,
        velocity=schedule.velocity,
    )


def spec_of(schedule: ReplaySchedule) -> ScheduleSpec:
    return ScheduleSpec(
        name=schedule.name,
        replay=replay_spec_of(schedule),
        timing=timing_of(schedule),
        cool_off_minutes=schedule.cool_off_minutes,
        give_up_after=schedule.give_up_after,
        enabled=schedule.enabled,
    )


def _write(schedule: ReplaySchedule, spec: ScheduleSpec) -> None:
    replay = spec.replay
    schedule.name = spec.name.strip()
    schedule.source = replay.source
    schedule.source_queue = replay.source_queue
    schedule.filters = replay.filter.stored()
    schedule.target_queue = replay.target_queue
    schedule.rules_text = replay.rules_text
    schedule.velocity = replay.velocity
    schedule.cool_off_minutes = spec.cool_off_minutes
    schedule.give_up_after = spec.give_up_after
    try:
        with transaction.atomic():
            schedule.save()
    except IntegrityError as error:  # the same name saved meanwhile
        raise _name_taken(schedule.name) from error
    task = schedule.periodic_task or PeriodicTask(
        name=f"replay schedule {schedule.id}",
        task=FIRE_TASK,
        kwargs=json.dumps({"schedule_id": schedule.id}),
    )
    _store_timing(task, spec.timing)
    task.enabled = spec.enabled
    task.save()
    if schedule.periodic_task_id != task.id:
        schedule.periodic_task = task
        schedule.save(update_fields=["periodic_task"])


def _details(schedule: ReplaySchedule, spec: ScheduleSpec) -> dict[str, Any]:
    return {
        "schedule": schedule.id,
        "name": schedule.name,
        "when": spec.timing.describe(),
        "enabled": spec.enabled,
        "cool_off_minutes": spec.cool_off_minutes,
        "give_up_after": spec.give_up_after,
    }


def _queue_of(schedule: ReplaySchedule) -> str:
    return schedule.source_queue or schedule.target_queue


# --- changes ------------------------------------------------------------------------


@transaction.atomic
def schedule_create(*, spec: ScheduleSpec, actor: Actor) -> ReplaySchedule:
    """Check and save a schedule; beat fires it from its next slot on."""
    schedule_validate(spec)
    schedule = ReplaySchedule(
        created_by=actor if actor is not None and actor.is_authenticated else None
    )
    _write(schedule, spec)
    audit_record(
        action="schedule_create",
        actor=actor,
        queue_name=_queue_of(schedule),
        details=_details(schedule, spec),
    )
    return schedule


def _locked(schedule_id: int) -> ReplaySchedule:
    schedule = (
        ReplaySchedule.objects.select_for_update(of=("self",))
        .select_related("periodic_task__crontab", "periodic_task__interval")
        .filter(id=schedule_id)
        .first()
    )
    if schedule is None:
        raise ScheduleNotFound(f"There is no replay schedule {schedule_id}.")
    return schedule


def _live(schedule_id: int) -> ReplaySchedule:
    schedule = _locked(schedule_id)
    if schedule.deleted_at is not None:
        raise ScheduleDeleted(f"Replay schedule {schedule.name!r} was deleted.")
    return schedule


@transaction.atomic
def schedule_update(*, schedule_id: int, spec: ScheduleSpec, actor: Actor) -> ReplaySchedule:
    """Replace what a schedule does and when; its past jobs stay as they ran."""
    schedule = _live(schedule_id)
    schedule_validate(spec, schedule_id=schedule.id)
    _write(schedule, spec)
    audit_record(
        action="schedule_update",
        actor=actor,
        queue_name=_queue_of(schedule),
        details=_details(schedule, spec),
    )
    return schedule


def schedule_update_parts(*, schedule_id: int, actor: Actor, **parts: Any) -> ReplaySchedule:
    """Change some parts of a schedule (``ScheduleSpec``'s fields, the
    replay's by their own names, ``filter`` whole, the timing's ``cron``,
    ``time_zone``, ``every_seconds``); the rest stays."""
    with transaction.atomic():
        current = spec_of(_live(schedule_id))
        replay_parts = {
            key: parts.pop(key)
            for key in (
                "source",
                "source_queue",
                "filter",
                "target_queue",
                "rules_text",
                "velocity",
            )
            if key in parts
        }
        timing_parts = {
            key: parts.pop(key) for key in ("cron", "time_zone", "every_seconds") if key in parts
        }
        timing = current.timing
        if "cron" in timing_parts and "every_seconds" not in timing_parts:
            timing_parts["every_seconds"] = None
        if timing_parts.get("every_seconds") is not None and "cron" not in timing_parts:
            timing_parts["cron"] = ""
        spec = dataclasses.replace(
            current,
            replay=dataclasses.replace(current.replay, **replay_parts),
            timing=dataclasses.replace(timing, **timing_parts),
            **parts,
        )
        return schedule_update(schedule_id=schedule_id, spec=spec, actor=actor)


@transaction.atomic
def schedule_pause(*, schedule_id: int, actor: Actor) -> ReplaySchedule:
    return _set_enabled(schedule_id, enabled=False, actor=actor)


@transaction.atomic
def schedule_resume(*, schedule_id: int, actor: Actor) -> ReplaySchedule:
    """Enable a paused schedule: beat fires it at its next slot, or at once
    when a slot passed while it was paused (once, however many passed)."""
    return _set_enabled(schedule_id, enabled=True, actor=actor)


def _set_enabled(schedule_id: int, *, enabled: bool, actor: Actor) -> ReplaySchedule:
    schedule = _live(schedule_id)
    task = schedule.periodic_task
    if task is not None and task.enabled != enabled:
        task.enabled = enabled
        task.save(update_fields=["enabled"])
        audit_record(
            action="schedule_resume" if enabled else "schedule_pause",
            actor=actor,
            queue_name=_queue_of(schedule),
            details={"schedule": schedule.id, "name": schedule.name},
        )
    return schedule


@transaction.atomic
def schedule_delete(*, schedule_id: int, actor: Actor) -> ReplaySchedule:
    """Stop a schedule for good: its periodic task is disabled (it keeps
    the timing the schedule had), its jobs and firings stay, and its name
    is free again."""
    schedule = _live(schedule_id)
    schedule.deleted_at = timezone.now()
    schedule.save(update_fields=["deleted_at"])
    if schedule.periodic_task is not None:
        schedule.periodic_task.enabled = False
        schedule.periodic_task.save(update_fields=["enabled"])
    audit_record(
        action="schedule_delete",
        actor=actor,
        queue_name=_queue_of(schedule),
        details={"schedule": schedule.id, "name": schedule.name},
    )
    return schedule


# --- firings ---------------------------------------------------------------------------


def _running_job(schedule: ReplaySchedule) -> ReplayJob | None:
    """The schedule's job still queued or running (a running one whose
    driver fell silent long ago counts as dead)."""
    alive = Q(status=ReplayJobStatus.QUEUED) | Q(
        status=ReplayJobStatus.RUNNING,
        heartbeat_at__gte=timezone.now() - STALE_AFTER,
    )
    return schedule.jobs.filter(alive).order_by("-id").first()


def schedule_run_now(*, schedule_id: int, actor: Actor) -> ScheduleFiring:
    """Fire a schedule now, outside its timing (which goes on as before).
    Refused on a paused or deleted schedule, or while its job still runs."""
    with transaction.atomic():
        schedule = _live(schedule_id)
        if not schedule.enabled:
            raise SchedulePaused(
                f"Replay schedule {schedule.name!r} is paused; resume it to run it."
            )
        running = _running_job(schedule)
        if running is not None:
            raise ScheduleBusy(
                f"Replay schedule {schedule.name!r} has job {running.id} {running.status}; "
                "two jobs of one schedule never run at once."
            )
        return _submit(schedule, manual=True, actor=actor)


def schedule_fire(*, schedule_id: int) -> ScheduleFiring | None:
    """Beat's firing of a schedule: submit its job, or record the firing as
    skipped while the previous job still runs. None when it fires nothing:
    the schedule is paused or gone, or this slot was fired already."""
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.deleted_at is not None or not schedule.enabled:
            logger.info("%s: not firing, paused or deleted", schedule)
            return None
        now = timezone.now()
        if fired_this_slot(timing_of(schedule), last_fired=schedule.last_fired_at, now=now):
            logger.info("%s: this slot was fired at %s already", schedule, schedule.last_fired_at)
            return None
        schedule.last_fired_at = now
        schedule.save(update_fields=["last_fired_at"])
        running = _running_job(schedule)
        if running is not None:
            return _skip(schedule, f"replay job {running.id} was still {running.status}")
        try:
            with transaction.atomic():
                return _submit(schedule, manual=False, actor=None)
        except InvalidInput as error:  # a queue it names was deleted since
            problems = "; ".join(m for messages in error.field_errors.values() for m in messages)
            return _skip(schedule, (problems or error.detail)[:200])


def _skip(schedule: ReplaySchedule, why: str) -> ScheduleFiring:
    firing = ScheduleFiring.objects.create(schedule=schedule, skipped=why)
    audit_record(
        action="schedule_skip",
        queue_name=_queue_of(schedule),
        reason=why,
        details={"schedule": schedule.id, "name": schedule.name, "firing": firing.id},
    )
    logger.info("%s: firing skipped: %s", schedule, why)
    return firing


def _submit(schedule: ReplaySchedule, *, manual: bool, actor: Actor) -> ScheduleFiring:
    limits = ScheduleLimits(
        entered_before=timezone.now() - timedelta(minutes=schedule.cool_off_minutes),
        generation_below=schedule.give_up_after,
    )
    spec = dataclasses.replace(replay_spec_of(schedule), limits=limits)
    try:
        job = replay_job_submit(spec=spec, actor=actor, schedule=schedule)
    except NamesNothing as error:  # a queue it names was deleted since it was saved
        raise InvalidInput(
            f"Replay schedule {schedule.name!r} names queues that are not there any more; "
            "change it.",
            field_errors=error.field_errors,
        ) from None
    firing = ScheduleFiring.objects.create(schedule=schedule, job=job, manual=manual)
    audit_record(
        action="schedule_fire",
        actor=actor,
        queue_name=_queue_of(schedule),
        details={
            "schedule": schedule.id,
            "name": schedule.name,
            "job": job.id,
            "manual": manual,
            "firing": firing.id,
        },
    )
    return firing


# --- reads -------------------------------------------------------------------------------


def schedules_all(*, within: Q | None = None) -> list[ReplaySchedule]:
    """The schedules not deleted (of those ``within`` selects), by name,
    each with its latest job."""
    schedules = ReplaySchedule.objects.filter(deleted_at__isnull=True)
    return list(_with_latest_job(schedules if within is None else schedules.filter(within)))


def _with_latest_job(queryset: Any) -> Any:
    return queryset.select_related(
        "periodic_task__crontab", "periodic_task__interval", "created_by"
    ).prefetch_related(
        Prefetch("jobs", queryset=ReplayJob.objects.order_by("-id")[:1], to_attr="latest_jobs")
    )


def schedule_get(*, schedule_id: int) -> ReplaySchedule:
    schedule = _with_latest_job(ReplaySchedule.objects.filter(id=schedule_id)).first()
    if schedule is None:
        raise ScheduleNotFound(f"There is no replay schedule {schedule_id}.")
    return schedule


def schedules_reading(queue_name: str) -> list[ReplaySchedule]:
    """The schedules (not deleted) that replay from dead-letter queue ``queue_name``."""
    return list(
        _with_latest_job(
            ReplaySchedule.objects.filter(
                deleted_at__isnull=True,
                source=ReplaySource.DEAD_LETTER,
                source_queue=queue_name,
            )
        )
    )


def given_up_by(schedules_: list[ReplaySchedule], message: Message) -> list[ReplaySchedule]:
    """Those of the schedules (reading the message's dead-letter queue) whose
    filter takes the dead letter ``message`` (its original queue, reason,
    publish time and header; not its payload text) and that give up on it:
    its generation reached their limit."""
    return [
        schedule
        for schedule in schedules_
        if message.generation >= schedule.give_up_after
        and _would_take(MessageSelection.from_stored(schedule.filters), message)
    ]


def _would_take(selection: MessageSelection, message: Message) -> bool:
    header = message.dead_letter or {}
    pair = selection.header_pair
    return (
        (not selection.queues or header.get("original_queue") in selection.queues)
        and (not selection.reason or header.get("reason") == selection.reason)
        and (selection.since is None or message.created_at >= selection.since)
        and (selection.until is None or message.created_at < selection.until)
        and (pair is None or str((message.headers or {}).get(pair[0])) == pair[1])
    )


def next_firing(schedule: ReplaySchedule, *, now: datetime | None = None) -> datetime | None:
    """When beat fires the schedule next; None when paused or deleted."""
    if not schedule.enabled or schedule.deleted_at is not None:
        return None
    now = now or timezone.now()
    timing = timing_of(schedule)
    task = schedule.periodic_task
    if not timing.is_cron and task is not None:
        # Beat counts an interval from the last run, or from the task's
        # last change when it has none.
        since = task.last_run_at or task.date_changed
        return max(now, since + timedelta(seconds=timing.every_seconds or 1))
    [following] = next_firings(timing, after=now, count=1)
    return following


def latest_job(schedule: ReplaySchedule) -> ReplayJob | None:
    jobs = getattr(schedule, "latest_jobs", None)
    if jobs is None:
        return schedule.jobs.order_by("-id").first()
    return jobs[0] if jobs else None
