"""The peers bench's figures (bench/peers.py): the systems it runs, the pairs
it judges, each run's result, the median and spread of every system's
samples, the latency at a light load, and how they are printed.

A pair sets a Lazaretto delivered_retention mode beside the peer that keeps
as much of a delivered message: ``full`` beside PGMQ's archive, ``none``
beside PGMQ's delete, ``headers`` beside PgQueuer's log of finished jobs
(no payload). A pair's ratio is Lazaretto's median msgs/s over the peer's;
its spread is the least and the most of the ratios of the samples taken in
the same round (bench/peers.py runs every system once a round).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench import _harness as harness

# Lazaretto's batch that single-setting peers are compared with.
REFERENCE_BATCH = 100
# The Lazaretto system every system without a pair of its own is compared with.
LAZARETTO = "lazaretto-full"


@dataclass(frozen=True)
class System:
    name: str
    label: str
    # Has a batch setting, run at every --batches size; else one run, batch None.
    batched: bool
    # Runs from var/peers-venv.
    peer: bool


SYSTEMS = {
    system.name: system
    for system in (
        System(
            "lazaretto-full", "Lazaretto, retention full: the ack moves it to DLVD", True, False
        ),
        System(
            "lazaretto-headers",
            "Lazaretto, retention headers: DLVD kept, payload NULL",
            True,
            False,
        ),
        System("lazaretto-none", "Lazaretto, retention none: the ack deletes it", True, False),
        System("bare", "bare claim+ack loop (bench.deliver's), retention full", True, False),
        System("pgmq-archive", "PGMQ: read B + archive (moved to its archive table)", True, True),
        System("pgmq-delete", "PGMQ: read B + delete (nothing kept)", True, True),
        System("pgqueuer", "PgQueuer: batch_size B, logs each job without payload", True, True),
        System("procrastinate", "Procrastinate: one job per fetch, kept", False, True),
        System("celery-redis", "Celery with Redis alone: a task per message", False, False),
    )
}


@dataclass(frozen=True)
class Target:
    """The ``lazaretto`` system's msgs/s over the ``peer``'s, at ``batch``
    (REFERENCE_BATCH for Lazaretto when the peer has no batch setting), must
    be at least ``minimum``."""

    lazaretto: str
    peer: str
    batch: int | None
    minimum: float

    @property
    def key(self) -> str:
        name = f"{self.lazaretto}_vs_{self.peer}".replace("-", "_")
        return name if self.batch is None else f"{name}_{self.batch}"

    @property
    def lazaretto_batch(self) -> int:
        return self.batch or REFERENCE_BATCH


TARGETS = (
    Target("lazaretto-full", "bare", 100, 0.6),
    Target("lazaretto-full", "bare", 10, 0.5),
    Target("lazaretto-full", "pgmq-archive", 100, 1.2),
    Target("lazaretto-full", "pgmq-archive", 10, 1.2),
    Target("lazaretto-none", "pgmq-delete", 100, 1.2),
    Target("lazaretto-none", "pgmq-delete", 10, 1.2),
    Target("lazaretto-headers", "pgqueuer", 100, 2.0),
    Target("lazaretto-headers", "pgqueuer", 10, 2.0),
    Target("lazaretto-full", "procrastinate", None, 20.0),
    Target("lazaretto-full", "celery-redis", None, 5.0),
)
# The Lazaretto system each peer is set beside.
COUNTERPART = {target.peer: target.lazaretto for target in TARGETS}
# Lazaretto's p99 latency at most this (ms) at these rates (msgs/s).
LATENCY_P99_MS = {20.0: 20.0, 1000.0: 50.0}


@dataclass
class DatabaseWork:
    """What the database server did while a system drained: the WAL the
    cluster wrote and the CPU time of all its processes (backends,
    checkpointer, WAL writer, autovacuum); None when it is not on this
    machine."""

    wal_bytes: int = 0
    cpu_seconds: float | None = None


@dataclass(frozen=True)
class Result(harness.Rated):
    system: str
    batch: int | None
    messages: int
    seconds: float
    # The peak of the summed PSS of every process the system ran to consume
    # (sampled: bench.peers.PeakPss).
    peak_pss_kb: int
    # What the database server did meanwhile; None: the system has none.
    database: DatabaseWork | None = None
    # The round it was measured in, from 1.
    sample: int = 1

    @property
    def wal_bytes_per_message(self) -> float | None:
        return None if self.database is None else self.database.wal_bytes / self.messages

    @property
    def database_cpu_us_per_message(self) -> float | None:
        if self.database is None or self.database.cpu_seconds is None:
            return None
        return self.database.cpu_seconds / self.messages * 1e6


def median(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


@dataclass(frozen=True)
class Sampled:
    """Every sample of one system at one batch."""

    system: str
    batch: int | None
    results: tuple[Result, ...]

    @property
    def rates(self) -> list[float]:
        return [result.rate for result in self.results]

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def messages(self) -> int:
        return self.results[0].messages

    @property
    def wal_bytes_per_message(self) -> float | None:
        return median([result.wal_bytes_per_message for result in self.results])

    @property
    def database_cpu_us_per_message(self) -> float | None:
        return median([result.database_cpu_us_per_message for result in self.results])

    @property
    def peak_pss_kb(self) -> int:
        return max(result.peak_pss_kb for result in self.results)

    def by_sample(self) -> dict[int, Result]:
        return {result.sample: result for result in self.results}


def sampled(results: Sequence[Result]) -> list[Sampled]:
    """The results by (system, batch), in the order each first ran."""
    groups: dict[tuple[str, int | None], list[Result]] = {}
    for result in results:
        groups.setdefault((result.system, result.batch), []).append(result)
    return [Sampled(system, batch, tuple(group)) for (system, batch), group in groups.items()]


def find(figures: Sequence[Sampled], system: str, batch: int | None) -> Sampled | None:
    return next((f for f in figures if (f.system, f.batch) == (system, batch)), None)


@dataclass(frozen=True)
class Ratio:
    """One system's msgs/s over another's: of the medians, and the least and
    the most of the rounds' ratios."""

    median: float
    low: float
    high: float


