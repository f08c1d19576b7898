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

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from broker.models import DivergedExport, Queue
from broker.services.bulk import bulk_job_submit
from broker.services.replay import ReplaySpec, replay_job_submit
from broker.services.rule_tables import rule_table_create
from broker.services.topics import subscription_create, topic_create
from console.roles import Role
from console.tokens import token_create
from tests.support.messages import blacklisted

pytestmark = pytest.mark.django_db

VIEWER, OPERATOR, ADMIN = Role.VIEWER, Role.OPERATOR, Role.ADMIN
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"

# (URL name, method, path, least role). {m} a blacklisted message, {t} a rule
# table, {r} a replay job, {j} a bulk job, {k} an API token, {x} an export of
# diverged messages.
CONSOLE: list[tuple[str, str, str, Role | None]] = [
    ("dashboard", "GET", "/", VIEWER),
    ("topics", "GET", "/topics/", VIEWER),
    ("topic-new", "POST", "/topics/new/", ADMIN),
    ("subscription-new", "POST", "/subscriptions/new/", ADMIN),
    ("subscription-edit", "GET", "/subscriptions/S1/", VIEWER),
    ("subscription-edit", "POST", "/subscriptions/S1/", ADMIN),
    ("subscription-delete", "POST", "/subscriptions/S1/delete/", ADMIN),
    ("queue", "GET", "/queues/ORDERS.IN/", VIEWER),
    ("queue-limits", "GET", "/queues/ORDERS.IN/limits/", VIEWER),
    ("queue-limits", "POST", "/queues/ORDERS.IN/limits/", ADMIN),
    ("queue-settings", "POST", "/queues/ORDERS.IN/settings/", ADMIN),
    ("queue-pause", "POST", "/queues/ORDERS.IN/pause/", OPERATOR),
    ("queue-purge", "POST", "/queues/ORDERS.IN/purge/", OPERATOR),
    ("messages", "GET", "/messages/", VIEWER),
    ("message", "GET", "/messages/{m}/", VIEWER),
    ("message-payload", "GET", "/messages/{m}/payload/", VIEWER),
    ("message-dump", "GET", "/messages/{m}/dump/", VIEWER),
    ("message-resubmit", "GET", "/messages/{m}/resubmit/", OPERATOR),
    ("message-release", "POST", "/messages/{m}/release/", OPERATOR),
    ("message-fail", "POST", "/messages/{m}/fail/", OPERATOR),
    ("message-purge", "POST", "/messages/{m}/purge/", OPERATOR),
    ("message-resubmit", "POST", "/messages/{m}/resubmit/", OPERATOR),
    ("blacklist", "GET", "/blacklist/", VIEWER),
    ("blacklist-bulk", "POST", "/blacklist/bulk/", OPERATOR),
    ("bulk-job", "GET", "/jobs/{j}/", VIEWER),
    ("audit", "GET", "/audit/", VIEWER),
    ("tokens", "GET", "/tokens/", VIEWER),
    ("tokens", "POST", "/tokens/", VIEWER),
    ("token-revoke", "POST", "/tokens/{k}/revoke/", VIEWER),
    ("replay-jobs", "GET", "/replay/", VIEWER),
    ("replay-new", "GET", "/replay/new/", OPERATOR),
    ("replay-new", "POST", "/replay/new/", OPERATOR),
    ("replay-preview", "POST", "/replay/preview/", OPERATOR),
    ("replay-job", "GET", "/replay/{r}/", VIEWER),
    ("replay-cancel", "POST", "/replay/{r}/cancel/", OPERATOR),
    ("replay-run", "POST", "/replay/{r}/run/", OPERATOR),
    ("archive", "GET", "/archive/", VIEWER),
    ("ha", "GET", "/ha/", VIEWER),
    ("ha-switchover", "POST", "/ha/switchover/", ADMIN),
    ("ha-resolve", "POST", "/ha/resolve/", ADMIN),
    ("ha-republish", "POST", "/ha/exports/{x}/republish/", ADMIN),
    ("dead-letter-queues", "GET", "/dead-letters/", VIEWER),
    ("dead-letter-queue", "GET", f"/dead-letters/{DLQ}/", VIEWER),
    ("rules-editor", "GET", f"/dead-letters/{DLQ}/rules/", VIEWER),
    ("rules-editor", "POST", f"/dead-letters/{DLQ}/rules/", VIEWER),
    ("rules-version", "GET", f"/dead-letters/{DLQ}/rules/1/", VIEWER),
    ("rules-activate", "POST", f"/dead-letters/{DLQ}/rules/1/activate/", ADMIN),
    ("rules-rollback", "POST", f"/dead-letters/{DLQ}/rules/rollback/", ADMIN),
    ("dead-letter-apply", "POST", f"/dead-letters/{DLQ}/apply/", OPERATOR),
    ("dead-letter-act", "POST", f"/dead-letters/{DLQ}/messages/{{m}}/retry/", OPERATOR),
    ("healthz", "GET", "/healthz", None),
    ("readyz", "GET", "/readyz", None),
    ("metrics", "GET", "/metrics", None),
    ("login", "GET", "/login/", None),
    ("api-docs", "GET", "/api/docs/", VIEWER),
    ("logout", "POST", "/logout/", None),
]

