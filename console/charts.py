"""Small server-rendered SVG line charts: no chart library, no CDN, nothing
but numbers in the markup (templates/console/_chart.html draws them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from broker.activity import RATES, QueueActivity
from broker.models import MessageState
from broker.selectors import MinuteCounts

WIDTH, HEIGHT, PAD = 600, 120, 4


@dataclass(frozen=True)
class Series:
    # The CSS class that colours the line and its legend entry.
    name: str
    label: str
    points: str  # SVG polyline points
    # What the legend says of it: a total over the window, or a count now.
    figure: str


@dataclass(frozen=True)
class LineChart:
    title: str
    width: int
    height: int
    peak: float
    series: list[Series]
    # The first slot's start: the chart runs from there to now.
    start: datetime


def line_chart(
    title: str,
    slots: Sequence[datetime],
    lines: Sequence[tuple[str, str, Sequence[float], str]],
) -> LineChart:
    """A chart of ``lines`` (CSS name, label, one value per slot, legend
    figure) over ``slots``, every line on one scale from 0 to the peak."""
    peak = max([1.0, *(value for _, _, values, _ in lines for value in values)])
    step = (WIDTH - 2 * PAD) / max(1, len(slots) - 1)

    def points(values: Sequence[float]) -> str:
        return " ".join(
            f"{PAD + n * step:.1f},{HEIGHT - PAD - (HEIGHT - 2 * PAD) * value / peak:.1f}"
            for n, value in enumerate(values)
        )

    return LineChart(
        title=title,
        width=WIDTH,
        height=HEIGHT,
        peak=round(peak, 1),
        series=[
            Series(name, label, points(values), figure) for name, label, values, figure in lines
        ],
        start=slots[0],
    )


def rate_chart(minutes: list[MinuteCounts]) -> LineChart:
    """The dashboard's: every queue's deliveries and failures per minute."""
    return line_chart(
        "Deliveries and failures per minute over the last hour",
        [m.minute for m in minutes],
        [
            (name, name, values, f"{sum(values)} {name}")
            for name, values in (
                ("delivered", [m.delivered for m in minutes]),
                ("failed", [m.failed for m in minutes]),
            )
        ],
    )


# Delivered messages kept (DLVD) pile up until archived and would flatten
# every other line: the queue page's table gives their count.
CHARTED_STATES = [state for state in MessageState.values if state != MessageState.DELIVERED]


def activity_charts(activity: QueueActivity) -> list[LineChart]:
    """A queue page's two charts: its rates and its depth by state."""
    span = activity.window.label
    per = (
        "minute"
        if activity.window.slot_minutes == 1
        else (f"minute, averaged over {activity.window.slot_minutes} minutes")
    )
    rates = line_chart(
        f"Messages per {per}, last {span}",
        activity.slots,
        [
            (name, label, activity.rates[name], f"{activity.totals[name]} {label}")
            for name, label in RATES.items()
        ],
    )
    depths = line_chart(
        f"Messages by state, last {span}",
        activity.slots,
        [
            (
                f"state-{state.lower()}",
                state,
                activity.depths[state],
                f"{state} {activity.depths[state][-1]} now",
            )
            for state in CHARTED_STATES
        ],
    )
    return [rates, depths]
