"""Who may do what on which queue: the one place that decides.

A caller's role on a queue is the highest of their installation-wide role
(``console.roles.user_role``: their role group, or superuser) and the roles
their grants (``console.models.Grant``, to them or to a group of theirs)
give on the queues whose names the grant's pattern matches. A pattern is a
queue name, or a glob: ``*`` any run of characters, ``?`` any one.

Every view asks here, through the caller's ``request_access``: a queue the
caller may not see is one that does not exist (``QueueNotFound``, a 404
that says no more than for a missing queue); one they see but may not act
on is refused (``PermissionDenied``, a 403); a list holds what they see
(``Access.queues``).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, replace
from string import ascii_letters, digits
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest
from rest_framework.request import Request

from broker.errors import (
    BulkJobNotFound,
    InvalidInput,
    MessageNotFound,
    QueueNotFound,
    ReplayJobNotFound,
    RuleTableNotFound,
    ScheduleNotFound,
    SubscriptionNotFound,
)
from broker.models import (
    QUEUE_NAME_MAX_LENGTH,
    BulkJob,
    Message,
    Queue,
    ReplayJob,
    ReplaySchedule,
    RuleTable,
    Subscription,
)
from broker.pipeline.schedules import schedule_get
from broker.pipeline.selection import MessageSelection, ReplaySpec
from broker.pipeline.selectors import replay_job_get
from broker.rules import parse as parse_rules
from broker.selectors import bulk_job_get, message_get
from broker.services.queues import queue_get
from broker.services.rule_tables import rule_table_get
from broker.services.topics import subscription_get
from console.models import QUEUE_PATTERN_MAX_LENGTH, ApiToken, Grant
from console.roles import Role, user_role

NAME_CHARACTERS = frozenset(ascii_letters + digits + "._/%")
WILDCARDS = frozenset("*?")


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a queue pattern that can match a queue; None when it is."""
    if not pattern:
        return "Give a queue name, or a pattern such as ORDERS.*."
    if len(pattern) > QUEUE_PATTERN_MAX_LENGTH:
        return f"At most {QUEUE_PATTERN_MAX_LENGTH} characters."
    strange = sorted(set(pattern) - NAME_CHARACTERS - WILDCARDS)
    if strange:
        shown = " ".join(repr(character) for character in strange)
        return (
            "Use the characters of a queue name (letters, digits, . _ / %) and the "
            f"wildcards * and ?; not {shown}."
        )
    if len(pattern.replace("*", "")) > QUEUE_NAME_MAX_LENGTH:
        return f"It matches no queue: a queue name has at most {QUEUE_NAME_MAX_LENGTH} characters."
    return None


def pattern_matches(pattern: str, queue_name: str) -> bool:
    # Neither [ nor ] is in a pattern (pattern_problem), so fnmatch's
    # character classes never apply.
    return fnmatch.fnmatchcase(queue_name, pattern)


def pattern_regex(pattern: str) -> str:
    """The pattern as an anchored regular expression, in the syntax both
    Python and PostgreSQL read (for a filter on queue names)."""
    parts = {"*": ".*", "?": "."}
    return "^" + "".join(parts.get(c, re.escape(c)) for c in pattern) + "$"


def pattern_covers(outer: str, inner: str) -> bool:
    """Whether every queue name ``inner`` matches, ``outer`` matches too:
    ``outer``'s ``*`` takes any run of ``inner`` (wildcards included), its
    ``?`` one character of a name or ``inner``'s own ``?``."""
    parts = {"*": ".*", "?": "[^*]"}
    return re.fullmatch("".join(parts.get(c, re.escape(c)) for c in outer), inner) is not None