def ratio(top: Sampled, bottom: Sampled) -> Ratio:
    theirs = bottom.by_sample()
    rounds = [r.rate / theirs[n].rate for n, r in top.by_sample().items() if n in theirs]
    if not rounds:
        rounds = [top.rate / bottom.rate]
    return Ratio(top.rate / bottom.rate, min(rounds), max(rounds))


def versus(figure: Sampled) -> str:
    """The Lazaretto system ``figure``'s system is compared with."""
    return COUNTERPART.get(figure.system, LAZARETTO)


def ratio_to_lazaretto(figure: Sampled, figures: Sequence[Sampled]) -> Ratio | None:
    """The system's msgs/s over its Lazaretto counterpart's at the same
    batch (at REFERENCE_BATCH for a system without a batch setting)."""
    batch = REFERENCE_BATCH if figure.batch is None else figure.batch
    lazaretto = find(figures, versus(figure), batch)
    return None if lazaretto is None else ratio(figure, lazaretto)


def target_ratio(target: Target, figures: Sequence[Sampled]) -> Ratio | None:
    """Lazaretto's msgs/s over the peer's; None unless both ran."""
    peer = find(figures, target.peer, target.batch)
    lazaretto = find(figures, target.lazaretto, target.lazaretto_batch)
    if peer is None or lazaretto is None:
        return None
    return ratio(lazaretto, peer)


def verdict(value: float | None, minimum: float) -> str:
    if value is None:
        return "n/a"
    return "PASS" if value >= minimum else "MISS"


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def side(figure: Sampled) -> dict[str, Any]:
    """One side of a pair: its median, spread, WAL and database CPU."""
    return {
        "system": figure.system,
        "batch": figure.batch,
        "msgs_per_s": round(figure.rate, 1),
        "msgs_per_s_min": round(min(figure.rates), 1),
        "msgs_per_s_max": round(max(figure.rates), 1),
        "wal_bytes_per_msg": rounded(figure.wal_bytes_per_message, 0),
        "database_cpu_us_per_msg": rounded(figure.database_cpu_us_per_message),
    }


def targets_summary(figures: Sequence[Sampled]) -> dict[str, dict[str, Any]]:
    """The JSON's "targets": each pair with both sides and its verdict."""
    summary = {}
    for target in TARGETS:
        found = target_ratio(target, figures)
        lazaretto = find(figures, target.lazaretto, target.lazaretto_batch)
        peer = find(figures, target.peer, target.batch)
        summary[target.key] = {
            "lazaretto": target.lazaretto,
            "peer": target.peer,
            "batch": target.batch,
            "lazaretto_batch": target.lazaretto_batch,
            "minimum": target.minimum,
            "ratio": None if found is None else round(found.median, 3),
            "ratio_min": None if found is None else round(found.low, 3),
            "ratio_max": None if found is None else round(found.high, 3),
            "verdict": verdict(None if found is None else found.median, target.minimum),
            "lazaretto_figures": None if lazaretto is None else side(lazaretto),
            "peer_figures": None if peer is None else side(peer),
        }
    return summary


