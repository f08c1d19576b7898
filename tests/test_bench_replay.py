"""bench/replay.py without processes: its arguments, the targets' verdicts
for the warm Spark Connect and cold classic modes, and its JSON summary."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from bench import replay
from bench._harness import BenchError, Timed
from bench._replay_firings import Firings, due_times
from bench.replay import Figures, Options, SparkTimes
from tests.support.arguments import usage_error

MESSAGES = 100_000
CONFIG = {
    "master": "local[*]",
    "partitions": 4,
    "slice_rows": 250_000,
    "fetch_rows": 10_000,
    "write_batch_rows": 10_000,
    "remote": "sc://127.0.0.1:15002",
}


def spark_times(mode: str, *, total: float, ready: float, first_write: float) -> SparkTimes:
    return SparkTimes(
        mode=mode,
        total=total,
        submit=0.01,
        ready=ready,
        ready_exact=True,
        driver_started=0.8,
        first_jdbc=ready + 0.1,
        first_write=first_write,
        first_copy=first_write - 0.3,
        finished=total - 0.2,
        db_seconds={"replay_insert": 3.0},
        longest_seconds={"replay_insert": 3.0},
    )


def figures(
    *,
    statement: float = 10.0,
    connect: tuple[float, float, float] = (16.0, 1.0, 2.5),
    classic: tuple[float, float, float] = (40.0, 15.0, 38.0),
    orm_rate: float = 500.0,
) -> Figures:
    """100,000 messages: the single statement in ``statement`` seconds, each
    mode's (end to end, start-up, first write), the ORM loop at ``orm_rate``
    on a sample of 20,000."""
    made = Figures(config=dict(CONFIG))
    made.results["insert_select"] = Timed("insert_select", statement, MESSAGES)
    for mode, (total, ready, first_write) in (("connect", connect), ("classic", classic)):
        made.results[f"spark_{mode}"] = Timed(f"spark_{mode}", total, MESSAGES)
        made.spark[mode] = spark_times(mode, total=total, ready=ready, first_write=first_write)
    made.results["orm"] = Timed("orm", 20_000 / orm_rate, 20_000)
    made.warmup = Timed("warmup", 9.0, 1_000)
    made.load = {"start": 5.1, "end": 6.4}
    return made


def options(messages: int = MESSAGES) -> Options:
    return replay.parse_args(["--messages", str(messages)])


# --- arguments ----------------------------------------------------------------------


def test_the_orm_sample_is_at_most_the_messages() -> None:
    assert options(5_000).orm_sample == 5_000
    assert options(1_000_000).orm_sample == replay.ORM_SAMPLE


def test_the_defaults_are_a_million_messages_of_1_kb_and_a_small_warm_up() -> None:
    defaults = replay.parse_args([])
    assert (defaults.messages, defaults.size) == (1_000_000, 1024)
    assert defaults.warmup_messages == replay.WARMUP_MESSAGES


@pytest.mark.parametrize("argv", ["--messages 0", "--warmup-messages 0", "--orm-sample -1"])
def test_it_rejects_a_count_below_one(capsys: pytest.CaptureFixture[str], argv: str) -> None:
    assert "must be at least 1" in usage_error(replay.parse_args, capsys, *argv.split())


# --- the driver's mode ----------------------------------------------------------------


def test_connect_mode_names_the_server_and_classic_mode_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    replay.spark_mode("connect", "sc://127.0.0.1:15002")
    assert replay.os.environ["SPARK_REMOTE"] == "sc://127.0.0.1:15002"
    replay.spark_mode("classic", None)
    assert "SPARK_REMOTE" not in replay.os.environ


def test_connect_mode_without_a_server_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    with pytest.raises(BenchError, match="without a Spark Connect server"):
        replay.spark_mode("connect", None)


# --- the figures ------------------------------------------------------------------------


def test_the_spark_phase_runs_from_the_session_up_to_the_end() -> None:
    times = spark_times("connect", total=16.0, ready=1.0, first_write=2.5)
    assert times.phase == pytest.approx(15.0)


def test_ratios_per_mode() -> None:
    found = replay.ratios(figures())
    # Phases of 15 s and 25 s for 100,000 messages, against 10,000 msgs/s.
    assert found["connect_phase_vs_insert_select"] == pytest.approx(100_000 / 15 / 10_000)
    assert found["classic_phase_vs_insert_select"] == pytest.approx(0.4)
    # End to end 6,250 and 2,500 msgs/s against the ORM's 500.
    assert found["connect_vs_orm"] == pytest.approx(12.5)
    assert found["classic_vs_orm"] == pytest.approx(5.0)


def test_the_end_to_end_limit_is_one_and_a_half_statements_and_three_seconds() -> None:
    assert replay.end_to_end_limit(figures(statement=10.0)) == pytest.approx(18.0)


def test_verdicts_per_mode() -> None:
    assert replay.verdicts(figures()) == {
        "connect_submit_to_first_write": "PASS",
        "connect_phase_vs_insert_select": "PASS",
        "connect_end_to_end": "PASS",
        "connect_vs_orm": "MISS",
        "classic_submit_to_first_write": "n/a (the target is the warm server's)",
        "classic_phase_vs_insert_select": "MISS",
        "classic_end_to_end": "MISS",
        "classic_vs_orm": "MISS",
    }


@pytest.mark.parametrize(("first_write", "said"), [(3.0, "PASS"), (3.01, "MISS")])
def test_the_warm_server_writes_first_within_three_seconds(first_write: float, said: str) -> None:
    judged = replay.verdicts(figures(connect=(16.0, 1.0, first_write)))
    assert judged["connect_submit_to_first_write"] == said


@pytest.mark.parametrize(("total", "said"), [(18.0, "PASS"), (18.01, "MISS")])
def test_end_to_end_against_the_statement_of_the_same_run(total: float, said: str) -> None:
    judged = replay.verdicts(figures(statement=10.0, classic=(total, 1.0, 2.0)))
    assert judged["classic_end_to_end"] == said


def test_twenty_times_the_orm_loop_passes() -> None:
    judged = replay.verdicts(figures(orm_rate=6_250 / 20))
    assert judged["connect_vs_orm"] == "PASS"
    assert judged["classic_vs_orm"] == "MISS"


def test_the_summary_carries_both_modes_the_targets_and_the_load() -> None:
    found = replay.summary(options(), figures())
    json.dumps(found)
    assert found["messages"] == MESSAGES
    assert found["insert_select_seconds"] == 10.0
    for mode in replay.MODES:
        for name in (
            "end_to_end_seconds",
            "submit_to_first_write_seconds",
            "submit_to_first_copy_seconds",
            "startup_seconds",
            "phase_seconds",
            "phase_msgs_per_s",
        ):
            assert f"{mode}_{name}" in found
    assert found["connect_submit_to_first_write_seconds"] == 2.5
    assert found["connect_phase_msgs_per_s"] == pytest.approx(6666.7)
    assert found["end_to_end_limit_seconds"] == 18.0
    assert found["first_write_definition"] == replay.FIRST_WRITE_DEFINITION
    assert found["load_average"] == {"start": 5.1, "end": 6.4}
    assert found["warmup_messages"] == 1_000
    assert found["verdicts"] == replay.verdicts(figures())
    assert found["targets"]["connect_submit_to_first_write_seconds"] == 3.0
    assert found["targets"]["end_to_end_slack_seconds"] == 3.0
    assert found["spark"]["remote"] == "sc://127.0.0.1:15002"


def test_the_report_prints_the_definition_and_every_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    replay.print_report(options(), figures())
    out = capsys.readouterr().out
    assert replay.FIRST_WRITE_DEFINITION in out
    for way in replay.WAYS:
        assert way in out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert lines["connect_submit_to_first_write"] == ["2.50", "s", "<=", "3", "s", "PASS"]
    assert lines["classic_end_to_end"][:2] == ["40.00", "s"]
    assert lines["classic_end_to_end"][-1] == "MISS"
    last = json.loads(out.strip().splitlines()[-1])
    assert last["bench"] == "replay"


def test_the_job_watcher_names_the_replay_statements() -> None:
    from broker.services.transitions.replayed import _FROM_ARCHIVE_SQL, _FROM_HOT_SQL

    # The statements the writer runs, as they are.
    assert replay.classify_replay("x", _FROM_HOT_SQL) == "replay_insert"
    assert replay.classify_replay("x", _FROM_ARCHIVE_SQL) == "replay_insert"
    assert replay.classify_replay("x", "INSERT INTO broker_replaystage ...") == "stage_load"
    assert replay.classify_replay("PostgreSQL JDBC Driver", "SELECT 1") == "jdbc_read"
    assert replay.classify_replay("x", "SELECT 1") is None


# --- a replay schedule's firings ---------------------------------------------------------


def firings(delays: list[float], skipped: int = 0) -> Firings:
    return Firings(delays=delays, skipped=skipped, every=6, messages=100)


def test_each_firing_is_due_an_interval_after_the_previous_send() -> None:
    saved = datetime(2026, 11, 29, 7, 0, 0, tzinfo=UTC)
    sent = [saved + timedelta(seconds=s) for s in (6.1, 12.3, 18.2)]

    dues = due_times(saved, sent, 6)

    assert [(due - saved).total_seconds() for due in dues] == [6.0, 12.1, 18.3]


def test_the_firings_p99_is_the_slowest_of_twenty_and_judged_against_three_seconds() -> None:
    twenty = firings([1.0] * 18 + [2.0, 2.9])
    slow = firings([1.0] * 19 + [3.2])

    assert (twenty.p50, twenty.p99) == (1.0, 2.9)
    assert twenty.on_target
    assert not slow.on_target
    assert not firings([1.0] * 20, skipped=1).on_target


def test_the_summary_and_the_report_carry_the_firings() -> None:
    made = figures()
    made.firings = firings([1.0] * 19 + [2.5])

    found = replay.summary(options(), made)

    assert found["schedule_firings"]["p99_seconds"] == 2.5
    assert found["schedule_firings"]["firings"] == 20
    assert found["verdicts"]["schedule_firing_p99"] == "PASS"
    assert found["targets"]["schedule_firing_p99_seconds"] == 3.0
