"""The console's own tables: API tokens, a user's named keys for the REST
API (only a digest of each key is stored; the key itself is shown once, when
the token is created), each user's preferences (their time zone), and
grants: a role on the queues a pattern matches, given to a user or a group."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from console.roles import Role

TOKEN_NAME_MAX_LENGTH = 100
# A queue name (48 characters) with room for the pattern's wildcards.
QUEUE_PATTERN_MAX_LENGTH = 96


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
    # A narrowed token: only the queues this pattern matches (blank: its
    # user's), at most this role (null: its user's); never more than its
    # user holds at the time of each request (console.access).
    only_pattern = models.CharField(max_length=QUEUE_PATTERN_MAX_LENGTH, blank=True)
    at_most = models.PositiveSmallIntegerField(null=True, blank=True)

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

    def get_at_most_label(self) -> str:
        """The most this token may hold (a role's name), or blank: its user's."""
        return "" if self.at_most is None else Role(self.at_most).label


class Preference(models.Model):
    """A user's own console settings, kept across sign-outs."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="console_preference"
    )
    # An IANA zone key (zoneinfo.available_timezones()); times are shown in it.
    time_zone = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.user_id}: {self.time_zone}"


class Grant(models.Model):
    """A role (console.roles.Role: viewer, operator, admin) on the queues
    whose names ``pattern`` matches (an exact name, or a glob with ``*`` and
    ``?``: console.access), given to one user or one group."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="queue_grants",
    )
    group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="queue_grants"
    )
    role = models.PositiveSmallIntegerField()
    pattern = models.CharField(max_length=QUEUE_PATTERN_MAX_LENGTH)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pattern", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=True) ^ Q(group__isnull=True),
                name="grant_to_a_user_or_a_group",
            ),
            models.CheckConstraint(condition=Q(role__gte=1, role__lte=3), name="grant_role_valid"),
            models.UniqueConstraint(fields=["user", "pattern"], name="grant_user_pattern_unique"),
            models.UniqueConstraint(fields=["group", "pattern"], name="grant_group_pattern_unique"),
        ]

    def __str__(self) -> str:
        return f"role {self.role} on {self.pattern}"

    def get_role_label(self) -> str:
        """The role's name: viewer, operator or admin."""
        return Role(self.role).label
