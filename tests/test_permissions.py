"""The permission matrix: every console page and every API endpoint, for
anonymous, viewer, operator and admin, against the one table below.

A row names the least role that may make the call (None: anyone, even
signed out). Below that role the answer is a refusal: 401 for an API call
without credentials, a redirect to the login page for a console page, 403
for a signed-in user whose role is too low. At or above it the call is let
through: whatever it answers (200, 201, 400 for the empty body sent, 404,
409), it is never a refusal and never a 500. Every URL pattern must have a
row, so a new endpoint cannot ship without one."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from broker.models import DivergedExport, Queue
from broker.pipeline.replay import replay_job_submit
from broker.pipeline.schedules import ScheduleSpec, Timing, schedule_create
from broker.pipeline.selection import ReplaySpec
from broker.services.bulk import bulk_job_submit
from broker.services.rule_tables import rule_table_create
from broker.services.topics import subscription_create, topic_create
from console.grants import Grantee, grant_add
from console.roles import Role
from console.tokens import token_create
from tests.support.messages import blacklisted

pytestmark = pytest.mark.django_db

VIEWER, OPERATOR, ADMIN = Role.VIEWER, Role.OPERATOR, Role.ADMIN
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"

Row = tuple[str, str, str, Role | None]


def route(name: str, path: str, **least: Role | None) -> list[Row]:
    """A row per method of one URL: (URL name, method, path, least role)."""
    return [(name, method, path, role) for method, role in least.items()]


# route(URL name, path, METHOD=least role, ...). {m} a blacklisted message,
# {t} a rule table, {r} a replay job, {j} a bulk job, {k} an API token, {x} an
# export of diverged messages, {s} a replay schedule.
CONSOLE: list[Row] = [
    *route("dashboard", "/", GET=VIEWER),
    *route("topics", "/topics/", GET=VIEWER),
    *route("topic-new", "/topics/new/", POST=ADMIN),
    *route("subscription-new", "/subscriptions/new/", POST=ADMIN),
    *route("subscription-edit", "/subscriptions/S1/", GET=VIEWER, POST=ADMIN),
    *route("subscription-delete", "/subscriptions/S1/delete/", POST=ADMIN),
    *route("queue-new", "/queues/", POST=ADMIN),
    *route("queue", "/queues/ORDERS.IN/", GET=VIEWER),
    *route("queue-publish", "/queues/ORDERS.IN/publish/", POST=OPERATOR),
    *route("queue-limits", "/queues/ORDERS.IN/limits/", GET=VIEWER, POST=ADMIN),
    *route("queue-activity", "/queues/ORDERS.IN/activity/", GET=VIEWER),
    *route("queue-settings", "/queues/ORDERS.IN/settings/", POST=ADMIN),
    *route("queue-pause", "/queues/ORDERS.IN/pause/", POST=OPERATOR),
    *route("queue-purge", "/queues/ORDERS.IN/purge/", POST=OPERATOR),
    *route("queue-import", "/queues/ORDERS.IN/import/", POST=OPERATOR),
    *route("messages", "/messages/", GET=VIEWER),
    *route("messages-export", "/messages/export/", GET=OPERATOR),
    *route("message", "/messages/{m}/", GET=VIEWER),
    *route("message-payload", "/messages/{m}/payload/", GET=VIEWER),
    *route("message-dump", "/messages/{m}/dump/", GET=VIEWER),
    *route("message-resubmit", "/messages/{m}/resubmit/", GET=OPERATOR),
    *route("message-release", "/messages/{m}/release/", POST=OPERATOR),
    *route("message-fail", "/messages/{m}/fail/", POST=OPERATOR),
    *route("message-purge", "/messages/{m}/purge/", POST=OPERATOR),
    *route("message-resubmit", "/messages/{m}/resubmit/", POST=OPERATOR),
    *route("blacklist", "/blacklist/", GET=VIEWER),
    *route("blacklist-bulk", "/blacklist/bulk/", POST=OPERATOR),
    *route("bulk-job", "/jobs/{j}/", GET=VIEWER),
    *route("audit", "/audit/", GET=VIEWER),
    *route("tokens", "/tokens/", GET=VIEWER, POST=VIEWER),
    *route("time-zone", "/time-zone/", GET=VIEWER, POST=VIEWER),
    *route("token-revoke", "/tokens/{k}/revoke/", POST=VIEWER),
    *route("users", "/users/", GET=ADMIN, POST=ADMIN),
    *route("user-role", "/users/nobody/role/", POST=ADMIN),
    *route("grant-new", "/grants/", POST=ADMIN),
    *route("grant-remove", "/grants/999/remove/", POST=ADMIN),
    *route("groups", "/groups/", GET=ADMIN, POST=ADMIN),
    *route("group-delete", "/groups/nobody/delete/", POST=ADMIN),
    *route("group-member-add", "/groups/nobody/members/add/", POST=ADMIN),
    *route("group-member-remove", "/groups/nobody/members/remove/", POST=ADMIN),
    *route("user-deactivate", "/users/nobody/deactivate/", POST=ADMIN),
    *route("replay-jobs", "/replay/", GET=VIEWER),
    *route("replay-new", "/replay/new/", GET=OPERATOR, POST=OPERATOR),
    *route("replay-preview", "/replay/preview/", POST=OPERATOR),
    *route("replay-job", "/replay/{r}/", GET=VIEWER),
    *route("replay-cancel", "/replay/{r}/cancel/", POST=OPERATOR),
    *route("replay-run", "/replay/{r}/run/", POST=OPERATOR),
    *route("schedules", "/replay/schedules/", GET=VIEWER),
    *route("schedule-new", "/replay/schedules/new/", GET=OPERATOR, POST=OPERATOR),
    *route("schedule-firings", "/replay/schedules/firings/", GET=VIEWER),
    *route("schedule", "/replay/schedules/{s}/", GET=VIEWER),
    *route("schedule-edit", "/replay/schedules/{s}/edit/", GET=OPERATOR, POST=OPERATOR),
    *route("schedule-pause", "/replay/schedules/{s}/pause/", POST=OPERATOR),
    *route("schedule-resume", "/replay/schedules/{s}/resume/", POST=OPERATOR),
    *route("schedule-run", "/replay/schedules/{s}/run/", POST=OPERATOR),
    *route("schedule-delete", "/replay/schedules/{s}/delete/", POST=OPERATOR),
    *route("archive", "/archive/", GET=VIEWER),
    *route("ha", "/ha/", GET=VIEWER),
    *route("ha-switchover", "/ha/switchover/", POST=ADMIN),
    *route("ha-resolve", "/ha/resolve/", POST=ADMIN),
    *route("ha-republish", "/ha/exports/{x}/republish/", POST=ADMIN),
    *route("dead-letter-queues", "/dead-letters/", GET=VIEWER),
    *route("dead-letter-queue", f"/dead-letters/{DLQ}/", GET=VIEWER),
    *route("rules-editor", f"/dead-letters/{DLQ}/rules/", GET=VIEWER, POST=VIEWER),
    *route("rules-version", f"/dead-letters/{DLQ}/rules/1/", GET=VIEWER),
    *route("rules-activate", f"/dead-letters/{DLQ}/rules/1/activate/", POST=ADMIN),
    *route("rules-rollback", f"/dead-letters/{DLQ}/rules/rollback/", POST=ADMIN),
    *route("dead-letter-apply", f"/dead-letters/{DLQ}/apply/", POST=OPERATOR),
    *route("dead-letter-act", f"/dead-letters/{DLQ}/messages/{{m}}/retry/", POST=OPERATOR),
    *route("healthz", "/healthz", GET=None),
    *route("readyz", "/readyz", GET=None),
    *route("metrics", "/metrics", GET=None),
    *route("login", "/login/", GET=None),
    # Single sign-on's two steps: 404 while no issuer is configured (tests/test_sso.py).
    *route("oidc_authentication_init", "/oidc/authenticate/", GET=None),
    *route("oidc_authentication_callback", "/oidc/callback/", GET=None),
    *route("api-docs", "/api/docs/", GET=VIEWER),
    *route("api-redoc", "/api/redoc/", GET=VIEWER),
    *route("logout", "/logout/", POST=None),
]

API: list[Row] = [
    *route("api-schema", "/api/schema/", GET=VIEWER),
    *route("api-queues", "/api/v1/queues/", GET=VIEWER, POST=ADMIN),
    *route("api-queue", "/api/v1/queues/ORDERS.IN/", GET=VIEWER, PUT=ADMIN, PATCH=ADMIN),
    *route("api-queue-messages", "/api/v1/queues/ORDERS.IN/messages/", GET=VIEWER, POST=OPERATOR),
    *route("api-queue-pause", "/api/v1/queues/ORDERS.IN/pause/", POST=OPERATOR),
    *route("api-queue-resume", "/api/v1/queues/ORDERS.IN/resume/", POST=OPERATOR),
    *route("api-queue-purge", "/api/v1/queues/ORDERS.IN/purge/", POST=OPERATOR),
    *route("api-queue-import", "/api/v1/queues/ORDERS.IN/messages/import/", POST=OPERATOR),
    *route("api-messages", "/api/v1/messages/", GET=VIEWER),
    *route("api-messages-bulk", "/api/v1/messages/bulk/", POST=OPERATOR),
    *route("api-messages-export", "/api/v1/messages/export/", GET=OPERATOR),
    *route("api-message", "/api/v1/messages/{m}/", GET=VIEWER),
    *route("api-message-resubmit", "/api/v1/messages/{m}/resubmit/", POST=OPERATOR),
    *route("api-message-release", "/api/v1/messages/{m}/release/", POST=OPERATOR),
    *route("api-message-fail", "/api/v1/messages/{m}/fail/", POST=OPERATOR),
    *route("api-message-retry", "/api/v1/messages/{m}/retry/", POST=OPERATOR),
    *route("api-message-forward", "/api/v1/messages/{m}/forward/", POST=OPERATOR),
    *route("api-message-discard", "/api/v1/messages/{m}/discard/", POST=OPERATOR),
    *route("api-message-purge", "/api/v1/messages/{m}/purge/", POST=OPERATOR),
    *route("api-job", "/api/v1/jobs/{j}/", GET=VIEWER),
    *route("api-dead-letter-queue", f"/api/v1/dead-letter-queues/{DLQ}/", GET=VIEWER),
    *route(
        "api-dead-letter-queue-apply", f"/api/v1/dead-letter-queues/{DLQ}/apply/", POST=OPERATOR
    ),
    *route(
        "api-dead-letter-queue-messages", f"/api/v1/dead-letter-queues/{DLQ}/messages/", GET=VIEWER
    ),
    *route("api-audit", "/api/v1/audit/", GET=VIEWER),
    *route("api-alerts", "/api/v1/alerts/", GET=VIEWER),
    *route("api-archive", "/api/v1/archive/?queue=ORDERS.IN", GET=VIEWER),
    *route("api-grants", "/api/v1/grants/", GET=ADMIN, POST=ADMIN),
    *route("api-grant", "/api/v1/grants/999/", DELETE=ADMIN),
    *route("api-groups", "/api/v1/groups/", GET=ADMIN, POST=ADMIN),
    *route("api-group", "/api/v1/groups/nobody/", DELETE=ADMIN),
    *route("api-group-members", "/api/v1/groups/nobody/members/", POST=ADMIN),
    *route("api-group-member", "/api/v1/groups/nobody/members/x/", DELETE=ADMIN),
    *route("api-tokens", "/api/v1/tokens/", GET=VIEWER, POST=VIEWER),
    *route("api-token", "/api/v1/tokens/{k}/", GET=VIEWER, DELETE=VIEWER),
    *route("api-topics", "/api/v1/topics/", GET=VIEWER, POST=ADMIN),
    *route("api-topic", "/api/v1/topics/T1/", GET=VIEWER),
    *route("api-topic-publish", "/api/v1/topics/T1/messages/", POST=OPERATOR),
    *route("api-subscriptions", "/api/v1/subscriptions/", GET=VIEWER, POST=ADMIN),
    *route("api-subscription", "/api/v1/subscriptions/S1/", GET=VIEWER, PATCH=ADMIN),
    *route("api-rule-tables", "/api/v1/rule-tables/", GET=VIEWER, POST=ADMIN),
    *route("api-rule-table", "/api/v1/rule-tables/{t}/", GET=VIEWER, PATCH=ADMIN),
    *route("api-rule-table-validate", "/api/v1/rule-tables/{t}/validate/", POST=VIEWER),
    *route("api-rule-table-dry-run", "/api/v1/rule-tables/{t}/dry-run/", POST=VIEWER),
    *route("api-rule-table-activate", "/api/v1/rule-tables/{t}/activate/", POST=ADMIN),
    *route("api-rule-table-rollback", "/api/v1/rule-tables/rollback/", POST=ADMIN),
    *route("api-replay-jobs", "/api/v1/replay-jobs/", GET=VIEWER, POST=OPERATOR),
    *route("api-replay-job-preview", "/api/v1/replay-jobs/preview/", POST=OPERATOR),
    *route("api-replay-job", "/api/v1/replay-jobs/{r}/", GET=VIEWER),
    *route("api-replay-job-cancel", "/api/v1/replay-jobs/{r}/cancel/", POST=OPERATOR),
    *route("api-replay-job-run", "/api/v1/replay-jobs/{r}/run/", POST=OPERATOR),
    *route("api-replay-schedules", "/api/v1/replay-schedules/", GET=VIEWER, POST=OPERATOR),
    *route(
        "api-replay-schedule",
        "/api/v1/replay-schedules/{s}/",
        GET=VIEWER,
        PUT=OPERATOR,
        PATCH=OPERATOR,
    ),
    *route("api-replay-schedule-jobs", "/api/v1/replay-schedules/{s}/jobs/", GET=VIEWER),
    *route("api-replay-schedule-pause", "/api/v1/replay-schedules/{s}/pause/", POST=OPERATOR),
    *route("api-replay-schedule-resume", "/api/v1/replay-schedules/{s}/resume/", POST=OPERATOR),
    *route("api-replay-schedule-run", "/api/v1/replay-schedules/{s}/run/", POST=OPERATOR),
    *route("api-ha", "/api/v1/ha/", GET=VIEWER),
    *route("api-ha-switchover", "/api/v1/ha/switchover/", POST=ADMIN),
    *route("api-ha-resolve", "/api/v1/ha/resolve/", POST=ADMIN),
    *route("api-ha-export-republish", "/api/v1/ha/exports/{x}/republish/", POST=ADMIN),
    # Whatever else is under /api/: the JSON 404, for anyone.
    *route("api-unknown-path", "/api/v1/nothing-here/", GET=None, POST=None),
    # Deletes last: what they remove, the rows above still use.
    *route("api-replay-schedule", "/api/v1/replay-schedules/{s}/", DELETE=OPERATOR),
    *route("api-subscription", "/api/v1/subscriptions/S1/", DELETE=ADMIN),
    *route("api-topic", "/api/v1/topics/T1/", DELETE=ADMIN),
    *route("api-queue", "/api/v1/queues/OTHER.Q/", DELETE=ADMIN),
]

ROLES = {"anonymous": None, "viewer": VIEWER, "operator": OPERATOR, "admin": ADMIN}
GROUPS = {VIEWER: "viewer", OPERATOR: "operator", ADMIN: "admin"}


def url_names(patterns: list[Any]) -> set[str]:
    names: set[str] = set()
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            names |= url_names(pattern.url_patterns)
        elif isinstance(pattern, URLPattern) and pattern.name:
            names.add(pattern.name)
    return names


def test_every_url_has_a_row():
    covered = {name for name, *_ in CONSOLE + API}

    assert url_names(get_resolver().url_patterns) - covered == set()


@pytest.fixture
def world(admin) -> dict[str, int]:
    """One of everything the paths name."""
    from broker.services.queues import queue_create

    queue_create(name="ORDERS.IN", consumer="log")
    queue_create(name="OTHER.Q")
    topic = topic_create(name="T1", topic_string="orders")
    subscription_create(name="S1", topic=topic, queue_name="S1.Q", topic_filter="orders/#")
    [message] = blacklisted("ORDERS.IN", 1)
    table = rule_table_create(queue=Queue.objects.get(name=DLQ), text="ACTION(DISCARD)\n")
    job = replay_job_submit(spec=ReplaySpec(source="blacklist"), actor=admin)
    bulk = bulk_job_submit(action="fail", actor=admin, message_ids=[message])
    token, _ = token_create(user=admin, name="some token")
    export = DivergedExport.objects.create(node="B", path="/nonexistent.jsonl", messages=1)
    schedule = schedule_create(
        spec=ScheduleSpec(
            name="nightly",
            replay=ReplaySpec(source="dead_letter", source_queue=DLQ),
            timing=Timing(every_seconds=3600),
        ),
        actor=admin,
    )
    return {
        "m": message,
        "t": table.id,
        "r": job.id,
        "j": bulk.id,
        "k": token.id,
        "x": export.id,
        "s": schedule.id,
    }


def signed_in(user: User, api: bool) -> Client:
    """A client of the API with a token of ``user``'s, or of the console
    logged in as ``user``."""
    client: Client = APIClient() if api else Client()
    if api:
        _, key = token_create(user=user, name="matrix")
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")  # type: ignore[attr-defined]
    else:
        client.force_login(user)
    return client


def caller(role: Role | None, api: bool) -> Client:
    if role is None:
        return APIClient() if api else Client()
    user = User.objects.create_user(username=f"{GROUPS[role]}-{int(api)}", password="x" * 12)
    user.groups.add(Group.objects.get_or_create(name=GROUPS[role])[0])
    return signed_in(user, api)


def refusal(role: Role | None, api: bool) -> tuple[int, ...]:
    """What a caller below the row's role gets."""
    if role is None:
        return (401,) if api else (302,)
    return (403,)