@dataclass(frozen=True)
class Access:
    """What one caller may do on queues: an installation-wide role, the
    (pattern, role) pairs of their grants, and for a narrowed token its
    pattern and role, which nothing exceeds."""

    installation: Role
    grants: tuple[tuple[str, Role], ...] = ()
    only_pattern: str = ""
    at_most: Role = Role.ADMIN

    def role_on(self, queue_name: str) -> Role:
        if self.only_pattern and not pattern_matches(self.only_pattern, queue_name):
            return Role.NONE
        granted = [role for pattern, role in self.grants if pattern_matches(pattern, queue_name)]
        return min(max([self.installation, *granted]), self.at_most)

    def may(self, role: Role, queue_name: str) -> bool:
        return self.role_on(queue_name) >= role

    @property
    def everywhere(self) -> Role:
        """The role this caller holds on every queue, whatever its name: their
        installation-wide role, or a grant on every name (``*``)."""
        if self.only_pattern and not _every_name(self.only_pattern):
            return Role.NONE
        granted = [role for pattern, role in self.grants if _every_name(pattern)]
        return min(max([self.installation, *granted]), self.at_most)

    @property
    def on_installation(self) -> Role:
        """The role this caller holds on the installation itself (users,
        groups and grants, the HA pair, topics): their installation-wide
        role, which no grant gives, through a token narrowed to no pattern."""
        if self.only_pattern and not _every_name(self.only_pattern):
            return Role.NONE
        return min(self.installation, self.at_most)

    def anywhere(self, role: Role) -> bool:
        """Whether this caller holds ``role`` on some queue (or on all): what
        a page or an endpoint asks before the queues it acts on decide."""
        if role > self.at_most:
            return False
        return self.installation >= role or any(granted >= role for _, granted in self.grants)

    def check(self, role: Role, queue_name: str) -> None:
        """Let the caller act with ``role`` on the queue, or refuse: a queue
        they may not see is not there (``QueueNotFound``, worded as the
        getters word it), one they see is refused (``PermissionDenied``)."""
        held = self.role_on(queue_name)
        if held < Role.VIEWER:
            raise QueueNotFound(f"There is no queue named {queue_name!r}.")
        if held < role:
            raise PermissionDenied(f"This needs the {role.label} role on {queue_name}.")

    def check_create(self, queue_name: str) -> None:
        """Let the caller create a queue of this name: admin on the queues
        its name will match."""
        if not self.may(Role.ADMIN, queue_name):
            raise PermissionDenied(
                f"Creating queue {queue_name} needs the admin role on the queues its name matches."
            )

    def check_message(self, role: Role, message_id: int, queue_name: str) -> None:
        """``check`` for a message on ``queue_name``: one on a queue the
        caller may not see is not there either (``MessageNotFound``)."""
        if self.role_on(queue_name) < Role.VIEWER:
            raise MessageNotFound(f"There is no message {message_id}.")
        self.check(role, queue_name)

    def holds_on_pattern(self, role: Role, pattern: str) -> bool:
        """Whether the caller holds ``role`` on every queue ``pattern`` matches."""
        if role > self.at_most or (
            self.only_pattern and not pattern_covers(self.only_pattern, pattern)
        ):
            return False
        return self.installation >= role or any(
            granted >= role and pattern_covers(granted_on, pattern)
            for granted_on, granted in self.grants
        )

    def narrowed(self, *, only_pattern: str = "", at_most: Role | None = None) -> Access:
        """This access as a token limited to ``only_pattern`` and ``at_most`` holds it."""
        return replace(
            self,
            only_pattern=only_pattern or self.only_pattern,
            at_most=min(self.at_most, at_most) if at_most is not None else self.at_most,
        )

    def queues(self, role: Role, *, field: str = "name") -> Q | None:
        """A filter (on the queue name ``field``) for the queues this caller
        holds ``role`` on; None: every queue."""
        if role > self.at_most:
            return Q(pk__in=[])
        if self.installation >= role:
            held = None
        else:
            patterns = [pattern for pattern, granted in self.grants if granted >= role]
            held = _any_of(patterns, field)
        if self.only_pattern:
            only = _any_of([self.only_pattern], field)
            return only if held is None else held & only
        return held


def _every_name(pattern: str) -> bool:
    """Whether ``pattern`` matches every queue name: ``*`` (or ``**``…)."""
    return set(pattern) == {"*"}


def messages_within(within: Q | None) -> Q | None:
    """``within`` (a filter on queues, from ``Access.queues``) as a filter on
    messages, by queue id (message_queue_id_idx)."""
    if within is None:
        return None
    return Q(queue_id__in=Queue.objects.filter(within).values("id"))


def check_messages(access: Access, role: Role, message_ids: list[int]) -> None:
    """``Access.check_message`` for each message of ``message_ids`` that
    exists (the service says which do not)."""
    rows = Message.objects.filter(id__in=message_ids).values_list("id", "queue__name")
    for message_id, queue_name in sorted(rows):
        access.check_message(role, message_id, queue_name)


def audit_within(access: Access) -> Q | None:
    """The audit events the caller may read: every one for a caller who sees
    every queue; else those of the queues they see (events of no queue, such
    as a change of a user's role, are the installation's)."""
    if access.on_installation >= Role.VIEWER:
        return None
    held = access.queues(Role.VIEWER, field="queue_name")
    return ~Q(queue_name="") if held is None else held & ~Q(queue_name="")


def rules_targets(text: str) -> tuple[list[str], bool]:
    """The queues a rules table forwards to (its rules' FWDQ), and whether
    any target is only known per message (a symbol such as ``&REPLYQ``).
    A table that does not parse forwards nowhere yet: its errors are the
    rules service's to report."""
    result = parse_rules(text)
    if result.table is None:
        return [], False
    targets = [rule.fwdq for rule in result.table.rules if rule.action == "FWD" and rule.fwdq]
    symbolic = any("&" in target for target in targets)
    return sorted({target for target in targets if "&" not in target}), symbolic


