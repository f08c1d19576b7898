"""The sweep's and the dispatch's scans rest, in each control process, for
SCAN_REST_FACTOR times as long as their last scan took: a slow scan (an old
transaction keeps the dead index entries it walks) takes at most a tenth of
the process's time."""

from __future__ import annotations

import time

import pytest

from broker.services.sweeper import SweepResult
from workers import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_rest():
    tasks._rest_until.clear()
    yield
    tasks._rest_until.clear()


def counting(seconds: float, result: object = None) -> tuple[list[float], object]:
    runs: list[float] = []

    def run(*args: object, **kwargs: object) -> object:
        runs.append(time.monotonic())
        time.sleep(seconds)
        return result

    return runs, run


def test_a_slow_sweep_rests_nine_times_as_long_before_the_next(monkeypatch):
    runs, slow = counting(0.2, SweepResult())
    monkeypatch.setattr(tasks, "messages_sweep", slow)

    tasks.sweep()
    tasks.sweep()
    assert len(runs) == 1
    # It took at least its 0.2 s, and rests nine times what it took: the
    # rest ends 2 s or more after it began (more on a busy machine).
    rest_until = tasks._rest_until["sweep"]
    assert rest_until - runs[0] >= 10 * 0.2
    # Still resting half a second before the rest is over...
    tasks._rest_until["sweep"] = time.monotonic() + 0.5
    tasks.sweep()
    assert len(runs) == 1
    # ...not once it is.
    tasks._rest_until["sweep"] = time.monotonic() - 0.01
    tasks.sweep()
    assert len(runs) == 2


def test_a_quick_sweep_runs_every_time_it_is_sent(monkeypatch):
    runs, quick = counting(0.0, SweepResult())
    monkeypatch.setattr(tasks, "messages_sweep", quick)
    # The scan's other statement, quick too: on a loaded machine a real one
    # may take long enough for its rest to outlast the pause below.
    monkeypatch.setattr(tasks, "messages_expire", lambda: [])

    for _ in range(3):
        tasks.sweep()
        time.sleep(0.05)

    assert len(runs) == 3


def test_a_slow_dispatch_rests_too(monkeypatch):
    runs, slow = counting(0.2, [])
    monkeypatch.setattr(tasks, "queues_with_due_messages", slow)

    tasks.dispatch()
    tasks.dispatch()

    assert len(runs) == 1
    assert tasks._rest_until["dispatch"] - time.monotonic() > 1.5