@pytest.mark.parametrize("who", list(ROLES))
def test_each_role_is_let_through_or_refused_as_the_table_says(who, world):
    role = ROLES[who]
    wrong: list[str] = []
    for api, table in ((False, CONSOLE), (True, API)):
        client = caller(role, api)
        for _name, method, template, least in table:
            path = template.format(**world)
            answer = client.generic(method, path)
            allowed = least is None or (role is not None and role >= least)
            status = answer.status_code
            failed = status >= 500
            if allowed and (status in (401, 403) or failed):
                wrong.append(f"{method} {path}: {status}, expected to be let through")
            elif not allowed and status not in refusal(role, api):
                wrong.append(f"{method} {path}: {status}, expected {refusal(role, api)}")
            elif not allowed and status == 302 and "/login/" not in answer["Location"]:
                wrong.append(f"{method} {path}: redirected to {answer['Location']}")
    assert wrong == []


# What belongs to the whole installation: a role on every queue by grant is
# no role there (console.access.Access.everywhere).
INSTALLATION_WIDE = re.compile(r"^(api-)?(users?|user-.*|grants?|grant-.*|groups?|group-.*|ha.*)$")
INSTALLATION_WIDE_WRITES = {("topic-new", "POST"), ("api-topics", "POST"), ("api-topic", "DELETE")}


