"""Each user's time zone: the one every time in the console is shown in."""

from __future__ import annotations

from typing import Any, cast
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.forms.utils import flatatt
from django.http import HttpResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views.decorators.http import require_http_methods

from console.roles import Role
from console.time_zones import time_zone_names, time_zone_set
from console.views.common import HtmxHttpRequest, page, role_required


class ZoneSelect(forms.Select):
    """A select of some six hundred zones, its options written in one go:
    Django's select renders a template for each option, 85 ms a page."""

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        chosen = self.format_value(value)
        options = format_html_join(
            "",
            '<option value="{}"{}>{}</option>',
            (
                (key, " selected" if str(key) in chosen else "", label)
                for key, label in self.choices
            ),
        )
        attributes = flatatt(self.build_attrs(self.attrs, attrs))
        return format_html('<select name="{}"{}>{}</select>', name, attributes, options)


class TimeZoneForm(forms.Form):
    time_zone = forms.ChoiceField(
        widget=ZoneSelect,
        label="Time zone",
        help_text="Every time in the console is shown in this zone, named after it.",
        error_messages={
            "invalid_choice": "%(value)s is not a time zone: choose one of the list "
            "(an IANA name such as Europe/Paris)."
        },
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = cast(forms.ChoiceField, self.fields["time_zone"])
        field.choices = [(name, name) for name in time_zone_names()]


@require_http_methods(["GET", "POST"])
@role_required(Role.VIEWER)
def time_zone(request: HtmxHttpRequest) -> HttpResponse:
    """Any signed-in user chooses their own zone; it is kept across
    sign-outs and applies from this answer on."""
    current = timezone.get_current_timezone_name()
    form = TimeZoneForm(request.POST or None, initial={"time_zone": current})
    if request.method == "POST" and form.is_valid():
        name = form.cleaned_data["time_zone"]
        time_zone_set(user=cast(User, request.user), name=name)
        timezone.activate(ZoneInfo(name))
        messages.success(request, f"Times are now shown in {name}.")
        form = TimeZoneForm(initial={"time_zone": name})
    context = {"form": form, "now": timezone.now()}
    return page(request, "console/time_zone.html", "time-zone", context)
