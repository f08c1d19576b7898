"""Replay schedules (broker.pipeline.schedules): what a schedule may be, when
it fires, what a firing submits, and beat's scheduler reading them from
PostgreSQL (workers.duties). No Spark and no workers here; a firing's job
stays queued unless a test moves it on (tests/test_replay_schedules_live.py
runs them for real)."""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.db import connection
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from broker.errors import (
    AlreadyExists,
    InvalidInput,
    ScheduleBusy,
    ScheduleDeleted,
    SchedulePaused,
)
from broker.models import (
    AuditEvent,
    Message,
    ReplayJob,
    ReplayJobStatus,
    ReplaySchedule,
    ScheduleFiring,
)
from broker.pipeline.schedules import (
    ScheduleSpec,
    Timing,
    fired_this_slot,
    given_up_by,
    next_firings,
    schedule_create,
    schedule_delete,
    schedule_fire,
    schedule_pause,
    schedule_resume,
    schedule_run_now,
    schedule_update_parts,
    schedules_reading,
)
from broker.pipeline.selection import MessageSelection, ReplaySpec
from broker.pipeline.source import source_count
from broker.services.queues import queue_create, queue_delete
from tests.support.messages import SYSTEM_DEAD_LETTER_QUEUE as DLQ
from tests.support.messages import dead_lettered
from workers.celery import app
from workers.duties import EpochScheduler, PhasedScheduler

PARIS = ZoneInfo("Europe/Paris")
EVERY_2_S = Timing(every_seconds=2)


def spec(**values: Any) -> ScheduleSpec:
    replay = values.pop("replay", ReplaySpec(source="dead_letter", source_queue=DLQ))
    return ScheduleSpec(**{"name": "nightly", "replay": replay, "timing": EVERY_2_S, **values})


def create(**values: Any) -> ReplaySchedule:
    return schedule_create(spec=spec(**values), actor=None)


@pytest.fixture
def orders(db):
    return queue_create(name="ORDERS.IN", consumer="log")


# --- what a schedule may be ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"timing": Timing(cron="61 * * * *")}, "cron"),
        ({"timing": Timing(cron="0 24 * * *")}, "cron"),
        ({"timing": Timing(cron="0 9 * * * *")}, "cron"),
        ({"timing": Timing(cron="")}, "cron"),
        ({"timing": Timing(cron="1,,2 * * * *")}, "cron"),
        ({"timing": Timing(cron=",".join(["1"] * 200) + " * * * *")}, "cron"),
        ({"timing": Timing(cron="0 0 31 2 *")}, "cron"),
        ({"timing": Timing(cron="0 9 * * *", time_zone="localtime")}, "time_zone"),
        ({"timing": Timing(cron="0 9 * * *", time_zone="Europe/Pariss")}, "time_zone"),
        ({"timing": Timing(every_seconds=0)}, "every_seconds"),
        ({"timing": Timing(every_seconds=365 * 24 * 3600 + 1)}, "every_seconds"),
        ({"give_up_after": 0}, "give_up_after"),
        ({"cool_off_minutes": -1}, "cool_off_minutes"),
        ({"name": "  "}, "name"),
        ({"replay": ReplaySpec(source="dead_letter", source_queue="ORDERS.IN")}, "source_queue"),
        (
            {"replay": ReplaySpec(source="dead_letter", source_queue=DLQ, target_queue="NOPE")},
            "target_queue",
        ),
        ({"replay": ReplaySpec(source="delivered")}, "source"),
        ({"replay": ReplaySpec(source="dead_letter", source_queue=DLQ, dry_run=True)}, "dry_run"),
    ],
)
def test_a_schedule_that_cannot_fire_as_asked_is_refused_by_field_and_nothing_is_saved(
    orders, values, field
):
    with pytest.raises(InvalidInput) as refused:
        create(**values)

    assert field in refused.value.field_errors, refused.value.field_errors
    assert not isinstance(refused.value, AlreadyExists)
    assert (ReplaySchedule.objects.count(), PeriodicTask.objects.count()) == (0, 0)


def test_a_name_another_schedule_has_is_a_conflict_until_that_one_is_deleted(orders):
    first = create()

    with pytest.raises(AlreadyExists) as refused:
        create()
    schedule_delete(schedule_id=first.id, actor=None)
    again = create()

    assert refused.value.field_errors == {"name": ["Another schedule has this name."]}
    assert again.name == first.name
    assert PeriodicTask.objects.filter(enabled=True).count() == 1