def check_targets(access: Access, role: Role, text: str) -> None:
    """Let the caller write a rules table (or a replay's rules) whose
    forwards reach only queues they hold ``role`` on; a target known only
    per message needs ``role`` on every queue."""
    targets, symbolic = rules_targets(text)
    for target in targets:
        access.check(role, target)
    if symbolic and access.everywhere < role:
        raise PermissionDenied(
            f"A rule forwards to a queue named per message: that needs the {role.label} role "
            "on every queue."
        )


def held_replay(access: Access, spec: ReplaySpec) -> ReplaySpec:
    """The replay the caller may run: operator on its source queue, on every
    queue its filter names, on its target and on its rules' targets. A
    filter that names no queue takes, for a caller whose role covers some
    queues only, the queues they operate."""
    if not access.anywhere(Role.OPERATOR):
        raise PermissionDenied("This needs the operator role.")
    if spec.source_queue:
        access.check(Role.OPERATOR, spec.source_queue)
    for name in spec.filter.queues:
        access.check(Role.OPERATOR, name)
    if spec.target_queue:
        access.check(Role.OPERATOR, spec.target_queue)
    if spec.rules_text:
        check_targets(access, Role.OPERATOR, spec.rules_text)
    if spec.filter.queues or access.everywhere >= Role.OPERATOR:
        return spec
    held = access.queues(Role.OPERATOR)
    names = tuple(Queue.objects.filter(held or Q()).order_by("name").values_list("name", flat=True))
    if not names:
        problem = "You hold the operator role on no queue to replay."
        raise InvalidInput(problem, field_errors={"queues": [problem]})
    return replace(spec, filter=replace(spec.filter, queues=names))


def check_replay(access: Access, spec: ReplaySpec) -> None:
    """Let the caller act on a replay already stored (run it again, fire a
    schedule of it, pause or delete it): ``held_replay`` without narrowing,
    so a replay of every queue needs the operator role on every queue."""
    if held_replay(access, spec) != spec:
        raise PermissionDenied(
            "This replay takes messages of every queue: that needs the operator role on "
            "every queue."
        )


def schedule_replay(schedule: ReplaySchedule) -> ReplaySpec:
    """What a schedule's firings replay."""
    return ReplaySpec(
        source=schedule.source,
        source_queue=schedule.source_queue,
        filter=MessageSelection.from_stored(schedule.filters),
        target_queue=schedule.target_queue,
        rules_text=schedule.rules_text,
    )


def replays_within(access: Access, user_id: int | None) -> Q | None:
    """The replay jobs (or schedules: the same fields) the caller may
    follow: every one for a caller who sees every queue; else their own, and
    those whose source and target queues (one at least named) they see."""
    if access.everywhere >= Role.VIEWER:
        return None
    source = access.queues(Role.VIEWER, field="source_queue") or Q()
    target = access.queues(Role.VIEWER, field="target_queue") or Q()
    named = ~Q(source_queue="") | ~Q(target_queue="")
    return Q(created_by_id=user_id) | (
        (Q(source_queue="") | source) & (Q(target_queue="") | target) & named
    )


def replay_job_held(request: HttpRequest | Request, job_id: int) -> ReplayJob:
    """A replay job the caller may follow (``replay_jobs_within``)."""
    job = replay_job_get(job_id=job_id)
    within = replays_within(request_access(request), request.user.pk)
    if within is None or ReplayJob.objects.filter(within, id=job.id).exists():
        return job
    raise ReplayJobNotFound(f"There is no replay job {job_id}.")


def schedule_held(request: HttpRequest | Request, schedule_id: int) -> ReplaySchedule:
    """A replay schedule the caller may follow (``replays_within``)."""
    schedule = schedule_get(schedule_id=schedule_id)
    within = replays_within(request_access(request), request.user.pk)
    if within is None or ReplaySchedule.objects.filter(within, id=schedule.id).exists():
        return schedule
    raise ScheduleNotFound(f"There is no replay schedule {schedule_id}.")


def held_schedule_parts(
    access: Access, schedule: ReplaySchedule, parts: dict[str, Any]
) -> dict[str, Any]:
    """``held_replay`` for the schedule as ``parts`` would change it; the
    parts, with the filter it would take for a caller whose role covers
    some queues only."""
    current = schedule_replay(schedule)
    changed = replace(
        current,
        source=parts.get("source", current.source),
        source_queue=parts.get("source_queue", current.source_queue),
        filter=parts.get("filter", current.filter),
        target_queue=parts.get("target_queue", current.target_queue),
        rules_text=parts.get("rules_text", current.rules_text),
    )
    held = held_replay(access, changed)
    if held.filter != changed.filter:
        parts = {**parts, "filter": held.filter}
    return parts


