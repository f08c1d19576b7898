"""Charts of the latest peers and soak runs, as PNGs in docs/img/.

Run from the project root::

    .venv/bin/python -m bench._charts [--bench-dir var/bench] [--out docs/img]

It reads var/bench/peers-latest.json and var/bench/soak-latest.json,
whichever exist, and writes docs/img/peers-throughput.png and
docs/img/soak.png. matplotlib is not a project requirement: when this
interpreter lacks it, the module makes var/charts-venv from
bench/charts-requirements.txt (once) and runs itself again there. Nothing
here imports the project, so that venv needs nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._venv import VenvError, venv_python

ROOT = Path(__file__).resolve().parent.parent
CHARTS_VENV = ROOT / "var" / "charts-venv"
REQUIREMENTS = ROOT / "bench" / "charts-requirements.txt"
# Set when the module runs itself again in CHARTS_VENV: not a second time.
IN_CHARTS_VENV = "LAZARETTO_CHARTS_VENV"
PEERS_FILE = "peers-latest.json"
SOAK_FILE = "soak-latest.json"
PEERS_PNG = "peers-throughput.png"
SOAK_PNG = "soak.png"
IDLE_COLOUR = "#f4c7c3"
Samples = Sequence[dict[str, Any]]  # a soak run's windows
Phases = dict[str, list[float]]  # {phase: [start, end]}, in seconds


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bench-dir", type=Path, default=ROOT / "var" / "bench")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    return parser.parse_args(argv)


# --- matplotlib, from var/charts-venv when this interpreter lacks it -----------------


def has_matplotlib() -> bool:
    try:
        import matplotlib  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


def charts_python() -> Path:
    """var/charts-venv's interpreter, with the pinned matplotlib (bench/_venv.py)."""
    try:
        return venv_python(CHARTS_VENV, REQUIREMENTS)
    except VenvError as error:
        raise SystemExit(str(error)) from None


def run_in_charts_venv(argv: Sequence[str]) -> int:
    if os.environ.get(IN_CHARTS_VENV):
        log(f"matplotlib is missing from {sys.executable}")
        return 1
    python = charts_python()
    env = {**os.environ, IN_CHARTS_VENV: "1"}
    command = [str(python), "-m", "bench._charts", *argv]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


# --- peers: throughput against batch size -----------------------------------------------


def peers_series(results: Sequence[dict[str, Any]]) -> dict[str, list[tuple[int | None, float]]]:
    """(batch, msgs/s) per system, in the order the systems first appear,
    each system's points by batch size."""
    series: dict[str, list[tuple[int | None, float]]] = {}
    for result in results:
        series.setdefault(result["system"], []).append(
            (result.get("batch"), float(result["msgs_per_s"]))
        )
    for points in series.values():
        points.sort(key=lambda point: (point[0] is None, point[0] or 0))
    return series


