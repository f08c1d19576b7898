"""bench/peers.py without worker processes or a peer venv: its arguments,
its plan, the batch check, the ratios and targets it draws from hand-made
results, and its reading of the database server's CPU time."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from bench import peers
from bench._harness import BenchError
from bench.peers import DatabaseWork, Result
from rig.processes import database_url_for_workers
from tests.support.arguments import usage_error


def result(
    system: str,
    batch: int | None,
    msgs_per_s: float,
    messages: int = 1000,
    database: DatabaseWork | None = None,
) -> Result:
    return Result(
        system=system,
        batch=batch,
        messages=messages,
        seconds=messages / msgs_per_s,
        peak_rss_kb=1024,
        database=database,
    )


# --- arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        pytest.param(
            ["--systems", "lazaretto,kafka"],
            "--systems: unknown system 'kafka' (choose from lazaretto, bare, pgmq",
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
    ],
)
def test_it_rejects_a_bad_argument_naming_its_option(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    assert said in usage_error(peers.parse_args, capsys, *argv)


def test_slow_systems_drain_fewer_messages_by_default() -> None:
    options = peers.parse_args([])
    assert options.messages == 100_000
    assert options.batches == (100, 10, 1)
    assert options.systems == tuple(peers.SYSTEMS)
    assert options.batch1_messages == peers.DEFAULT_BATCH1_MESSAGES
    assert options.procrastinate_messages == peers.DEFAULT_PROCRASTINATE_MESSAGES
    assert options.celery_redis_messages == peers.DEFAULT_CELERY_REDIS_MESSAGES


def test_the_slow_defaults_never_exceed_messages() -> None:
    options = peers.parse_args(["--messages", "500"])
    assert options.batch1_messages == 500
    assert options.procrastinate_messages == 500
    assert options.celery_redis_messages == 500


def test_the_plan_runs_batched_systems_at_every_batch_and_the_others_once() -> None:
    options = peers.parse_args(
        [
            *("--messages", "5000", "--batches", "100,1", "--systems", "pgmq,procrastinate,bare"),
            *("--batch1-messages", "300", "--procrastinate-messages", "200"),
        ]
    )
    assert options.plan() == [
        ("pgmq", 100, 5000),
        ("pgmq", 1, 300),
        ("procrastinate", None, 200),
        ("bare", 100, 5000),
        ("bare", 1, 300),
    ]
    assert options.needs_peer_venv
    assert options.needs_django


def test_lazaretto_and_the_bare_loop_need_no_peer_venv() -> None:
    options = peers.parse_args(["--systems", "lazaretto,bare,celery-redis"])
    assert not options.needs_peer_venv


# --- the batch check -------------------------------------------------------------------


def test_the_batch_check_allows_a_few_short_fetches_as_the_queue_runs_low() -> None:
    check = peers.check_batches("pgmq", 100, 100, 1000, Counter({100: 9, 76: 1, 24: 1}))
    assert check.largest == 100
    assert check.partial == 2


def test_the_batch_check_fails_when_the_batch_setting_is_ignored() -> None:
    with pytest.raises(BenchError, match="the batch setting did not take effect"):
        peers.check_batches("pgqueuer", 100, 100, 1000, Counter({10: 100}))


def test_the_batch_check_fails_on_many_short_fetches() -> None:
    fetches = Counter({100: 5, 50: 10})
    with pytest.raises(BenchError, match="did not take effect"):
        peers.check_batches("pgmq", 100, 100, 1000, fetches)


def test_the_batch_check_fails_when_messages_are_missing() -> None:
    with pytest.raises(BenchError, match="returned 900 messages, not 1000"):
        peers.check_batches("bare", 10, 10, 1000, Counter({10: 90}))


def test_the_batch_check_takes_one_job_per_fetch_for_procrastinate() -> None:
    check = peers.check_batches("procrastinate", None, 1, 500, Counter({1: 500}))
    assert check.fetches == {1: 500}


def test_a_batch_larger_than_the_run_expects_one_fetch() -> None:
    check = peers.check_batches("pgmq", 100, 100, 40, Counter({40: 1}))
    assert check.expected_size == 40
    assert check.partial == 0


# --- ratios and targets ----------------------------------------------------------------

# msgs/s by (system, batch)
RATES = {
    ("lazaretto", 100): 6000.0,
    ("lazaretto", 10): 1000.0,
    ("bare", 100): 8000.0,
    ("bare", 10): 2500.0,
    ("pgmq", 100): 4000.0,
    ("pgqueuer", 100): 3500.0,
    ("pgqueuer", 10): 400.0,
    ("procrastinate", None): 200.0,
    ("celery-redis", None): 1500.0,
}
RESULTS = [result(system, batch, rate) for (system, batch), rate in RATES.items()]


def test_each_system_is_compared_with_lazaretto_at_the_same_batch() -> None:
    rows = {(row["system"], row["batch"]): row for row in peers.summary_rows(RESULTS)}
    assert rows[("lazaretto", 100)]["ratio_to_lazaretto"] == 1.0
    assert rows[("bare", 10)]["ratio_to_lazaretto"] == 2.5
    assert rows[("pgmq", 100)]["ratio_to_lazaretto"] == pytest.approx(0.667, abs=0.001)


def test_single_setting_peers_are_compared_with_lazaretto_batch_100() -> None:
    rows = {(row["system"], row["batch"]): row for row in peers.summary_rows(RESULTS)}
    assert rows[("procrastinate", None)]["ratio_to_lazaretto"] == pytest.approx(0.033, abs=0.001)
    assert rows[("celery-redis", None)]["ratio_to_lazaretto"] == 0.25


def test_a_result_row_has_the_figures_the_charts_read() -> None:
    database = DatabaseWork(wal_bytes=4_000_000, cpu_seconds=0.1)
    (row,) = peers.summary_rows([result("pgmq", 10, 1234.5, messages=2469, database=database)])
    assert row == {
        "system": "pgmq",
        "batch": 10,
        "messages": 2469,
        "seconds": 2.0,
        "msgs_per_s": 1234.5,
        "ratio_to_lazaretto": None,
        "peak_rss_mb": 1.0,
        "wal_bytes_per_msg": 1620,
        "database_cpu_us_per_msg": 40.5,
    }


def test_a_system_without_a_database_has_no_database_figures() -> None:
    (row,) = peers.summary_rows([result("celery-redis", None, 500.0)])
    assert (row["wal_bytes_per_msg"], row["database_cpu_us_per_msg"]) == (None, None)


def test_a_server_on_another_machine_has_no_cpu_figure() -> None:
    database = DatabaseWork(wal_bytes=1_000_000, cpu_seconds=None)
    (row,) = peers.summary_rows([result("pgmq", 100, 1000.0, database=database)])
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


def test_targets_are_lazaretto_over_the_peer() -> None:
    targets = peers.targets_summary(RESULTS)
    assert targets["lazaretto_vs_bare_100"] == {
        "peer": "bare",
        "batch": 100,
        "lazaretto_batch": 100,
        "minimum": 0.6,
        "ratio": 0.75,
        "verdict": "PASS",
    }
    assert targets["lazaretto_vs_bare_10"]["ratio"] == 0.4
    assert targets["lazaretto_vs_bare_10"]["verdict"] == "MISS"
    assert targets["lazaretto_vs_pgmq_100"]["verdict"] == "PASS"
    assert targets["lazaretto_vs_pgqueuer_100"]["ratio"] == pytest.approx(1.714, abs=0.001)
    assert targets["lazaretto_vs_pgqueuer_100"]["verdict"] == "MISS"
    assert targets["lazaretto_vs_pgqueuer_10"]["ratio"] == 2.5
    assert targets["lazaretto_vs_pgqueuer_10"]["verdict"] == "PASS"
    assert targets["lazaretto_vs_procrastinate"]["ratio"] == 30.0
    assert targets["lazaretto_vs_procrastinate"]["verdict"] == "PASS"
    assert targets["lazaretto_vs_celery_redis"]["ratio"] == 4.0
    assert targets["lazaretto_vs_celery_redis"]["verdict"] == "MISS"


def test_a_target_is_not_judged_without_both_runs() -> None:
    targets = peers.targets_summary([result("lazaretto", 100, 6000.0)])
    assert targets["lazaretto_vs_pgmq_100"]["ratio"] is None
    assert targets["lazaretto_vs_pgmq_100"]["verdict"] == "n/a"
    targets = peers.targets_summary([result("pgmq", 100, 6000.0)])
    assert targets["lazaretto_vs_pgmq_100"]["verdict"] == "n/a"


def test_a_target_met_exactly_passes() -> None:
    assert peers.verdict(1.2, 1.2) == "PASS"
    assert peers.verdict(1.19, 1.2) == "MISS"


def test_it_exits_2_without_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert peers.main(["--systems", "bare"]) == 2
