"""The console's line charts: the numbers and the user's time zone, which
static/js/charts.js draws with uPlot (vendored in static/vendor/uplot/: no
CDN) with a time axis, a value axis, a legend and the values under the
pointer. templates/console/_chart.html puts them in the page."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from broker.activity import RATES, QueueActivity
from broker.models import MessageState, Queue
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
class Threshold:
    """An alert threshold drawn across a chart, dashed, in the colour of
    the line it watches (``name``)."""

    name: str
    label: str
    value: int


@dataclass(frozen=True)
class LineChart:
    # Names the chart in the page: its data's element is chart-<key>.
    key: str
    title: str
    series: list[Series]
    # Each value's slot, its start: the chart runs from the first to now.
    slots: list[datetime]
    thresholds: list[Threshold] = field(default_factory=list)

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
            "thresholds": [
                {"name": each.name, "label": each.label, "value": each.value}
                for each in self.thresholds
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


def activity_charts(activity: QueueActivity, queue: Queue) -> list[LineChart]:
    """A queue page's two charts: its rates and its depth by state, each
    with the queue's alert thresholds it can show."""
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
    rates.thresholds.extend(
        _thresholds(queue, [("dead_lettered", "alert_dead_letter_per_minute", "dead-lettered")])
    )
    depths.thresholds.extend(
        _thresholds(
            queue,
            [
                ("state-tbdl", "alert_waiting_above", "TBDL"),
                ("state-ndlv", "alert_blacklisted_above", "NDLV"),
            ],
        )
    )
    return [rates, depths]


def _thresholds(queue: Queue, watched: list[tuple[str, str, str]]) -> list[Threshold]:
    """The queue's thresholds among ``watched`` (line, setting, what it
    counts) that are set."""
    return [
        Threshold(name, f"alert: {what} above {value:,}", value)
        for name, setting, what in watched
        if (value := getattr(queue, setting)) is not None
    ]