def test_a_schedule_is_a_periodic_task_beat_reads(orders):
    cron = create(name="cron", timing=Timing(cron="30 2 * * 1-5", time_zone="Europe/Paris"))
    every = create(name="every", timing=EVERY_2_S, enabled=False)

    cron_task = PeriodicTask.objects.get(id=cron.periodic_task_id)
    every_task = PeriodicTask.objects.get(id=every.periodic_task_id)
    assert cron_task.task == every_task.task == "lazaretto.replay_schedule_fire"
    assert cron_task.kwargs == f'{{"schedule_id": {cron.id}}}'
    assert (cron_task.crontab.minute, cron_task.crontab.hour) == ("30", "2")
    assert cron_task.crontab.day_of_week == "1-5"
    assert str(cron_task.crontab.timezone) == "Europe/Paris"
    assert (every_task.interval.every, every_task.interval.period) == (2, "seconds")
    assert (cron_task.enabled, every_task.enabled) == (True, False)
    events = AuditEvent.objects.filter(action__startswith="schedule").order_by("id")
    assert list(events.values_list("action", "details__name")) == [
        ("schedule_create", "cron"),
        ("schedule_create", "every"),
    ]


def test_a_change_of_timing_replaces_the_interval_with_a_crontab(orders):
    schedule = create()

    schedule_update_parts(schedule_id=schedule.id, actor=None, cron="0 9 * * *")
    task = PeriodicTask.objects.get(id=schedule.periodic_task_id)

    assert (task.interval, task.crontab.hour) == (None, "9")


# --- when it fires ---------------------------------------------------------------------------


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, micro: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)


def test_the_next_firings_of_a_paris_crontab_keep_its_wall_clock_across_daylight_saving():
    """Clocks go forward in Paris at 01:00 UTC on 29 March 2026: 09:00 there
    is 08:00 UTC before and 07:00 UTC after."""
    times = next_firings(
        Timing(cron="0 9 * * *", time_zone="Europe/Paris"), after=utc(2026, 3, 27, 12), count=4
    )

    assert times == [
        utc(2026, 3, 28, 8),
        utc(2026, 3, 29, 7),
        utc(2026, 3, 30, 7),
        utc(2026, 3, 31, 7),
    ]
    assert {time.astimezone(PARIS).hour for time in times} == {9}


def test_a_firing_of_a_slot_already_fired_is_told_apart_from_the_next_slot():
    cron = Timing(cron="0 9 * * *", time_zone="Europe/Paris")
    fired = utc(2026, 3, 29, 7, 0, 0, 40_000)

    assert fired_this_slot(cron, last_fired=fired, now=fired + timedelta(seconds=30))
    assert not fired_this_slot(cron, last_fired=fired, now=utc(2026, 3, 30, 7, 0, 0, 10_000))
    assert fired_this_slot(EVERY_2_S, last_fired=fired, now=fired + timedelta(seconds=0.5))
    assert not fired_this_slot(EVERY_2_S, last_fired=fired, now=fired + timedelta(seconds=1.9))
    assert not fired_this_slot(EVERY_2_S, last_fired=None, now=fired)


class Recording(PhasedScheduler):
    """Beat's scheduler with the sends it would make recorded, at the time
    the (moved) clock said."""

    sent: list[datetime]

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        self.sent.append(timezone.now())


class RecordingNode(EpochScheduler):
    """A primary broker node's scheduler, its sends recorded."""

    sent: list[datetime]

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        self.sent.append(timezone.now())


