"""The HA pair in every page: the banner the base layout shows while the
store refuses writes, and how old a heartbeat is."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

from broker.selectors import ha_alert

register = template.Library()


@register.inclusion_tag("console/_ha_banner.html")
def ha_banner() -> dict[str, Any]:
    """The maintenance or synchronising banner, or nothing: one query on the
    node table, made only when a whole page is rendered (htmx partials do
    not extend the base layout)."""
    return {"alert": ha_alert()}


@register.filter
def age(moment: datetime | None) -> str:
    """``moment`` as an age: "4 s ago", "3 min ago", "2 h ago", "5 d ago"."""
    if moment is None:
        return "never"
    seconds = max(0, int((timezone.now() - moment).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"
