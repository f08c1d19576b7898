"""bench/soak.py without processes: its arguments, the figures it draws
from a time series (percentiles per window, drift, dead tuples, recovery,
the partitions' growth), and, on the test database, how it follows
deliveries in each delivered_retention mode: the delivered counter, the
final check, and the latency of messages whose ack deletes them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from bench import _celery, soak
from bench import _harness as harness
from bench.soak import Followed, Reading, Sample, Window
from rig.processes import database_url_for_workers
from tests.support.arguments import usage_error


def sample(
    t: float,
    *,
    phase: str = "steady",
    acked: float = 1000.0,
    published: float = 1000.0,
    p99: float | None = 100.0,
    dead: int = 0,
    window: float = 10.0,
    relations: dict[str, dict[str, Any]] | None = None,
) -> Sample:
    return Sample(
        t=t,
        window_s=window,
        phase=phase,
        published_per_s=published,
        acked_per_s=acked,
        p50_ms=None if p99 is None else p99 / 4,
        p95_ms=None if p99 is None else p99 / 2,
        p99_ms=p99,
        latency_samples=0 if p99 is None else 100,
        dead_tuples=dead,
        live_tuples=0,
        table_bytes=0,
        backlog=0,
        relations=relations or {},
    )


def steady_series(acked: Sequence[float]) -> list[Sample]:
    return [sample(10.0 * (n + 1), acked=rate) for n, rate in enumerate(acked)]


# --- arguments ----------------------------------------------------------------------


# What the usage error says about a bad argument, by the argument.
BAD_ARGUMENTS = {
    "--minutes 0": "--minutes: must be more than 0, not 0",
    "--minutes 0.2": "--minutes must be at least 0.33 (20 s",  # too short to halve
    "--rate -5": "--rate: must be more than 0, not -5",
    "--rate fast": "--rate: not a number: 'fast'",
    "--rate inf": "--rate: must be more than 0, not inf",
    "--idle-minutes 0": "--idle-minutes: must be more than 0",
    "--retention some": "--retention: must be full, headers or none, not 'some'",
}


@pytest.mark.parametrize(("argv", "said"), BAD_ARGUMENTS.items())
def test_it_rejects_a_bad_argument_naming_its_option(
    capsys: pytest.CaptureFixture[str], argv: str, said: str
) -> None:
    assert said in usage_error(soak.parse_args, capsys, *argv.split())


def test_it_rejects_a_recovery_without_a_window_after_the_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = usage_error(soak.parse_args, capsys, "--recovery-minutes", "1")
    assert "--recovery-minutes must be at least 1.17 (70 s" in error
    assert "60 s after the idle transaction ends" in error


def test_the_idle_transaction_may_outlast_the_steady_phase() -> None:
    # The phases follow each other: an idle transaction longer than the
    # steady phase is a valid (harsh) run.
    options = soak.parse_args(["--minutes", "1", "--idle-minutes", "5"])
    assert (options.minutes, options.idle_minutes) == (1.0, 5.0)


def test_defaults_are_the_issue_s() -> None:
    options = soak.parse_args([])
    assert options == soak.Options(
        minutes=10.0,
        rate=None,
        idle_minutes=3.0,
        recovery_minutes=2.0,
        drain_messages=20_000,
        size=1024,
        drain_while_publishing=True,
        retention="full",
    )


@pytest.mark.parametrize("mode", ["full", "headers", "none"])
def test_the_retention_mode_is_an_option(mode: str) -> None:
    assert soak.parse_args(["--retention", mode]).retention == mode


def test_the_soak_publishes_a_share_of_the_drain_measured_while_publishing() -> None:
    idle = soak.Drain(messages=20_000, seconds=2.0, first_claim_s=1.0)
    loaded = soak.Drain(messages=20_000, seconds=2.0, first_claim_s=1.0, loaded_rate=6_000.0)

    assert (idle.rate, idle.base) == (10_000.0, 10_000.0)
    assert (loaded.rate, loaded.base) == (10_000.0, 6_000.0)
    assert not soak.parse_args(["--no-drain-while-publishing"]).drain_while_publishing


# --- windows and percentiles -----------------------------------------------------------


def test_each_phase_is_cut_into_windows_from_its_own_start() -> None:
    windows = soak.plan_windows([("steady", 25), ("idle_txn", 10), ("recovery", 70)])
    assert windows[:4] == [
        Window("steady", 0, 10),
        Window("steady", 10, 20),
        Window("steady", 20, 25),
        Window("idle_txn", 25, 35),
    ]
    assert windows[-1] == Window("recovery", 95, 105)
    assert soak.phase_bounds(windows) == {
        "steady": [0, 25],
        "idle_txn": [25, 35],
        "recovery": [35, 105],
    }


def test_a_short_remainder_lengthens_the_phase_s_last_window() -> None:
    windows = soak.plan_windows([("recovery", 70.2)])
    assert len(windows) == 7
    assert windows[-1] == Window("recovery", 60, 70.2)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(n) for n in range(100, 0, -1)]  # unsorted
    assert [soak.percentile(values, q) for q in (50, 95, 99, 100)] == [50, 95, 99, 100]
    assert soak.percentile([0.25], 99) == 0.25
    assert soak.percentile([], 99) is None


def test_latencies_are_binned_by_ack_time() -> None:
    windows = [Window("steady", 0, 10), Window("steady", 10, 20)]
    acks = [(-0.5, 9.0), (0.0, 0.1), (9.99, 0.2), (10.0, 0.3), (19.5, 0.4), (20.0, 9.0)]
    assert soak.bin_latencies(acks, windows) == [[0.1, 0.2], [0.3, 0.4]]


def test_latency_figures_are_milliseconds() -> None:
    values = [n / 1000 for n in range(1, 201)]  # 1 ms to 200 ms
    assert soak.latency_ms(values) == {"p50_ms": 100.0, "p95_ms": 190.0, "p99_ms": 198.0}
    assert soak.latency_ms([]) == {"p50_ms": None, "p95_ms": None, "p99_ms": None}


def test_samples_take_rates_from_the_readings_at_both_ends() -> None:
    relations: dict[str, dict[str, Any]] = {
        "broker_message_live": {"dead_tuples": 30, "live_tuples": 5, "bytes": 1000},
        "broker_message_delivered": {"dead_tuples": 0, "live_tuples": 70, "bytes": 9000},
    }
    readings = [
        Reading(t=0.0, published=0, acked=0, backlog=0, relations={}),
        Reading(t=10.0, published=1000, acked=900, backlog=100, relations=relations),
        Reading(t=20.5, published=2050, acked=2000, backlog=50, relations=relations),
    ]
    windows = [Window("steady", 0, 10), Window("idle_txn", 10, 20)]
    first, second = soak.build_samples(windows, readings, [[0.01, 0.02], []])
    assert (first.published_per_s, first.acked_per_s, first.p99_ms) == (100.0, 90.0, 20.0)
    assert (first.dead_tuples, first.live_tuples, first.table_bytes) == (30, 75, 10000)
    assert (second.t, second.phase, second.acked_per_s, second.p99_ms) == (
        20,
        "idle_txn",
        104.8,
        None,
    )


def test_one_message_in_k_is_followed_for_about_2000_samples_a_window() -> None:
    assert soak.sample_every(100) == 1
    assert soak.sample_every(2000) == 10


# --- drift ------------------------------------------------------------------------------


def test_drift_compares_the_last_steady_minute_with_the_first() -> None:
    series = steady_series([1000] * 6 + [990] * 6 + [950] * 6)
    series.append(sample(190, phase="idle_txn", acked=10))
    assert soak.drift_pct(series) == pytest.approx(-5.0)


def test_drift_of_a_short_steady_phase_compares_its_halves() -> None:
    series = steady_series([1000, 1000, 1100, 1100])
    assert soak.drift_pct(series) == pytest.approx(10.0)


def test_drift_is_unknown_when_nothing_was_acked_at_first() -> None:
    assert soak.drift_pct(steady_series([0] * 6 + [1000] * 6)) is None


# --- dead tuples ------------------------------------------------------------------------


def test_a_vacuum_sawtooth_is_bounded() -> None:
    teeth = [10_000, 40_000, 70_000, 100_000, 20_000, 50_000] * 10
    series = [sample(10.0 * (n + 1), dead=dead) for n, dead in enumerate(teeth)]
    dead = soak.dead_tuples_halves(series)
    assert (dead.first_half_max, dead.second_half_max) == (100_000, 100_000)
    assert dead.first_half_mean == pytest.approx(dead.second_half_mean)
    assert dead.bounded


def test_one_vacuum_coming_late_leaves_the_dead_tuples_bounded() -> None:
    counts = [30_000] * 60
    counts[50] = 70_000
    series = [sample(10.0 * (n + 1), dead=dead) for n, dead in enumerate(counts)]
    dead = soak.dead_tuples_halves(series)
    assert (dead.first_half_max, dead.second_half_max) == (30_000, 70_000)
    assert dead.growth == pytest.approx(1.044, abs=0.001)
    assert dead.bounded


def test_dead_tuples_growing_all_along_are_not_bounded() -> None:
    series = [sample(10.0 * (n + 1), dead=3000 * (n + 1)) for n in range(60)]
    dead = soak.dead_tuples_halves(series)
    assert dead.growth == pytest.approx(45.5 / 15.5)
    assert not dead.bounded


def test_only_the_steady_phase_counts_for_dead_tuples() -> None:
    series = [sample(10.0 * (n + 1), dead=1000) for n in range(4)]
    series.append(sample(50, phase="idle_txn", dead=1_000_000))
    assert soak.dead_tuples_halves(series).growth == 1.0


# --- recovery ---------------------------------------------------------------------------


def recovery_series(recovery_p99: Sequence[float | None]) -> list[Sample]:
    series = steady_series([1000] * 6)
    series += [sample(60 + 10.0 * (n + 1), phase="idle_txn", p99=2000) for n in range(3)]
    series += [
        sample(90 + 10.0 * (n + 1), phase="recovery", p99=p99) for n, p99 in enumerate(recovery_p99)
    ]
    return series


def test_recovery_passes_when_the_p99_is_back_60_s_after_the_idle_transaction() -> None:
    series = recovery_series([900, 500, 300, 250, 150, 120, 110, 100])
    recovery = soak.recovery_check(series, steady_p99_ms=100.0)
    assert recovery.bound_ms == 200.0
    assert (recovery.check_t, recovery.check_p99_ms) == (150.0, 110)
    assert recovery.recovered_after_s == 40.0
    assert recovery.idle_max_p99_ms == 2000
    assert recovery.passed


def test_recovery_misses_when_the_p99_is_still_high_at_60_s() -> None:
    series = recovery_series([900, 500, 300, 250, 150, 120, 201, 100])
    recovery = soak.recovery_check(series, steady_p99_ms=100.0)
    assert recovery.check_p99_ms == 201
    assert recovery.recovered_after_s == 70.0
    assert not recovery.passed


def test_recovery_misses_without_acks_in_the_checked_window() -> None:
    series = recovery_series([900, 500, 300, 250, 150, 120, None, 100])
    recovery = soak.recovery_check(series, steady_p99_ms=100.0)
    assert recovery.check_p99_ms is None
    assert not recovery.passed


def test_a_recovery_that_never_comes_back_has_no_recovery_time() -> None:
    series = recovery_series([900] * 8)
    assert soak.recovery_check(series, steady_p99_ms=100.0).recovered_after_s is None


# --- failed tasks -------------------------------------------------------------------------


def test_failed_tasks_are_read_from_celery_s_log_lines() -> None:
    text = (
        "INFO celery.app.trace Task lazaretto.deliver[1] succeeded in 0.1s: None\n"
        "ERROR celery.app.trace Task lazaretto.deliver[2] raised unexpected: "
        "OperationalError('tuple to be locked was already moved') data={'id': '2'}\n"
    )
    assert soak.task_errors(text) == ["OperationalError('tuple to be locked was already moved')"]


def test_recovery_misses_when_the_steady_phase_did_not_keep_up() -> None:
    # A steady phase that built a backlog has a huge p99: recovering "within
    # twice" it would say nothing.
    series = recovery_series([100] * 8)
    series = [sample(s.t, acked=500) if s.phase == "steady" else s for s in series]
    recovery = soak.recovery_check(series, steady_p99_ms=100.0)
    assert recovery.steady_acked_ratio == 0.5
    assert recovery.check_p99_ms == 100
    assert not recovery.steady_kept_up
    assert not recovery.passed


# --- the partitions ----------------------------------------------------------------------


def sized(live: int, delivered: int) -> dict[str, dict[str, Any]]:
    return {
        soak.LIVE_PARTITION: {"bytes": live, "dead_tuples": 0, "live_tuples": 0},
        soak.DELIVERED_PARTITION: {"bytes": delivered, "dead_tuples": 0, "live_tuples": 0},
    }


def sized_series(live: Sequence[int], delivered: Sequence[int]) -> list[Sample]:
    series = [
        sample(10.0 * (n + 1), relations=sized(size, kept))
        for n, (size, kept) in enumerate(zip(live, delivered, strict=True))
    ]
    series.append(sample(len(series) * 10.0 + 10, phase="idle_txn", relations=sized(10**9, 0)))
    return series


def test_a_live_partition_that_stops_growing_is_flat() -> None:
    # It grows while the first vacuums come, then reuses what they free.
    series = sized_series([60, 90, 100, 100, 105, 105], [0] * 6)
    growth = soak.partition_growth(series, sized(50, 0), soak.LIVE_PARTITION)
    assert (growth.at_start, growth.steady_middle, growth.steady_end) == (50, 100, 105)
    assert growth.at_end == 10**9  # the idle transaction's bloat is not judged
    assert growth.steady_second_half_growth == pytest.approx(1.05)
    assert growth.flat


def test_a_live_partition_growing_all_along_is_not_flat() -> None:
    series = sized_series([100, 200, 300, 400, 500, 600], [0] * 6)
    growth = soak.partition_growth(series, sized(0, 0), soak.LIVE_PARTITION)
    assert growth.steady_second_half_growth == 2.0
    assert not growth.flat


def test_the_delivered_partition_s_growth_is_given_per_message_acked() -> None:
    # 6 windows of 10 s at 1000 acked/s: 60,000 messages, 1,500 bytes each.
    series = sized_series([100] * 6, [1000 + 15_000_000 * (n + 1) for n in range(6)])
    growth = soak.partition_growth(series, sized(100, 1000), soak.DELIVERED_PARTITION)
    assert growth.steady_bytes_per_acked == 1500.0


def test_without_relations_the_growth_is_unknown_and_not_flat() -> None:
    growth = soak.partition_growth(steady_series([1000] * 4), {}, soak.LIVE_PARTITION)
    assert growth.steady_second_half_growth is None
    assert not growth.flat


# --- latency where the ack deletes the message (mode none) --------------------------------


def test_a_vanished_message_was_acked_midway_between_two_lookups() -> None:
    at, latency, uncertainty = soak.vanished(Followed(published=100.0, last_seen=100.3), 100.35)
    assert at == pytest.approx(100.325)
    assert latency == pytest.approx(0.325)
    assert uncertainty == pytest.approx(0.025)


class HandOver:
    """The publisher's side of the sampler: ids sampled and when their
    publish call began."""

    def __init__(self) -> None:
        self.sampled: list[tuple[int, float]] = []

    def take_sampled(self) -> list[tuple[int, float]]:
        taken, self.sampled = self.sampled, []
        return taken


def none_sampler(publisher: HandOver) -> soak.LatencySampler:
    return soak.LatencySampler(
        bench_url="unused",
        publisher=publisher,  # type: ignore[arg-type]
        retention="none",
    )


def test_in_mode_none_the_sampler_looks_up_often() -> None:
    sampler = none_sampler(HandOver())
    assert (sampler.tick, sampler.limit) == (soak.GONE_TICK_SECONDS, soak.GONE_LOOKUP_LIMIT)
    assert sampler.tick <= 0.1
    full = soak.LatencySampler(bench_url="", publisher=HandOver(), retention="full")  # type: ignore[arg-type]
    assert full.tick == soak.SAMPLE_TICK_SECONDS


def test_in_mode_none_an_ack_is_dated_by_the_lookups_around_it() -> None:
    publisher = HandOver()
    sampler = none_sampler(publisher)
    publisher.sampled = [(1, 99.99), (2, 99.99)]
    sampler.take()
    # The first lookup finds 1 live (published at 100.0) and 2 gone already.
    acks = sampler.gone_acks([(1, 100.0, 100.05), (2, None, 100.05)])
    assert acks == {2: pytest.approx((100.02, 0.03))}
    assert sampler.acked_unseen == 1
    # The next finds 1 gone: acked between 100.05 and 100.11.
    acks = sampler.gone_acks([(1, None, 100.11)])
    assert acks == {1: pytest.approx((100.08, 0.08))}
    assert sampler.uncertainty == pytest.approx([0.03, 0.03])
    assert sampler.acked_unseen == 1
    assert sampler.followed == {}


# --- on the database: the counter, the final check, the sampler ----------------------------


def deliver(mode: str, count: int) -> Any:
    from broker.services.delivery import queue_deliver

    queue = _celery.make_queue(
        f"SOAK.{mode.upper()}", consumer="noop", batch_size=100, size=16, retention=mode
    )
    _celery.publish_messages(queue, _celery.new_message(b"soak"), count)
    queue_deliver(queue_id=queue.id)
    return queue


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["full", "headers", "none"])
def test_the_delivered_counter_and_the_check_hold_in_every_mode(mode: str) -> None:
    from broker.services.counting import counters_fold

    queue = deliver(mode, 5)
    with psycopg.connect(database_url_for_workers(), autocommit=True) as conn:
        assert harness.delivered(conn, queue.id) == 5
        counters_fold()
        assert harness.delivered(conn, queue.id) == 5
        assert harness.depths(conn, queue.id).get("DLVD", 0) == (0 if mode == "none" else 5)
    _celery.verify_delivered(queue, 5, "test", counted=True)
    with pytest.raises(harness.BenchError, match=r"expected (6 delivered|\(DLVD, .*\) \(6,)"):
        _celery.verify_delivered(queue, 6, "test", counted=True)


@pytest.mark.django_db(transaction=True)
def test_in_mode_none_a_message_left_live_fails_the_check() -> None:
    queue = deliver("none", 3)
    _celery.publish_messages(queue, _celery.new_message(b"late"), 1)
    with pytest.raises(harness.BenchError, match=r"rows\) \(0, 0, 0\)"):
        _celery.verify_delivered(queue, 3, "test", counted=True)


@pytest.mark.django_db(transaction=True)
def test_in_mode_none_the_sampler_finds_the_acks_on_the_database() -> None:
    from broker.services.delivery import queue_deliver

    queue = _celery.make_queue(
        "SOAK.NONE", consumer="noop", batch_size=100, size=16, retention="none"
    )
    message = _celery.new_message(b"x")
    publisher = soak.Publisher(queue_name=queue.name, rate=1, message=message, sample_every=2)
    sampler = soak.LatencySampler(bench_url="", publisher=publisher, retention="none")
    began = time.time()
    publisher.publish(3)
    assert publisher.handed.is_set()  # the sampler looks them up at once
    with psycopg.connect(database_url_for_workers(), autocommit=True) as conn:
        assert sampler.sample(conn, 10) == 0
        assert len(sampler.pending) == 2  # the first and the third
        for followed in sampler.followed.values():
            assert followed.seen
            assert began <= followed.published <= followed.last_seen
        queue_deliver(queue_id=queue.id)
        assert sampler.sample(conn, 10) == 2
    assert (sampler.pending, sampler.followed, sampler.acked_unseen) == ([], {}, 0)
    for at, latency in sampler.acks:
        assert began < at < time.time()
        assert 0 < latency < 60


class Lookups:
    """A connection that answers GONE_SQL: the ids in ``live`` are live
    (published at 100.0), the rest gone; each lookup at ``now``."""

    def __init__(self, live: set[int], now: float) -> None:
        self.live, self.now = live, now
        self.asked: list[list[int]] = []

    def execute(self, query: str, params: dict[str, list[int]]) -> Lookups:
        assert query == soak.GONE_SQL
        self.asked.append(list(params["ids"]))
        self.rows = [
            (message_id, 100.0 if message_id in self.live else None, self.now)
            for message_id in params["ids"]
        ]
        return self

    def fetchall(self) -> list[tuple[int, float | None, float]]:
        return self.rows


def test_in_mode_none_a_backlog_is_looked_up_at_its_head_and_just_sampled() -> None:
    publisher = HandOver()
    sampler = none_sampler(publisher)
    conn = Lookups(live={1, 2, 3, 4, 5}, now=101.0)
    publisher.sampled = [(1, 99.0), (2, 99.0), (3, 99.0)]
    sampler.sample(conn, 2)  # type: ignore[arg-type]
    publisher.sampled = [(4, 99.5), (5, 99.5)]
    sampler.sample(conn, 2)  # type: ignore[arg-type]
    conn.live, conn.now = {1, 3, 4, 5}, 101.2  # 2 acked out of order
    sampler.sample(conn, 2)  # type: ignore[arg-type]

    assert conn.asked == [[1, 2, 3], [1, 2, 4, 5], [1, 2]]
    assert sampler.pending == [1, 3, 4, 5]
    # 2 was last found at 101.0, gone at 101.2; published at 100.0.
    assert sampler.acks == [pytest.approx((101.1, 1.1))]


def test_checkpoints_are_counted_per_window_and_in_the_recovery_check() -> None:
    readings = [
        Reading(t=0.0, published=0, acked=0, backlog=0, relations={}, checkpoints=(5, 10)),
        Reading(t=10.0, published=10, acked=10, backlog=0, relations={}, checkpoints=(5, 12)),
        Reading(
            t=20.0,
            published=20,
            acked=20,
            backlog=0,
            relations={},
            checkpoints=(6, 12),
            oldest_snapshot_s=12.5,
            oldest_holder="client backend idle in transaction: SELECT 1",
            vacuum_xmin_age=4000,
        ),
    ]
    windows = [Window("steady", 0, 10), Window("recovery", 10, 20)]
    first, second = soak.build_samples(windows, readings, [[], []])
    assert (first.checkpoints_timed, first.checkpoints_requested) == (0, 2)
    assert (second.checkpoints_timed, second.checkpoints_requested) == (1, 0)
    assert (second.oldest_snapshot_s, second.vacuum_xmin_age) == (12.5, 4000)
    assert second.oldest_holder.startswith("client backend idle in transaction")
    recovery = soak.Recovery(
        None, check_t=10.0, check_p99_ms=None, recovered_after_s=None, idle_max_p99_ms=None
    )
    assert soak.checkpoint_figures([first, second], recovery) == {
        "timed": 1,
        "requested": 2,
        "in_recovery_check_window": 1,
    }
