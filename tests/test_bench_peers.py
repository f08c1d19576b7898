"""bench/peers.py: its arguments and plan, the batch check, the medians,
spreads, pairs and targets it draws from hand-made results, the latency
figures, its reading of the database server's CPU time, and one tiny real
run whose JSON line has the pairs and figures the report promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench import _peer_report as report
from bench import peers
from bench._harness import ROOT, BenchError
from bench._peer_worker import Arrivals, publish_times
from bench.peers import DatabaseWork, Result
from rig.processes import database_url_for_workers
from tests.support.arguments import usage_error


def result(
    system: str,
    batch: int | None,
    msgs_per_s: float,
    messages: int = 1000,
    database: DatabaseWork | None = None,
    sample: int = 1,
) -> Result:
    return Result(
        system=system,
        batch=batch,
        messages=messages,
        seconds=messages / msgs_per_s,
        peak_pss_kb=1024,
        database=database,
        sample=sample,
    )


# --- arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        pytest.param(
            ["--systems", "lazaretto-full,kafka"],
            "--systems: unknown system 'kafka' (choose from lazaretto-full, lazaretto-headers",
            id="an unknown system",
        ),
        pytest.param(
            ["--systems", ","], "--systems: give at least one system", id="an empty system list"
        ),
        pytest.param(
            ["--batches", "100,0"], "--batches: must be at least 1, not 0", id="batch zero"
        ),
        pytest.param(
            ["--messages", "0"], "--messages: must be at least 1, not 0", id="zero messages"
        ),
        pytest.param(
            ["--procrastinate-messages", "0"],
            "--procrastinate-messages: must be at least 1, not 0",
            id="zero messages for a slow peer",
        ),
        pytest.param(["--samples", "0"], "--samples: must be at least 1, not 0", id="no sample"),
        pytest.param(
            ["--latency-seconds", "-1"],
            "--latency-seconds: must be 0 or more, not -1",
            id="a negative latency run",
        ),
        pytest.param(
            ["--latency-rates", "20,0"],
            "--latency-rates: must be more than 0, not 0",
            id="rate zero",
        ),
        pytest.param(
            ["--latency-rates", ","], "--latency-rates: give at least one rate", id="no rate"
        ),
        pytest.param(
            ["--latency-capacity-share", "1.5"],
            "--latency-capacity-share: must be 1 or less, not 1.5",
            id="more than the capacity",
        ),
    ],
)
def test_it_rejects_a_bad_argument_naming_its_option(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    assert said in usage_error(peers.parse_args, capsys, *argv)


def test_defaults_drain_for_at_least_15_seconds_five_times() -> None:
    options = peers.parse_args([])
    assert options.messages == 500_000
    assert options.batch10_messages == 200_000
    assert options.batches == (100, 10)
    assert options.samples == 5
    assert options.systems == tuple(peers.SYSTEMS)
    assert options.batch1_messages == peers.DEFAULT_BATCH1_MESSAGES
    assert options.procrastinate_messages == peers.DEFAULT_PROCRASTINATE_MESSAGES
    assert options.celery_redis_messages == peers.DEFAULT_CELERY_REDIS_MESSAGES
    assert options.latency_seconds == 60.0
    assert options.latency_rates == (20.0, 1000.0, 5000.0)
    assert options.latency_capacity_share == 0.7
    assert options.keep
    assert options.latency_of == ("lazaretto", "pgqueuer")


def test_smaller_batches_drain_a_proportionate_share() -> None:
    options = peers.parse_args(["--messages", "20000"])
    assert options.messages_for("pgmq-delete", 100) == 20_000
    assert options.messages_for("pgmq-delete", 10) == 8_000
    assert options.messages_for("lazaretto-none", 10) == 8_000


def test_the_slow_defaults_never_exceed_messages() -> None:
    options = peers.parse_args(["--messages", "500"])
    assert options.batch1_messages == 500
    assert options.procrastinate_messages == 500
    assert options.celery_redis_messages == 500


def test_the_plan_runs_every_system_once_a_round() -> None:
    options = peers.parse_args(
        [
            *("--messages", "5000", "--batches", "100,1", "--samples", "2"),
            *("--systems", "pgmq-archive,procrastinate,bare"),
            *("--batch1-messages", "300", "--procrastinate-messages", "200"),
        ]
    )
    one_round = [
        ("pgmq-archive", 100, 5000),
        ("pgmq-archive", 1, 300),
        ("procrastinate", None, 200),
        ("bare", 100, 5000),
        ("bare", 1, 300),
    ]
    assert options.plan() == [(*run, 1) for run in one_round] + [(*run, 2) for run in one_round]
    assert options.needs_peer_venv
    assert options.needs_django


def test_lazaretto_and_the_bare_loop_need_no_peer_venv() -> None:
    options = peers.parse_args(["--systems", "lazaretto-full,bare,celery-redis"])
    assert not options.needs_peer_venv
    assert options.latency_of == ("lazaretto",)


def test_no_latency_run_at_zero_seconds() -> None:
    assert peers.parse_args(["--latency-seconds", "0"]).latency_of == ()


def test_each_lazaretto_system_is_a_retention_mode() -> None:
    assert peers.lazaretto.RETENTIONS == {
        "lazaretto-full": "full",
        "lazaretto-headers": "headers",
        "lazaretto-none": "none",
    }
    assert peers.lazaretto.expected_kept("full", 10) == (10, 0, 10)
    assert peers.lazaretto.expected_kept("headers", 10) == (10, 10, 10)
    assert peers.lazaretto.expected_kept("none", 10) == (0, 0, 0)


# --- the batch check -------------------------------------------------------------------


def test_the_batch_check_allows_a_few_short_fetches_as_the_queue_runs_low() -> None:
    check = peers.check_batches("pgmq-delete", 100, 100, 1000, Counter({100: 9, 76: 1, 24: 1}))
    assert check.largest == 100
    assert check.partial == 2


def test_the_batch_check_fails_when_the_batch_setting_is_ignored() -> None:
    with pytest.raises(BenchError, match="the batch setting did not take effect"):
        peers.check_batches("pgqueuer", 100, 100, 1000, Counter({10: 100}))


def test_the_batch_check_fails_on_many_short_fetches() -> None:
    fetches = Counter({100: 5, 50: 10})
    with pytest.raises(BenchError, match="did not take effect"):
        peers.check_batches("pgmq-archive", 100, 100, 1000, fetches)


def test_the_batch_check_fails_when_messages_are_missing() -> None:
    with pytest.raises(BenchError, match="returned 900 messages, not 1000"):
        peers.check_batches("bare", 10, 10, 1000, Counter({10: 90}))


def test_the_batch_check_takes_one_job_per_fetch_for_procrastinate() -> None:
    check = peers.check_batches("procrastinate", None, 1, 500, Counter({1: 500}))
    assert check.fetches == {1: 500}


def test_a_batch_larger_than_the_run_expects_one_fetch() -> None:
    check = peers.check_batches("pgmq-delete", 100, 100, 40, Counter({40: 1}))
    assert check.expected_size == 40
    assert check.partial == 0


# --- medians, pairs and targets ----------------------------------------------------------

# msgs/s by (system, batch)
RATES = {
    ("lazaretto-full", 100): 6000.0,
    ("lazaretto-full", 10): 1000.0,
    ("lazaretto-none", 100): 9000.0,
    ("lazaretto-headers", 100): 7000.0,
    ("lazaretto-headers", 10): 1000.0,
    ("bare", 100): 8000.0,
    ("bare", 10): 2500.0,
    ("pgmq-archive", 100): 4000.0,
    ("pgmq-delete", 100): 10000.0,
    ("pgqueuer", 100): 3500.0,
    ("pgqueuer", 10): 400.0,
    ("procrastinate", None): 200.0,
    ("celery-redis", None): 1500.0,
}
RESULTS = [result(system, batch, rate) for (system, batch), rate in RATES.items()]


def rows(results: list[Result]) -> dict[tuple[str, int | None], dict[str, object]]:
    return {(row["system"], row["batch"]): row for row in peers.summary_rows(results)}


def test_each_peer_is_compared_with_the_lazaretto_mode_that_keeps_as_much() -> None:
    found = rows(RESULTS)
    assert found[("pgmq-archive", 100)]["versus"] == "lazaretto-full"
    assert found[("pgmq-archive", 100)]["ratio_to_lazaretto"] == pytest.approx(0.667, abs=0.001)
    assert found[("pgmq-delete", 100)]["versus"] == "lazaretto-none"
    assert found[("pgmq-delete", 100)]["ratio_to_lazaretto"] == pytest.approx(1.111, abs=0.001)
    assert found[("pgqueuer", 10)]["versus"] == "lazaretto-headers"
    assert found[("pgqueuer", 10)]["ratio_to_lazaretto"] == 0.4
    assert found[("bare", 10)]["ratio_to_lazaretto"] == 2.5


def test_single_setting_peers_are_compared_with_lazaretto_full_at_batch_100() -> None:
    found = rows(RESULTS)
    assert found[("procrastinate", None)]["ratio_to_lazaretto"] == pytest.approx(0.033, abs=0.001)
    assert found[("celery-redis", None)]["ratio_to_lazaretto"] == 0.25


def test_a_result_row_has_the_median_the_spread_and_the_samples() -> None:
    database = DatabaseWork(wal_bytes=4_000_000, cpu_seconds=0.1)
    samples = [
        result("pgmq-delete", 10, rate, messages=2469, database=database, sample=n)
        for n, rate in enumerate((1234.5, 1000.0, 1500.0), start=1)
    ]
    (row,) = peers.summary_rows(samples)
    assert row == {
        "system": "pgmq-delete",
        "batch": 10,
        "messages": 2469,
        "samples": 3,
        "seconds": 2.0,
        "msgs_per_s": 1234.5,
        "msgs_per_s_min": 1000.0,
        "msgs_per_s_max": 1500.0,
        "msgs_per_s_samples": [1234.5, 1000.0, 1500.0],
        "versus": "lazaretto-none",
        "ratio_to_lazaretto": None,
        "peak_pss_mb": 1.0,
        "wal_bytes_per_msg": 1620,
        "database_cpu_us_per_msg": 40.5,
    }


def test_a_system_without_a_database_has_no_database_figures() -> None:
    (row,) = peers.summary_rows([result("celery-redis", None, 500.0)])
    assert (row["wal_bytes_per_msg"], row["database_cpu_us_per_msg"]) == (None, None)


def test_a_server_on_another_machine_has_no_cpu_figure() -> None:
    database = DatabaseWork(wal_bytes=1_000_000, cpu_seconds=None)
    (row,) = peers.summary_rows([result("pgmq-delete", 100, 1000.0, database=database)])
    assert (row["wal_bytes_per_msg"], row["database_cpu_us_per_msg"]) == (1000, None)


@pytest.mark.django_db
def test_the_servers_cpu_time_counts_what_a_backend_burns() -> None:
    with psycopg.connect(database_url_for_workers(), autocommit=True) as conn:
        before = peers.server_cpu_seconds(conn)
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)")
        after = peers.server_cpu_seconds(conn)

    assert before is not None
    assert after is not None
    assert after - before >= 0.1


def test_each_pair_is_held_to_its_target_ratio() -> None:
    pairs = {(t.lazaretto, t.peer, t.batch): t.minimum for t in peers.TARGETS}
    assert pairs == {
        ("lazaretto-full", "bare", 100): 0.6,
        ("lazaretto-full", "bare", 10): 0.5,
        ("lazaretto-full", "pgmq-archive", 100): 1.2,
        ("lazaretto-full", "pgmq-archive", 10): 1.2,
        ("lazaretto-none", "pgmq-delete", 100): 1.2,
        ("lazaretto-none", "pgmq-delete", 10): 1.2,
        ("lazaretto-headers", "pgqueuer", 100): 2.0,
        ("lazaretto-headers", "pgqueuer", 10): 2.0,
        ("lazaretto-full", "procrastinate", None): 20.0,
        ("lazaretto-full", "celery-redis", None): 5.0,
    }


def test_targets_are_lazaretto_over_the_peer_with_both_sides() -> None:
    targets = report.targets_summary(report.sampled(RESULTS))
    assert targets["lazaretto_full_vs_pgmq_archive_100"]["ratio"] == 1.5
    assert targets["lazaretto_full_vs_pgmq_archive_100"]["verdict"] == "PASS"
    assert targets["lazaretto_none_vs_pgmq_delete_100"]["ratio"] == 0.9
    assert targets["lazaretto_none_vs_pgmq_delete_100"]["verdict"] == "MISS"
    assert targets["lazaretto_headers_vs_pgqueuer_100"]["ratio"] == 2.0
    assert targets["lazaretto_headers_vs_pgqueuer_100"]["verdict"] == "PASS"
    assert targets["lazaretto_headers_vs_pgqueuer_10"]["ratio"] == 2.5
    assert targets["lazaretto_full_vs_bare_10"]["verdict"] == "MISS"
    assert targets["lazaretto_full_vs_procrastinate"]["ratio"] == 30.0
    assert targets["lazaretto_full_vs_procrastinate"]["lazaretto_batch"] == 100
    assert targets["lazaretto_full_vs_celery_redis"]["verdict"] == "MISS"
    pgqueuer = targets["lazaretto_headers_vs_pgqueuer_100"]
    assert pgqueuer["lazaretto_figures"]["system"] == "lazaretto-headers"
    assert pgqueuer["peer_figures"]["msgs_per_s"] == 3500.0


def test_a_pairs_spread_comes_from_the_ratios_of_each_round() -> None:
    results = [
        result("lazaretto-none", 100, 12000.0, sample=1),
        result("pgmq-delete", 100, 10000.0, sample=1),
        result("lazaretto-none", 100, 9000.0, sample=2),
        result("pgmq-delete", 100, 10000.0, sample=2),
        result("lazaretto-none", 100, 11000.0, sample=3),
        result("pgmq-delete", 100, 5000.0, sample=3),
    ]
    target = report.targets_summary(report.sampled(results))["lazaretto_none_vs_pgmq_delete_100"]
    assert (target["ratio"], target["ratio_min"], target["ratio_max"]) == (1.1, 0.9, 2.2)
    assert target["lazaretto_figures"]["msgs_per_s_min"] == 9000.0
    assert target["verdict"] == "MISS"


def test_a_target_is_not_judged_without_both_runs() -> None:
    targets = report.targets_summary(report.sampled([result("lazaretto-full", 100, 6000.0)]))
    assert targets["lazaretto_full_vs_pgmq_archive_100"]["ratio"] is None
    assert targets["lazaretto_full_vs_pgmq_archive_100"]["verdict"] == "n/a"
    targets = report.targets_summary(report.sampled([result("pgmq-archive", 100, 6000.0)]))
    assert targets["lazaretto_full_vs_pgmq_archive_100"]["verdict"] == "n/a"


def test_a_target_met_exactly_passes() -> None:
    assert report.verdict(1.2, 1.2) == "PASS"
    assert report.verdict(1.19, 1.2) == "MISS"


# --- latency ---------------------------------------------------------------------------


def test_latency_leaves_out_the_warm_up_and_takes_nearest_rank_percentiles() -> None:
    # 2 s of warm-up, then 100 messages of 1..100 ms.
    warm = [(1000.0 + n / 10, 0.5) for n in range(20)]
    measured = [(1002.0 + n / 100, (n + 1) / 1000) for n in range(100)]
    figures = report.latency_figures(warm + measured, warmup_seconds=2.0)
    assert figures == {
        "messages": 100,
        "warmup_messages": 20,
        "unacknowledged": 0,
        "p50_ms": 50.0,
        "p99_ms": 99.0,
        "max_ms": 100.0,
    }


def test_a_message_never_acknowledged_counts_as_slower_than_any() -> None:
    """Past its capacity a system's backlog outlasts the bench's wait: what
    was never acknowledged is no fast message left out."""
    acked: list[tuple[float, float | None]] = [
        (1000.0 + n / 100, (n + 1) / 1000)
        for n in range(100)  # 1..100 ms
    ]
    lost: list[tuple[float, float | None]] = [(1001.0, None), (1001.5, None)]

    figures = report.latency_figures(acked + lost, warmup_seconds=0)
    assert (figures["unacknowledged"], figures["p50_ms"], figures["max_ms"]) == (2, 51.0, None)
    assert figures["p99_ms"] is None  # the 101st of 102 is one never acknowledged
    assert report.latency_figures([*acked, (1001.0, None)], 0)["p99_ms"] == 100.0


def test_paced_publishes_arrive_at_the_rate_asked_at_irregular_times() -> None:
    """Poisson arrivals, the same for every system: not evenly spaced,
    which would meet a broker's once-a-second work on the same message
    every second or never."""
    first, second = publish_times(20, 30), publish_times(20, 30)
    assert len(first) == 600
    assert [b - a for a, b in pairwise(first)] == [b - a for a, b in pairwise(second)]
    gaps = [b - a for a, b in pairwise(first)]
    assert 25 < first[-1] - first[0] < 35
    assert min(gaps) < 0.01 < 0.1 < max(gaps)


def test_publishers_with_different_seeds_arrive_at_different_times() -> None:
    first, second = publish_times(500, 2, seed=0), publish_times(500, 2, seed=1)
    assert [b - a for a, b in pairwise(first)] != [b - a for a, b in pairwise(second)]


def test_what_arrived_while_a_call_ran_goes_out_in_the_next_call() -> None:
    arrivals = Arrivals(rate=1000, seconds=1, seed=0)
    time.sleep(0.05)  # a slow call: some 50 messages arrive meanwhile

    due = arrivals.due()

    assert 20 < len(due) < len(arrivals.pending) + len(due)
    assert arrivals.worst_lag >= 0.04
    arrivals.published(list(range(len(due))), due)
    # Each message dated by its arrival on the epoch clock, not by the call.
    assert list(arrivals.arrived.values()) == [at + arrivals.offset for at in due]


def point(rate: float, p99: float | None, basis: str = "fixed rate") -> dict[str, Any]:
    return {"rate_per_s": rate, "basis": basis, "p99_ms": p99}


def test_latency_targets_judge_lazaretto_s_p99_at_its_rates_and_beside_pgqueuer() -> None:
    latency = {
        "lazaretto": [
            point(20, 12.0),
            point(1000, 60.0),
            point(5000, None),
            point(14000, 900.0, "70% of ..."),
        ],
        "pgqueuer": [
            point(20, 9.0),
            point(1000, 80.0),
            point(5000, None),
            point(9000, 500.0, "70% of ..."),
        ],
    }

    targets = report.latency_targets(latency)

    assert {name: target["verdict"] for name, target in targets.items()} == {
        "lazaretto_p99_at_20": "PASS",
        "lazaretto_p99_at_1000": "MISS",
        "lazaretto_p99_vs_pgqueuer_at_20": "MISS",
        "lazaretto_p99_vs_pgqueuer_at_1000": "PASS",
        "lazaretto_p99_vs_pgqueuer_at_5000": "PASS",
    }
    assert report.latency_targets({})["lazaretto_p99_at_1000"]["verdict"] == "n/a"


def test_the_capacity_point_is_a_share_of_the_drain_rate_at_the_nearest_batch() -> None:
    options = peers.parse_args(["--latency-rates", "20", "--latency-capacity-share", "0.5"])
    results = [
        result("lazaretto-full", 100, 20_000.0),
        result("lazaretto-full", 10, 8_000.0),
    ]

    points = peers.latency_points(options, "lazaretto", results)

    assert [(p.rate, p.basis) for p in points] == [
        (20.0, "fixed rate"),
        (4000, "50% of lazaretto-full batch 10's 8,000 msgs/s"),
    ]
    assert [p.publishers for p in points] == [1, 4]
    assert peers.latency_points(options, "pgqueuer", results) == [peers.LatencyPoint(20.0)]


# --- memory ------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def test_pss_counts_a_forked_worker_s_shared_pages_once_where_rss_counts_them_in_each() -> None:
    """Two forked children of a process with a large heap share its pages:
    their RSS each count the whole, their PSS together about one copy."""
    ballast = bytearray(64 * 1024 * 1024)  # touched: resident in this process
    ballast[::4096] = b"x" * len(ballast[::4096])
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:  # the child: keep the inherited pages, shared, and wait
            time.sleep(30)
            os._exit(0)
        pids.append(pid)
    try:
        # A forked child's page tables, and so its RSS, hold the pages at once.
        rss = sum(rss_kb(pid) for pid in pids)
        pss = sum(peers.pss_kb(pid) for pid in pids)
        with peers.PeakPss([os.getpid()]) as peak:
            pass  # the sampler sums the tree once before it first waits
        assert rss > 2 * 60 * 1024  # each child's RSS counts the 64 MB
        assert pss < rss * 0.8, (pss, rss)  # shared with the parent and each other
        assert peak.peak_kb > pss  # the sampler summed the tree: the children and this
    finally:
        for pid in pids:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    del ballast


# --- the bench as its user runs it ----------------------------------------------------


def test_it_exits_2_without_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert peers.main(["--systems", "bare"]) == 2


@pytest.mark.skipif(not os.environ.get("DATABASE_URL"), reason="needs DATABASE_URL")
def test_a_tiny_run_reports_each_sample_the_pair_and_the_latency() -> None:
    command = [sys.executable, "-m", "bench.peers", "--systems", "lazaretto-full,bare"]
    command += ["--batches", "10", "--messages", "100", "--samples", "2"]
    command += ["--pgbench-seconds", "0", "--latency-seconds", "3", "--no-keep"]
    # One point: the capacity point runs the same code at another rate
    # (test_the_capacity_point_is_a_share_of_the_drain_rate_at_the_nearest_batch).
    command += ["--latency-rates", "50", "--latency-capacity-share", "0"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.splitlines()[-1])

    assert figures["durability"]["profile"] in ("durable", "fast")
    assert [(row["system"], row["batch"], row["samples"]) for row in figures["results"]] == [
        ("lazaretto-full", 10, 2),
        ("bare", 10, 2),
    ]
    for row in figures["results"]:
        assert row["messages"] == 40
        assert len(row["msgs_per_s_samples"]) == 2
        assert row["msgs_per_s_min"] <= row["msgs_per_s"] <= row["msgs_per_s_max"]
        assert row["wal_bytes_per_msg"] > 0
        assert row["peak_pss_mb"] > 0
    pair = figures["targets"]["lazaretto_full_vs_bare_10"]
    assert pair["verdict"] in ("PASS", "MISS")
    assert pair["ratio_min"] <= pair["ratio"] <= pair["ratio_max"]
    assert pair["lazaretto_figures"]["wal_bytes_per_msg"] > 0
    assert figures["targets"]["lazaretto_full_vs_pgmq_archive_10"]["verdict"] == "n/a"
    [latency] = figures["latency"]["lazaretto"]
    assert (latency["rate_per_s"], latency["basis"]) == (50.0, "fixed rate")
    assert latency["messages"] > 0
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    assert latency["publish_calls"] <= latency["messages"] + latency["warmup_messages"]
    assert latency["unacknowledged"] == 0
    assert min(latency["cpu_cores"].values()) > 0, latency["cpu_cores"]
    assert figures["latency_targets"]["lazaretto_p99_at_20"]["verdict"] == "n/a"
    assert "pairs: Lazaretto's median msgs/s" in run.stdout
