"""An alert's threshold and readings in their unit: ``{{ value|reading:condition }}``."""

from __future__ import annotations

from django import template

from broker.models import AlertCondition

register = template.Library()

UNITS: dict[str, str] = {
    AlertCondition.OLDEST_WAITING: " s",
    AlertCondition.STALLED: " s",
    AlertCondition.DEAD_LETTER_RATE: "/min",
}


@register.filter
def reading(value: float | None, condition: str) -> str:
    """``1,204``, ``95 s`` or ``12/min``; a dash for no reading (nothing waits)."""
    if value is None:
        return "—"
    return f"{value:,.0f}{UNITS.get(condition, '')}"
