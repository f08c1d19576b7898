"""A small server-rendered SVG chart of the last hour's deliveries and
failures: no chart library, no CDN, nothing but numbers in the markup."""

from __future__ import annotations

from dataclasses import dataclass

from broker.selectors import MinuteCounts

WIDTH, HEIGHT, PAD = 600, 120, 4


@dataclass(frozen=True)
class RateChart:
    width: int
    height: int
    peak: int
    delivered: str  # SVG polyline points
    failed: str
    delivered_total: int
    failed_total: int


def rate_chart(minutes: list[MinuteCounts]) -> RateChart:
    peak = max([1, *(m.delivered for m in minutes), *(m.failed for m in minutes)])
    step = (WIDTH - 2 * PAD) / max(1, len(minutes) - 1)

    def points(values: list[int]) -> str:
        return " ".join(
            f"{PAD + n * step:.1f},{HEIGHT - PAD - (HEIGHT - 2 * PAD) * value / peak:.1f}"
            for n, value in enumerate(values)
        )

    return RateChart(
        width=WIDTH,
        height=HEIGHT,
        peak=peak,
        delivered=points([m.delivered for m in minutes]),
        failed=points([m.failed for m in minutes]),
        delivered_total=sum(m.delivered for m in minutes),
        failed_total=sum(m.failed for m in minutes),
    )
