"""Each user's time zone: the one the console shows their times in, chosen
among the IANA zones and kept in ``console.models.Preference``. The
middleware reads it for each signed-in request (one query on a unique
index), so a choice made on one device holds at once on every other."""

from __future__ import annotations

from functools import cache
from zoneinfo import available_timezones

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction

from console.models import Preference


@cache
def time_zone_names() -> tuple[str, ...]:
    """Every zone a user may choose, sorted, UTC first."""
    return ("UTC", *sorted(available_timezones() - {"UTC"}))


def time_zone_of(*, user: AbstractBaseUser | AnonymousUser) -> str:
    """The user's chosen zone, or the site's (``TIME_ZONE``) if none (or if
    the zone database no longer has theirs)."""
    site = str(settings.TIME_ZONE)
    if not user.is_authenticated:
        return site
    chosen = Preference.objects.filter(user_id=user.pk).values_list("time_zone", flat=True)
    name = chosen.first()
    return name if name in time_zone_names() else site


@transaction.atomic
def time_zone_set(*, user: AbstractBaseUser, name: str) -> Preference:
    """Keep ``name`` as the user's zone. The caller checks the name
    (``time_zone_names``)."""
    preference, _created = Preference.objects.update_or_create(
        user_id=user.pk, defaults={"time_zone": name}
    )
    return preference