API: list[tuple[str, str, str, Role | None]] = [
    ("api-schema", "GET", "/api/schema/", VIEWER),
    ("api-queues", "GET", "/api/v1/queues/", VIEWER),
    ("api-queues", "POST", "/api/v1/queues/", ADMIN),
    ("api-queue", "GET", "/api/v1/queues/ORDERS.IN/", VIEWER),
    ("api-queue", "PUT", "/api/v1/queues/ORDERS.IN/", ADMIN),
    ("api-queue", "PATCH", "/api/v1/queues/ORDERS.IN/", ADMIN),
    ("api-queue-messages", "GET", "/api/v1/queues/ORDERS.IN/messages/", VIEWER),
    ("api-queue-messages", "POST", "/api/v1/queues/ORDERS.IN/messages/", OPERATOR),
    ("api-queue-pause", "POST", "/api/v1/queues/ORDERS.IN/pause/", OPERATOR),
    ("api-queue-resume", "POST", "/api/v1/queues/ORDERS.IN/resume/", OPERATOR),
    ("api-queue-purge", "POST", "/api/v1/queues/ORDERS.IN/purge/", OPERATOR),
    ("api-messages", "GET", "/api/v1/messages/", VIEWER),
    ("api-messages-bulk", "POST", "/api/v1/messages/bulk/", OPERATOR),
    ("api-message", "GET", "/api/v1/messages/{m}/", VIEWER),
    ("api-message-resubmit", "POST", "/api/v1/messages/{m}/resubmit/", OPERATOR),
    ("api-message-release", "POST", "/api/v1/messages/{m}/release/", OPERATOR),
    ("api-message-fail", "POST", "/api/v1/messages/{m}/fail/", OPERATOR),
    ("api-message-retry", "POST", "/api/v1/messages/{m}/retry/", OPERATOR),
    ("api-message-forward", "POST", "/api/v1/messages/{m}/forward/", OPERATOR),
    ("api-message-discard", "POST", "/api/v1/messages/{m}/discard/", OPERATOR),
    ("api-message-purge", "POST", "/api/v1/messages/{m}/purge/", OPERATOR),
    ("api-job", "GET", "/api/v1/jobs/{j}/", VIEWER),
    ("api-dead-letter-queue", "GET", f"/api/v1/dead-letter-queues/{DLQ}/", VIEWER),
    ("api-dead-letter-queue-apply", "POST", f"/api/v1/dead-letter-queues/{DLQ}/apply/", OPERATOR),
    ("api-audit", "GET", "/api/v1/audit/", VIEWER),
    ("api-archive", "GET", "/api/v1/archive/?queue=ORDERS.IN", VIEWER),
    ("api-tokens", "GET", "/api/v1/tokens/", VIEWER),
    ("api-tokens", "POST", "/api/v1/tokens/", VIEWER),
    ("api-token", "GET", "/api/v1/tokens/{k}/", VIEWER),
    ("api-token", "DELETE", "/api/v1/tokens/{k}/", VIEWER),
    ("api-topics", "GET", "/api/v1/topics/", VIEWER),
    ("api-topics", "POST", "/api/v1/topics/", ADMIN),
    ("api-topic", "GET", "/api/v1/topics/T1/", VIEWER),
    ("api-topic-publish", "POST", "/api/v1/topics/T1/messages/", OPERATOR),
    ("api-subscriptions", "GET", "/api/v1/subscriptions/", VIEWER),
    ("api-subscriptions", "POST", "/api/v1/subscriptions/", ADMIN),
    ("api-subscription", "GET", "/api/v1/subscriptions/S1/", VIEWER),
    ("api-subscription", "PATCH", "/api/v1/subscriptions/S1/", ADMIN),
    ("api-rule-tables", "GET", "/api/v1/rule-tables/", VIEWER),
    ("api-rule-tables", "POST", "/api/v1/rule-tables/", ADMIN),
    ("api-rule-table", "GET", "/api/v1/rule-tables/{t}/", VIEWER),
    ("api-rule-table", "PATCH", "/api/v1/rule-tables/{t}/", ADMIN),
    ("api-rule-table-validate", "POST", "/api/v1/rule-tables/{t}/validate/", VIEWER),
    ("api-rule-table-dry-run", "POST", "/api/v1/rule-tables/{t}/dry-run/", VIEWER),
    ("api-rule-table-activate", "POST", "/api/v1/rule-tables/{t}/activate/", ADMIN),
    ("api-rule-table-rollback", "POST", "/api/v1/rule-tables/rollback/", ADMIN),
    ("api-replay-jobs", "GET", "/api/v1/replay-jobs/", VIEWER),
    ("api-replay-jobs", "POST", "/api/v1/replay-jobs/", OPERATOR),
    ("api-replay-job-preview", "POST", "/api/v1/replay-jobs/preview/", OPERATOR),
    ("api-replay-job", "GET", "/api/v1/replay-jobs/{r}/", VIEWER),
    ("api-replay-job-cancel", "POST", "/api/v1/replay-jobs/{r}/cancel/", OPERATOR),
    ("api-replay-job-run", "POST", "/api/v1/replay-jobs/{r}/run/", OPERATOR),
    ("api-ha", "GET", "/api/v1/ha/", VIEWER),
    ("api-ha-switchover", "POST", "/api/v1/ha/switchover/", ADMIN),
    ("api-ha-resolve", "POST", "/api/v1/ha/resolve/", ADMIN),
    ("api-ha-export-republish", "POST", "/api/v1/ha/exports/{x}/republish/", ADMIN),
    # Deletes last: what they remove, the rows above still use.
    ("api-subscription", "DELETE", "/api/v1/subscriptions/S1/", ADMIN),
    ("api-topic", "DELETE", "/api/v1/topics/T1/", ADMIN),
    ("api-queue", "DELETE", "/api/v1/queues/OTHER.Q/", ADMIN),
]

