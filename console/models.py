"""The console's own tables: API tokens, a user's named keys for the REST
API (only a digest of each key is stored; the key itself is shown once, when
the token is created), and each user's preferences (their time zone)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

TOKEN_NAME_MAX_LENGTH = 100


class ApiToken(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=TOKEN_NAME_MAX_LENGTH)
    # The key's first characters, to tell tokens apart in lists and logs.
    prefix = models.CharField(max_length=16)
    # SHA-256 of the key, hex. The key is 256 random bits, so a fast digest
    # is as strong as a slow one and keeps each request cheap.
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Updated at most once a minute (console.tokens.LAST_USED_EVERY).
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=Q(revoked_at__isnull=True),
                name="api_token_live_name_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) of {self.user_id}"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class Preference(models.Model):
    """A user's own console settings, kept across sign-outs."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="console_preference"
    )
    # An IANA zone key (zoneinfo.available_timezones()); times are shown in it.
    time_zone = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.user_id}: {self.time_zone}"