def draw_peers(peers: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt  # type: ignore[import-not-found]

    series = peers_series(peers["results"])
    batches = sorted({b for points in series.values() for b, _ in points if b is not None})
    figure, axes = plt.subplots(figsize=(9, 5.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (system, points) in enumerate(series.items()):
        colour = colours[index % len(colours)]
        if len(points) > 1 and all(batch is not None for batch, _ in points):
            axes.plot(
                [batch for batch, _ in points],
                [rate for _, rate in points],
                marker="o",
                color=colour,
                label=system,
            )
            continue
        # One setting: a horizontal line across the chart, and a marker at
        # its batch size when it has one.
        batch, rate = points[-1]
        axes.axhline(rate, linestyle="--", linewidth=1, color=colour, label=system)
        if batch is not None:
            axes.plot([batch], [rate], marker="D", color=colour)
    axes.set_yscale("log")
    if batches:
        axes.set_xscale("log")
        axes.set_xticks(batches, [str(batch) for batch in batches])
    axes.set_xlabel("batch size (messages per claim or call)")
    axes.set_ylabel("messages per second (log)")
    durability = peers.get("durability", {}).get("profile", "?")
    pgbench = peers.get("pgbench_tps")
    subtitle = f"PostgreSQL {durability}" + (
        f", pgbench {pgbench:,.0f} tps" if isinstance(pgbench, int | float) else ""
    )
    axes.set_title(f"Throughput against batch size ({subtitle})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small", loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# --- soak: the time series -----------------------------------------------------------------


def minutes(samples: Samples, *, middle: bool) -> list[float]:
    """Each sample's time in minutes: its window's middle (rates and
    latencies, which cover the window) or its end (readings taken then)."""
    return [(sample["t"] - (sample["window_s"] / 2 if middle else 0)) / 60 for sample in samples]


def shade_idle(axes: Any, phases: Phases, label: bool) -> None:
    if "idle_txn" in phases:
        start, end = phases["idle_txn"]
        axes.axvspan(
            start / 60,
            end / 60,
            color=IDLE_COLOUR,
            alpha=0.6,
            label="idle transaction" if label else None,
        )


def legend(axes: Any, twin: Any, *, loc: str) -> None:
    """One legend for the lines of ``axes`` and of its second scale ``twin``."""
    handles, labels = axes.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    axes.legend(handles + more, labels + more_labels, fontsize="small", loc=loc)


def leaf_relations(samples: Samples) -> list[str]:
    relations = samples[-1].get("relations", {})
    return [name for name, rel in relations.items() if rel.get("leaf")]


def draw_soak(soak: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    samples = soak["samples"]
    phases = soak.get("phases", {})
    middle, end = minutes(samples, middle=True), minutes(samples, middle=False)
    figure, (rates, latency, dead) = plt.subplots(3, 1, figsize=(10, 11), sharex=True)
    plot_rates(rates, soak, middle=middle, end=end)
    plot_latency(latency, samples, phases, middle)
    plot_dead_tuples(dead, samples, phases, end)
    for axes in (rates, latency, dead):
        axes.set_xlim(0, end[-1])
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_rates(axes: Any, soak: dict[str, Any], *, middle: list[float], end: list[float]) -> None:
    """Published and acked per second, the backlog on a second scale, and
    the chart's title: the rate offered and the table's layout."""
    samples = soak["samples"]
    shade_idle(axes, soak.get("phases", {}), label=True)
    axes.plot(middle, [s["published_per_s"] for s in samples], label="published/s")
    axes.plot(middle, [s["acked_per_s"] for s in samples], label="acked/s")
    axes.set_ylabel("messages per second")
    axes.set_ylim(bottom=0)
    backlog = axes.twinx()
    waiting = [s["backlog"] for s in samples]
    backlog.plot(end, waiting, color="grey", linestyle=":", label="backlog")
    backlog.set_ylabel("backlog (TBDL + DLNG)")
    backlog.set_ylim(0, max(10, max(waiting) * 1.05))
    legend(axes, backlog, loc="center left")
    rate = soak.get("rate_msgs_per_s")
    axes.set_title(
        f"Soak: {rate:,.0f} msgs/s offered"
        + (
            f" (70 % of {soak['drain_msgs_per_s']:,.0f} drained)"
            if soak.get("drain_msgs_per_s")
            else ""
        )
        + f", broker_message {soak.get('layout', '?')}",
        fontsize="medium",
    )


def plot_latency(axes: Any, samples: Samples, phases: Phases, middle: list[float]) -> None:
    """Publish-to-ack p50, p95 and p99 of each window, on a log scale."""
    shade_idle(axes, phases, label=False)
    for key, label in (("p50_ms", "p50"), ("p95_ms", "p95"), ("p99_ms", "p99")):
        axes.plot(middle, [s[key] for s in samples], label=label)
    axes.set_yscale("log")
    axes.set_ylabel("publish to ack, ms (log)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small", loc="upper left")


def plot_dead_tuples(axes: Any, samples: Samples, phases: Phases, end: list[float]) -> None:
    """Dead tuples of the table (and of each partition, when there are
    several), and its size on a second scale."""
    shade_idle(axes, phases, label=False)
    axes.plot(end, [s["dead_tuples"] for s in samples], label="dead tuples", color="C3")
    leaves = leaf_relations(samples)
    if len(leaves) > 1:
        for name in leaves:
            axes.plot(
                end,
                [s["relations"][name]["dead_tuples"] for s in samples],
                linestyle="--",
                linewidth=1,
                label=f"dead tuples {name}",
            )
    axes.set_ylabel("dead tuples")
    axes.set_ylim(bottom=0)
    size = axes.twinx()
    size.plot(end, [s["table_bytes"] / 1e6 for s in samples], color="C4", label="table size")
    size.set_ylabel("table + indexes + TOAST, MB")
    size.set_ylim(bottom=0)
    legend(axes, size, loc="upper left")
    axes.set_xlabel("minutes since publishing started")


# --- driver -----------------------------------------------------------------------------------


def read_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        log(f"{path}: none, skipped")
        return None
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def draw(bench_dir: Path, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    peers = read_json(bench_dir / PEERS_FILE)
    if peers is not None:
        draw_peers(peers, out / PEERS_PNG)
        written.append(out / PEERS_PNG)
    soak = read_json(bench_dir / SOAK_FILE)
    if soak is not None:
        draw_soak(soak, out / SOAK_PNG)
        written.append(out / SOAK_PNG)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    options = parse_args(arguments)
    if not has_matplotlib():
        return run_in_charts_venv(arguments)
    for path in draw(options.bench_dir, options.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