# No broker node runs here: a switchover let through is answered 503
# ha_node_unreachable, an answer rather than a failure.
NO_NODE_ANSWERS = {"/api/v1/ha/switchover/"}

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
    return {"m": message, "t": table.id, "r": job.id, "j": bulk.id, "k": token.id, "x": export.id}


def caller(role: Role | None, api: bool) -> Client:
    client: Client = APIClient() if api else Client()
    if role is None:
        return client
    user = User.objects.create_user(username=f"{GROUPS[role]}-{int(api)}", password="x" * 12)
    user.groups.add(Group.objects.get_or_create(name=GROUPS[role])[0])
    if api:
        _, key = token_create(user=user, name="matrix")
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")  # type: ignore[attr-defined]
    else:
        client.force_login(user)
    return client


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
            failed = status >= 500 and not (status == 503 and path in NO_NODE_ANSWERS)
            if allowed and (status in (401, 403) or failed):
                wrong.append(f"{method} {path}: {status}, expected to be let through")
            elif not allowed and status not in refusal(role, api):
                wrong.append(f"{method} {path}: {status}, expected {refusal(role, api)}")
            elif not allowed and status == 302 and "/login/" not in answer["Location"]:
                wrong.append(f"{method} {path}: redirected to {answer['Location']}")
    assert wrong == []


def test_a_deactivated_users_token_and_session_are_refused(world):
    client = caller(ADMIN, api=True)
    page = caller(ADMIN, api=False)
    User.objects.filter(username__startswith="admin-").update(is_active=False)

    assert client.get("/api/v1/queues/").status_code == 401
    assert page.get("/").status_code == 302