@pytest.fixture
def one_session(monkeypatch):
    """The test's database session kept as the clock jumps (none ages out)."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", None)
    monkeypatch.setattr(connection, "close_at", None)


@pytest.mark.django_db(transaction=True)
def test_beat_fires_a_paris_crontab_at_its_wall_clock_times_across_daylight_saving(one_session):
    """Beat's scheduler (the one `celery beat` runs) over three days around
    the change, the clock moved every half hour: it fires at 09:00 in
    Paris each day, which is an hour earlier in UTC after the change."""
    queue_create(name="ORDERS.IN", consumer="log")
    with time_machine.travel(utc(2026, 3, 27, 12), tick=False) as clock:
        create(timing=Timing(cron="0 9 * * *", time_zone="Europe/Paris"))
        scheduler = Recording(app, duties={}, lazy=False)
        scheduler.sent = []
        for _ in range(3 * 24 * 2):
            clock.shift(timedelta(minutes=30))
            scheduler._next_change_check = 0.0  # the real clock stands still
            scheduler.tick()

    assert scheduler.sent == [utc(2026, 3, 28, 8), utc(2026, 3, 29, 7), utc(2026, 3, 30, 7)]


@pytest.mark.django_db(transaction=True)
def test_a_new_primary_does_not_send_again_the_slot_the_old_one_sent(one_session):
    """A failover: the new primary's scheduler reads the schedule's last
    run, which the old one stored as it sent the slot."""
    queue_create(name="ORDERS.IN", consumer="log")
    with time_machine.travel(utc(2026, 3, 27, 12, 0, 30), tick=False) as clock:
        create(timing=Timing(cron="* * * * *"))
        old = RecordingNode(app, duties={}, epoch=1, lazy=False)
        old.sent = []
        clock.shift(timedelta(seconds=30.5))
        old.tick()
        new = RecordingNode(app, duties={}, epoch=2, lazy=False)
        new.sent = []
        clock.shift(timedelta(seconds=1))
        new.tick()
        clock.shift(timedelta(seconds=59))
        new.tick()

    assert old.sent == [utc(2026, 3, 27, 12, 1, 0, 500_000)]
    assert new.sent == [utc(2026, 3, 27, 12, 2, 0, 500_000)]


@pytest.mark.django_db(transaction=True)
def test_beat_sees_a_schedule_saved_paused_and_resumed_while_it_runs():
    """Beat started before any schedule was saved; the schedule's pause
    comes after beat stored a run on its periodic task."""
    queue_create(name="ORDERS.IN", consumer="log")
    scheduler = Recording(app, duties={}, lazy=False)
    scheduler.sent = []
    scheduler.tick()

    def ticks_for(seconds: float) -> int:
        sent = len(scheduler.sent)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(max(scheduler.tick(), 0.0), 0.05))
        return len(scheduler.sent) - sent

    schedule = create(timing=Timing(every_seconds=1))
    assert ticks_for(2.6) >= 1
    schedule_pause(schedule_id=schedule.id, actor=None)
    ticks_for(1.5)  # a change is seen within CHANGE_CHECK_SECONDS (1 s)
    assert ticks_for(2.2) == 0
    schedule_resume(schedule_id=schedule.id, actor=None)
    assert ticks_for(2.6) >= 1


# --- what a firing does ----------------------------------------------------------------------


def test_a_firing_submits_a_job_limited_by_the_cool_off_and_the_give_up_limit(orders):
    schedule = create(cool_off_minutes=5, give_up_after=4)

    firing = schedule_fire(schedule_id=schedule.id)

    assert firing is not None
    job = firing.job
    assert job is not None
    assert job.entered_before is not None
    assert (job.schedule_id, job.source, job.source_queue, job.status) == (
        schedule.id,
        "dead_letter",
        DLQ,
        ReplayJobStatus.QUEUED,
    )
    assert job.generation_below == 4
    assert abs(job.entered_before - (timezone.now() - timedelta(minutes=5))) < timedelta(seconds=5)
    assert AuditEvent.objects.filter(action="schedule_fire", details__job=job.id).exists()


def test_a_firing_while_the_last_job_runs_is_skipped_and_recorded(orders):
    schedule = create()
    first = schedule_fire(schedule_id=schedule.id)
    ScheduleFiring.objects.update(fired_at=timezone.now() - timedelta(seconds=3))
    ReplaySchedule.objects.update(last_fired_at=timezone.now() - timedelta(seconds=3))

    second = schedule_fire(schedule_id=schedule.id)

    assert first is not None
    assert second is not None
    assert second.job is None
    assert second.skipped == f"replay job {first.job_id} was still queued"
    assert ReplayJob.objects.count() == 1
    assert AuditEvent.objects.filter(action="schedule_skip").count() == 1
    with pytest.raises(ScheduleBusy):
        schedule_run_now(schedule_id=schedule.id, actor=None)


def test_a_second_firing_of_the_same_slot_is_dropped(orders):
    """A failover's new primary may send a slot the old one fired."""
    schedule = create(timing=Timing(cron="* * * * *"))

    first = schedule_fire(schedule_id=schedule.id)
    ReplayJob.objects.update(status=ReplayJobStatus.DONE)
    again = schedule_fire(schedule_id=schedule.id)

    assert first is not None
    assert again is None
    assert ScheduleFiring.objects.count() == 1