def granted_caller(role: Role, api: bool) -> Client:
    """A user in no role group who holds ``role`` on every queue (``*``) by grant."""
    name = f"granted-{GROUPS[role]}-{int(api)}"
    user = User.objects.create_user(username=name, password="x" * 12)
    grant_add(pattern="*", role=GROUPS[role], to=Grantee(user=name), actor=None)
    return signed_in(user, api)


@pytest.mark.parametrize("who", ["viewer", "operator", "admin"])
def test_a_role_on_every_queue_by_grant_acts_on_queues_as_the_role_does_and_not_on_the_installation(
    who, world
):
    role = ROLES[who]
    assert role is not None
    wrong: list[str] = []
    for api, table in ((False, CONSOLE), (True, API)):
        client = granted_caller(role, api)
        for name, method, template, least in table:
            path = template.format(**world)
            status = client.generic(method, path).status_code
            installation = bool(INSTALLATION_WIDE.match(name)) or (name, method) in (
                INSTALLATION_WIDE_WRITES
            )
            allowed = least is None or (role >= least and not installation)
            if allowed and (status in (401, 403) or status >= 500):
                wrong.append(f"{method} {path}: {status}, expected to be let through")
            elif not allowed and status != 403:
                wrong.append(f"{method} {path}: {status}, expected 403")
    assert wrong == []


def test_a_deactivated_users_token_and_session_are_refused(world):
    client = caller(ADMIN, api=True)
    page = caller(ADMIN, api=False)
    User.objects.filter(username__startswith="admin-").update(is_active=False)

    assert client.get("/api/v1/queues/").status_code == 401
    assert page.get("/").status_code == 302
