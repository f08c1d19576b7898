"""The console's line charts: the numbers and the user's time zone, which
static/js/charts.js draws with uPlot (vendored in static/vendor/uplot/: no
CDN) with a time axis, a value axis, a legend and the values under the
pointer. templates/console/_chart.html puts them in the page."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from broker.activity import RATES, QueueActivity
from broker.models import MessageState
from broker.selectors import MinuteCounts


@dataclass(frozen=True)
class Series:
    # The CSS class that colours the line and its legend entry.
    name: str
    label: str
    values: list[float]
    # What the caption says of it: a total over the window, or a count now.
    figure: str


@dataclass(frozen=True)
class LineChart:
    # Names the chart in the page: its data's element is chart-<key>.
    key: str
    title: str
    series: list[Series]
    # Each value's slot, its start: the chart runs from the first to now.
    slots: list[datetime]

    @property
    def start(self) -> datetime:
        return self.slots[0]

    @property
    def element_id(self) -> str:
        return f"chart-{self.key}"

    @property
    def data(self) -> dict[str, Any]:
        """What the page's script draws (json_script): each slot as Unix
        seconds, each line's values, and the time zone to tell the times in
        (the user's, active while the page is made)."""
        return {
            "zone": timezone.get_current_timezone_name(),
            "times": [int(slot.timestamp()) for slot in self.slots],
            "series": [
                {"name": line.name, "label": line.label, "values": line.values}
                for line in self.series
            ],
        }


def line_chart(
    key: str,
    title: str,
    slots: Sequence[datetime],
    lines: Sequence[tuple[str, str, Sequence[float], str]],
) -> LineChart:
    """A chart of ``lines`` (CSS name, label, one value per slot, caption
    figure) over ``slots``."""
    return LineChart(
        key=key,
        title=title,
        series=[
            Series(name, label, [float(value) for value in values], figure)
            for name, label, values, figure in lines
        ],
        slots=list(slots),
    )


def rate_chart(minutes: list[MinuteCounts]) -> LineChart:
    """The dashboard's: every queue's deliveries and failures per minute."""
    return line_chart(
        "deliveries",
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
        "rates",
        f"Messages per {per}, last {span}",
        activity.slots,
        [
            (name, label, activity.rates[name], f"{activity.totals[name]} {label}")
            for name, label in RATES.items()
        ],
    )
    depths = line_chart(
        "states",
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