def test_pause_stops_firings_resume_restarts_them_and_delete_keeps_the_jobs(orders):
    schedule = create()

    schedule_pause(schedule_id=schedule.id, actor=None)
    paused = schedule_fire(schedule_id=schedule.id)
    with pytest.raises(SchedulePaused):
        schedule_run_now(schedule_id=schedule.id, actor=None)
    schedule_resume(schedule_id=schedule.id, actor=None)
    resumed = schedule_fire(schedule_id=schedule.id)
    assert resumed is not None
    ReplayJob.objects.update(status=ReplayJobStatus.DONE)
    schedule_delete(schedule_id=schedule.id, actor=None)
    ReplaySchedule.objects.update(last_fired_at=None)
    deleted = schedule_fire(schedule_id=schedule.id)
    with pytest.raises(ScheduleDeleted):
        schedule_run_now(schedule_id=schedule.id, actor=None)

    assert paused is None
    assert deleted is None
    assert list(ReplayJob.objects.values_list("schedule_id", flat=True)) == [schedule.id]
    assert not PeriodicTask.objects.filter(enabled=True).exists()
    events = AuditEvent.objects.exclude(action="queue_create").order_by("id")
    assert [event.action for event in events] == [
        "schedule_create",
        "schedule_pause",
        "schedule_resume",
        "replay_submit",
        "schedule_fire",
        "schedule_delete",
    ]


def test_run_now_fires_outside_the_timing_and_leaves_the_slots_alone(orders):
    schedule = create()

    firing = schedule_run_now(schedule_id=schedule.id, actor=None)

    assert firing.manual
    assert firing.job is not None
    assert ReplaySchedule.objects.get(id=schedule.id).last_fired_at is None


def test_a_firing_whose_target_queue_went_is_skipped_with_the_reason(orders):
    parked = queue_create(name="PARKED.Q", consumer="log")
    schedule = create(
        replay=ReplaySpec(source="dead_letter", source_queue=DLQ, target_queue="PARKED.Q")
    )
    queue_delete(queue=parked)

    firing = schedule_fire(schedule_id=schedule.id)

    assert firing is not None
    assert firing.job is None
    assert firing.skipped == "There is no queue named 'PARKED.Q'."


# --- which messages its jobs take ----------------------------------------------------------


def scheduled_spec(schedule: ReplaySchedule) -> ReplaySpec:
    firing = schedule_fire(schedule_id=schedule.id)
    assert firing is not None
    assert firing.job is not None
    return ReplaySpec.of(firing.job)


def test_its_job_takes_no_message_dead_lettered_within_the_cool_off(orders):
    old, recent = dead_lettered(orders, 2)
    Message.objects.filter(id=old).update(enqueued_at=timezone.now() - timedelta(minutes=6))
    Message.objects.filter(id=recent).update(enqueued_at=timezone.now() - timedelta(minutes=1))

    five_minutes = scheduled_spec(create(cool_off_minutes=5))

    assert source_count(five_minutes) == 1
    assert source_count(dataclasses.replace(five_minutes, limits=None)) == 2


def test_its_job_takes_no_message_that_reached_the_give_up_limit_or_was_replayed_by_a_schedule(
    orders,
):
    fresh, third, given_up, replayed = dead_lettered(orders, 4)
    Message.objects.filter(id=third).update(generation=2)
    Message.objects.filter(id=given_up).update(generation=3)
    Message.objects.filter(id=replayed).update(schedule_replayed_at=timezone.now())

    limited = scheduled_spec(create(give_up_after=3))

    assert source_count(limited) == 2  # fresh and third


def test_run_now_of_a_schedule_whose_queue_went_names_the_field_as_invalid(orders):
    parked = queue_create(name="PARKED.Q", consumer="log")
    schedule = create(
        replay=ReplaySpec(source="dead_letter", source_queue=DLQ, target_queue="PARKED.Q")
    )
    queue_delete(queue=parked)

    with pytest.raises(InvalidInput) as refused:
        schedule_run_now(schedule_id=schedule.id, actor=None)

    assert type(refused.value) is InvalidInput
    assert "target_queue" in refused.value.field_errors
    assert not ReplayJob.objects.exists()


def test_a_schedule_gives_up_only_on_the_dead_letters_its_filter_takes(orders):
    payroll = queue_create(name="PAYROLL.IN", consumer="log")
    [order] = dead_lettered(orders, 1)
    [pay] = dead_lettered(payroll, 1)
    Message.objects.filter(id__in=[order, pay]).update(generation=3)
    create(
        name="orders-only",
        replay=ReplaySpec(
            source="dead_letter",
            source_queue=DLQ,
            filter=MessageSelection(queues=("ORDERS.IN",), reason="handler_error"),
        ),
    )
    create(name="everything", give_up_after=4)
    reading = schedules_reading(DLQ)

    def names(message_id: int) -> list[str]:
        return [s.name for s in given_up_by(reading, Message.objects.get(id=message_id))]

    assert names(order) == ["orders-only"]
    assert names(pay) == []
