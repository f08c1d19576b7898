"""Times as the console shows them: in the active zone (the user's, see
``console.time_zones``) with that zone's name, inside a ``<time>`` whose
``datetime`` is the same moment in UTC."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from console.templatetags.ha import age

register = template.Library()

FORMAT = "%Y-%m-%d %H:%M:%S"


def zone_name(local: datetime) -> str:
    """The abbreviation when the zone has a lettered one (``CET``,
    ``UTC``), else its key (``America/Sao_Paulo`` says only ``-03``)."""
    abbreviation = local.tzname() or ""
    if abbreviation.isalpha():
        return abbreviation
    return str(getattr(local.tzinfo, "key", abbreviation))


def moment_text(value: datetime) -> str:
    """``2026-11-26 16:10:23 CET``: ``value`` in the active zone, named."""
    local = timezone.localtime(value)
    return f"{local.strftime(FORMAT)} {zone_name(local)}"


def _time(value: datetime, text: str, title: str) -> SafeString:
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', value.astimezone(UTC).isoformat(), title, text
    )


@register.filter
def moment(value: datetime | str | None) -> SafeString | str:
    """``<time datetime="…UTC…" title="Europe/Paris">2026-11-26 16:10:23
    CET</time>``; nothing for no time. A string is read as ISO 8601 (a
    time stored in JSON, such as a dead-letter header's), and shown as it
    is when it is none."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return value
        value = parsed.replace(tzinfo=UTC) if timezone.is_naive(parsed) else parsed
    if value is None:
        return ""
    return _time(value, moment_text(value), timezone.get_current_timezone_name())


@register.filter
def header_value(value: object, name: str) -> SafeString | object:
    """A dead-letter header's value: its time as a moment, the rest as it is."""
    return moment(value) if name == "time" and isinstance(value, str) else value


@register.filter
def moment_age(value: datetime | None) -> SafeString | str:
    """``value`` as an age ("3 min ago"), the full moment in its title;
    "never" for no time."""
    if value is None:
        return "never"
    return _time(value, age(value), moment_text(value))
