"""The primary's duties start at phases of their own (workers.duties): the
sweep and the dispatch, each every second, never start together, whether a
broker node sends them or ``celery beat`` does."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from celery.schedules import crontab

from workers.celery import app
from workers.duties import MAX_WAIT_SECONDS, EpochScheduler, PhasedScheduler, duty_phases

DUTIES: dict[str, dict[str, Any]] = {
    "sweep": {"task": "lazaretto.sweep", "schedule": 1.0},
    "dispatch": {"task": "lazaretto.dispatch", "schedule": 1.0},
    "notify-alarms": {"task": "lazaretto.notify_alarms", "schedule": 2.0},
    "archive": {"task": "lazaretto.archive", "schedule": crontab(hour=3, minute=17)},
}


def test_each_duty_every_so_many_seconds_has_a_phase_of_its_own():
    phases = duty_phases({"sweep": 1.0, "dispatch": 1.0, "notify-alarms": 2.0})

    assert phases == {"dispatch": 0.0, "notify-alarms": 1 / 3, "sweep": 2 / 3}


def sends(
    monkeypatch, make_scheduler: Callable[[], Any], seconds: float
) -> list[tuple[str, float]]:
    """(duty, monotonic time) of each send a scheduler makes in ``seconds``,
    with no replay schedule stored (tests/test_replay_schedules.py has
    those): the duties alone, each tick free of the store's latency. Ticked
    as beat and the broker node's sending thread tick it: a wait that is not
    positive is no wait. Between sends, the scheduler sleeps: a tick for
    each send, one for the wait after it, and one now and then for a wait
    that ended a hair early."""
    sent: list[tuple[str, float]] = []
    for scheduler_class in (EpochScheduler, PhasedScheduler):
        monkeypatch.setattr(
            scheduler_class,
            "apply_entry",
            lambda self, entry, producer=None: sent.append((entry.name, time.monotonic())),
        )
        monkeypatch.setattr(scheduler_class, "producer", None)
        monkeypatch.setattr(scheduler_class, "enabled_models", lambda self: [])
        monkeypatch.setattr(scheduler_class, "schedule_changed", lambda self: False)
        monkeypatch.setattr(scheduler_class, "sync", lambda self: None)
    scheduler = make_scheduler()
    started = time.monotonic()
    ticks = 0
    while time.monotonic() - started < seconds:
        wait = scheduler.tick()
        ticks += 1
        if wait > 0:
            time.sleep(min(wait, MAX_WAIT_SECONDS))
    assert ticks <= 3 * len(sent) + 5, f"{ticks} ticks for {len(sent)} sends"
    return sent


def assert_spread(sent: list[tuple[str, float]]) -> None:
    # In name order: the dispatch at 0, 1 and 2 s, the alarm posts at 1/3 s,
    # the sweep at 2/3 and 5/3 s; the archive not at all.
    assert [name for name, _ in sent] == [
        "dispatch",
        "notify-alarms",
        "sweep",
        "dispatch",
        "sweep",
        "dispatch",
    ]
    # Never two at once: each a third of a second after the one before.
    for (_, earlier), (_, later) in itertools.pairwise(sent):
        assert later - earlier > 0.25, sent


def test_a_broker_node_sends_each_duty_at_its_phase(monkeypatch):
    sent = sends(monkeypatch, lambda: EpochScheduler(app, duties=DUTIES, epoch=7, lazy=False), 2.2)

    assert_spread(sent)


def test_celery_beat_sends_each_duty_at_its_phase(monkeypatch, tmp_path, settings):
    """``celery beat`` with the settings' schedule: seven duties every 1,
    1, 1, 2, 5, 5 and 10 s, a seventh of a second apart."""
    assert app.conf.beat_scheduler == "workers.duties:PhasedScheduler"
    intervals = {
        name: entry["schedule"]
        for name, entry in settings.LAZARETTO_PRIMARY_DUTIES.items()
        if isinstance(entry["schedule"], float)
    }
    assert intervals == {
        "check-alerts": 1.0,
        "sweep": 1.0,
        "dispatch": 1.0,
        "heartbeat": 10.0,
        "dead-letter-scan": 5.0,
        "notify-alarms": 2.0,
        "start-jobs": 5.0,
    }
    sent = sends(
        monkeypatch,
        lambda: PhasedScheduler(app, schedule_filename=str(tmp_path / "beat"), lazy=False),
        1.93,  # between the sweep at 13/7 s and the next alert check at 14/7 s
    )

    assert [name for name, _ in sent] == [
        "check-alerts",  # at 0 s
        "dead-letter-scan",  # 1/7 s
        "dispatch",  # 2/7 s
        "heartbeat",  # 3/7 s
        "notify-alarms",  # 4/7 s
        "start-jobs",  # 5/7 s
        "sweep",  # 6/7 s
        "check-alerts",  # 7/7 s
        "dispatch",  # 9/7 s
        "sweep",  # 13/7 s
    ]
    for (_, earlier), (_, later) in itertools.pairwise(sent):
        assert later - earlier > 0.1, sent