def rule_table_held(request: HttpRequest | Request, role: Role, table_id: int) -> RuleTable:
    """A rules table version, when the caller holds ``role`` on its
    dead-letter queue; one of a queue they may not see is not there."""
    table = rule_table_get(table_id=table_id)
    access = request_access(request)
    if access.role_on(table.queue.name) < Role.VIEWER:
        raise RuleTableNotFound(f"There is no rules table {table_id}.")
    access.check(role, table.queue.name)
    return table


def subscription_held(request: HttpRequest | Request, role: Role, name: str) -> Subscription:
    """A subscription, when the caller holds ``role`` on its queue; one on a
    queue they may not see is not there."""
    subscription = subscription_get(name=name)
    access = request_access(request)
    if access.role_on(subscription.queue.name) < Role.VIEWER:
        raise SubscriptionNotFound(f"There is no subscription named {name!r}.")
    access.check(role, subscription.queue.name)
    return subscription


def check_topic_publish(access: Access, topic_name: str) -> None:
    """Let the caller publish on the topic: operator on every queue its
    subscriptions fill (a publication may reach any of them). The refusal
    names none of them: the caller may not see them all."""
    queues = Subscription.objects.filter(topic__name=topic_name).values_list(
        "queue__name", flat=True
    )
    if not access.anywhere(Role.OPERATOR) or not all(
        access.may(Role.OPERATOR, name) for name in queues
    ):
        raise PermissionDenied(
            f"Publishing on topic {topic_name} needs the operator role on every queue its "
            "subscriptions fill."
        )


def check_bulk(access: Access, ids: list[int] | None, filters: dict[str, Any] | None) -> None:
    """Let the caller submit a bulk job (operator on every message listed),
    or refuse. A job by filter runs later, in the background, on what the
    filter selects then: a caller whose role covers some queues only must
    name one of them in the filter."""
    if ids:
        check_messages(access, Role.OPERATOR, ids)
    if filters is None:
        return
    if filters.get("queue"):
        access.check(Role.OPERATOR, filters["queue"])
    elif access.everywhere < Role.OPERATOR:
        problem = "Name a queue in the filter: your role covers some queues only."
        raise InvalidInput(problem, field_errors={"filter": [problem]})


def job_held(request: HttpRequest | Request, job_id: int) -> BulkJob:
    """A bulk job the caller may follow: their own, one on a queue they
    see, or any for a caller who sees every queue."""
    job = bulk_job_get(job_id=job_id)
    access = request_access(request)
    queue = job.filters.get("queue", "") if isinstance(job.filters, dict) else ""
    if (
        access.everywhere >= Role.VIEWER
        or job.created_by_id == request.user.pk
        or (queue and access.may(Role.VIEWER, queue))
    ):
        return job
    raise BulkJobNotFound(f"There is no job {job_id}.")


def _any_of(patterns: list[str], field: str) -> Q:
    if not patterns:
        return Q(pk__in=[])
    return Q(**{f"{field}__regex": "|".join(f"({pattern_regex(p)})" for p in patterns)})


def queue_held(request: HttpRequest | Request, role: Role, name: str) -> Queue:
    """The queue ``name``, when the caller holds ``role`` on it (``Access.check``)."""
    request_access(request).check(role, name)
    return queue_get(name=name)


def message_held(request: HttpRequest | Request, role: Role, message_id: int) -> Message:
    """The message, when the caller holds ``role`` on its queue."""
    message = message_get(message_id=message_id)
    request_access(request).check_message(role, message_id, message.queue.name)
    return message


def request_access(request: HttpRequest | Request) -> Access:
    """The access of the request's caller: its user's, narrowed by the API
    token it signed with (DRF sets ``request.auth``)."""
    token = getattr(request, "auth", None)
    return access_of(request.user, token if isinstance(token, ApiToken) else None)


def access_of(user: AbstractBaseUser | AnonymousUser, token: ApiToken | None = None) -> Access:
    """The user's access, read once per request (cached on the user object,
    which lives for one request); through ``token``, as far as it is narrowed.
    A token holds what its user holds now: a grant taken from the user is
    taken from their tokens at once."""
    if token is not None:
        at_most = Role(token.at_most) if token.at_most is not None else None
        return access_of(user).narrowed(only_pattern=token.only_pattern, at_most=at_most)
    cached = getattr(user, "_lazaretto_access", None)
    if cached is not None:
        return cached
    installation = user_role(user)
    grants: tuple[tuple[str, Role], ...] = ()
    if user.is_authenticated and user.is_active and installation < Role.ADMIN:
        rows = Grant.objects.filter(Q(user_id=user.pk) | Q(group__user=user.pk))
        grants = tuple(
            (pattern, Role(role)) for pattern, role in rows.values_list("pattern", "role")
        )
    access = Access(installation=installation, grants=grants)
    setattr(user, "_lazaretto_access", access)  # noqa: B010
    return access