def result_row(figure: Sampled, figures: Sequence[Sampled]) -> dict[str, Any]:
    """A row of the JSON's "results": a system at a batch, its samples'
    median and spread (what bench._charts draws is msgs_per_s)."""
    found = ratio_to_lazaretto(figure, figures)
    return {
        "system": figure.system,
        "batch": figure.batch,
        "messages": figure.messages,
        "samples": len(figure.results),
        "seconds": round(statistics.median(r.seconds for r in figure.results), 3),
        "msgs_per_s": round(figure.rate, 1),
        "msgs_per_s_min": round(min(figure.rates), 1),
        "msgs_per_s_max": round(max(figure.rates), 1),
        "msgs_per_s_samples": [round(rate, 1) for rate in figure.rates],
        "versus": versus(figure),
        "ratio_to_lazaretto": None if found is None else round(found.median, 3),
        "peak_pss_mb": round(figure.peak_pss_kb / 1024, 1),
        "wal_bytes_per_msg": rounded(figure.wal_bytes_per_message, 0),
        "database_cpu_us_per_msg": rounded(figure.database_cpu_us_per_message),
    }


def summary_rows(results: Sequence[Result]) -> list[dict[str, Any]]:
    figures = sampled(results)
    return [result_row(figure, figures) for figure in figures]


# --- latency at a light load -----------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: an observed value."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def latency_figures(
    measured: Sequence[tuple[float, float | None]], warmup_seconds: float
) -> dict[str, Any]:
    """p50, p99 and the worst publish-to-ack time in ms of ``measured``
    ((publish epoch, seconds; None: never acknowledged while the bench
    waited)), leaving out what was published in the first
    ``warmup_seconds``. A message never acknowledged counts as slower than
    any: a percentile it falls on is None, as is the worst."""
    start = min((at for at, _ in measured), default=0.0)
    counted = [
        math.inf if seconds is None else seconds * 1000
        for at, seconds in measured
        if at - start >= warmup_seconds
    ]
    if not counted:
        raise harness.BenchError("latency: no message published after the warm-up")

    def ms(value: float) -> float | None:
        return None if math.isinf(value) else round(value, 2)

    return {
        "messages": len(counted),
        "warmup_messages": len(measured) - len(counted),
        "unacknowledged": sum(1 for value in counted if math.isinf(value)),
        "p50_ms": ms(percentile(counted, 50)),
        "p99_ms": ms(percentile(counted, 99)),
        "max_ms": ms(max(counted)),
    }


def _at(points: Sequence[dict[str, Any]], rate: float) -> dict[str, Any] | None:
    return next((p for p in points if p["rate_per_s"] == rate and p["basis"] == "fixed rate"), None)


def latency_targets(latency: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Lazaretto's p99 within LATENCY_P99_MS at those rates, and at every
    fixed rate both ran no worse than PgQueuer's."""
    ours = latency.get("lazaretto", [])
    theirs = latency.get("pgqueuer", [])
    targets: dict[str, dict[str, Any]] = {}
    for rate, maximum in LATENCY_P99_MS.items():
        point = _at(ours, rate)
        p99 = None if point is None else point["p99_ms"]
        verdict = "n/a" if point is None else harness.verdict(p99 is not None and p99 <= maximum)
        targets[f"lazaretto_p99_at_{rate:g}"] = {
            "p99_ms": p99,
            "maximum_ms": maximum,
            "verdict": verdict,
        }
    for point in ours:
        peer = _at(theirs, point["rate_per_s"])
        if point["basis"] != "fixed rate" or peer is None:
            continue
        ours_p99, theirs_p99 = point["p99_ms"], peer["p99_ms"]
        # None: too many never acknowledged for a p99 (past the capacity).
        no_worse = theirs_p99 is None or (ours_p99 is not None and ours_p99 <= theirs_p99)
        targets[f"lazaretto_p99_vs_pgqueuer_at_{point['rate_per_s']:g}"] = {
            "p99_ms": ours_p99,
            "pgqueuer_p99_ms": theirs_p99,
            "verdict": harness.verdict(no_worse),
        }
    return targets


# --- the printed report ------------------------------------------------------------------


def spread(values: Sequence[float], digits: int = 0) -> str:
    return f"{min(values):,.{digits}f}-{max(values):,.{digits}f}"


def shown(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_results(results: Sequence[Result], tps: float | None) -> None:
    figures = sampled(results)
    header = ["system", "batch", "messages", "samples", "msgs/s", "min-max", "x tps"]
    header += ["vs", "ratio", "peak PSS MB", "WAL B/msg", "DB CPU us/msg"]
    rows = []
    for figure in figures:
        found = ratio_to_lazaretto(figure, figures)
        rows.append(
            [
                figure.system,
                "-" if figure.batch is None else str(figure.batch),
                str(figure.messages),
                str(len(figure.results)),
                f"{figure.rate:,.0f}",
                spread(figure.rates),
                "-" if not tps else f"{figure.rate / tps:.2f}",
                versus(figure),
                "-" if found is None else f"{found.median:.2f}",
                f"{figure.peak_pss_kb / 1024:.0f}",
                shown(figure.wal_bytes_per_message),
                shown(figure.database_cpu_us_per_message, 1),
            ]
        )
    harness.table(header, rows)


def print_targets(results: Sequence[Result]) -> None:
    """Each pair: both medians with their spreads, the ratio with its
    spread, both sides' WAL and database CPU per message, the verdict."""
    figures = sampled(results)
    print()
    print("pairs: Lazaretto's median msgs/s over the peer's (min-max of the rounds' ratios)")
    header = ["lazaretto", "peer", "batch", "lazaretto msgs/s", "peer msgs/s", "ratio"]
    header += ["min-max", "WAL B/msg", "DB CPU us/msg", "target"]
    rows = []
    for target in TARGETS:
        found = target_ratio(target, figures)
        lazaretto = find(figures, target.lazaretto, target.lazaretto_batch)
        peer = find(figures, target.peer, target.batch)
        if found is None or lazaretto is None or peer is None:
            continue
        rows.append(
            [
                target.lazaretto,
                target.peer,
                str(target.batch or f"{REFERENCE_BATCH}/-"),
                f"{lazaretto.rate:,.0f} ({spread(lazaretto.rates)})",
                f"{peer.rate:,.0f} ({spread(peer.rates)})",
                f"{found.median:.3f}",
                f"{found.low:.3f}-{found.high:.3f}",
                f"{shown(lazaretto.wal_bytes_per_message)} / {shown(peer.wal_bytes_per_message)}",
                f"{shown(lazaretto.database_cpu_us_per_message, 1)} / "
                f"{shown(peer.database_cpu_us_per_message, 1)}",
                f">= {target.minimum:g} {verdict(found.median, target.minimum)}",
            ]
        )
    if rows:
        harness.table(header, rows, align="<<>>>>>>><")
    else:
        print("  (no pair ran both sides)")


# The sides of a latency point whose cores are counted (bench.peers.cores_used).
CPU_SIDES = ("publishers", "consumers", "database")


def print_latency(latency: dict[str, list[dict[str, Any]]]) -> None:
    if not latency:
        return
    print()
    print(
        "latency, a message's arrival to its ack, Poisson arrivals (ms; '-': past the "
        "capacity, more than 1 % never acknowledged while the bench waited):"
    )
    rows = [
        [
            name,
            f"{p['rate_per_s']:,.0f}",
            p["basis"],
            str(p["publishers"]),
            str(p["messages"]),
            str(p["unacknowledged"]),
            shown(p["p50_ms"], 1),
            shown(p["p99_ms"], 1),
            shown(p["max_ms"], 1),
            f"{shown(p['from_commit']['p50_ms'], 1)} / {shown(p['from_commit']['p99_ms'], 1)}",
            f"{p['worst_publish_lag_ms']:.1f}",
            " / ".join(shown(p["cpu_cores"].get(side), 2) for side in CPU_SIDES),
        ]
        for name, points in latency.items()
        for p in points
    ]
    header = ["system", "msgs/s", "rate", "publishers", "messages", "never acked"]
    header += ["p50", "p99", "worst"]
    header += ["p50 / p99 from commit", "worst publish lag", "cores: publish / consume / db"]
    harness.table(header, rows)
    for name, target in latency_targets(latency).items():
        print(f"  {name}: {target['verdict']}")
