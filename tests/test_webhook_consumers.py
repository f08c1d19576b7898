"""Webhook consumers against a real HTTP server on 127.0.0.1: what a POST
carries, its signature, the queue's timeout, and the settings that control
them through the API and the console."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace

import pytest

from broker.models import AuditEvent, Message, MessageState, Queue
from broker.services.delivery import queue_deliver
from broker.services.publish import NewMessage, messages_publish
from broker.services.queues import queue_create
from rig.processes import free_port, wait_until
from tests.support.console import QUEUE_SETTINGS_FORM, error_beside, logged_in
from tests.support.messages import on_the_dead_letter_queue
from tests.support.webhooks import WebhookServer, verified

pytestmark = pytest.mark.django_db(transaction=True)
S = MessageState
SECRET = "whsec-7f3a9c2e4b1d8a6f"


def publish_one(queue_name: str) -> int:
    [message_id] = messages_publish(
        queue_name=queue_name,
        messages=[
            NewMessage(payload=b'{"order": 7}', content_type="application/json", headers={"a": "1"})
        ],
    )
    return message_id


def test_a_2xx_answer_acknowledges_and_the_post_carries_id_attempt_and_headers(hook):
    queue_create(name="HOOK.Q", consumer=hook.url)
    message_id = publish_one("HOOK.Q")

    queue_deliver(queue_id=Message.objects.get(id=message_id).queue_id)

    assert Message.objects.get(id=message_id).state == S.DELIVERED
    [request] = hook.received
    assert request.body == b'{"order": 7}'
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["Lazaretto-Message-Id"] == str(message_id)
    assert request.headers["Lazaretto-Attempt"] == "1"
    assert request.headers["Lazaretto-Queue"] == "HOOK.Q"
    assert json.loads(request.headers["Lazaretto-Headers"]) == {"a": "1"}


@pytest.mark.parametrize("status", [500, 404, 302])
def test_any_other_status_is_a_handler_error(hook, status):
    hook.status = status
    queue = queue_create(name="HOOK.Q", consumer=hook.url)
    message_id = publish_one("HOOK.Q")

    outcome = queue_deliver(queue_id=queue.id)

    assert outcome.retried == 1
    message = Message.objects.get(id=message_id)
    assert message.state == S.TO_BE_DELIVERED
    assert f"answered HTTP {status}" in message.last_error


def test_a_refused_connection_is_a_handler_error(db):
    queue = queue_create(name="HOOK.Q", consumer=f"http://127.0.0.1:{free_port()}/nobody")
    message_id = publish_one("HOOK.Q")

    assert queue_deliver(queue_id=queue.id).retried == 1
    assert "ConnectError" in Message.objects.get(id=message_id).last_error


def test_a_receiver_that_never_answers_times_out_as_a_handler_error(silent_hook):
    queue = queue_create(name="HOOK.Q", consumer=silent_hook, webhook_timeout=0.3)
    message_id = publish_one("HOOK.Q")

    started = time.monotonic()
    assert queue_deliver(queue_id=queue.id).retried == 1
    assert time.monotonic() - started < 3
    assert "Timeout" in Message.objects.get(id=message_id).last_error


# --- signatures ---------------------------------------------------------------


def test_a_queue_with_a_secret_signs_each_post_so_the_receiver_can_verify_it(hook):
    queue_create(name="HOOK.Q", consumer=hook.url, webhook_secret=SECRET)
    message_id = publish_one("HOOK.Q")

    queue_deliver(queue_id=Queue.objects.get(name="HOOK.Q").id)

    assert Message.objects.get(id=message_id).state == S.DELIVERED
    [request] = hook.received
    assert re.fullmatch(r"sha256=[0-9a-f]{64}", request.headers["Lazaretto-Signature"])
    assert abs(int(request.headers["Lazaretto-Timestamp"]) - time.time()) < 60
    assert verified(request, SECRET)
    assert not verified(request, "another-secret-of-16-chars")
    assert not verified(replace(request, body=b'{"order": 8}'), SECRET)
    # A replay: the same request sent again ten minutes later.
    assert not verified(request, SECRET, now=time.time() + 600)


def test_a_queue_without_a_secret_posts_unsigned(hook):
    queue = queue_create(name="HOOK.Q", consumer=hook.url)
    publish_one("HOOK.Q")

    queue_deliver(queue_id=queue.id)

    [request] = hook.received
    assert "Lazaretto-Signature" not in request.headers
    assert "Lazaretto-Timestamp" not in request.headers


def test_a_changed_secret_signs_the_next_delivery(hook):
    queue = queue_create(name="HOOK.Q", consumer=hook.url, webhook_secret=SECRET)
    publish_one("HOOK.Q")
    queue_deliver(queue_id=queue.id)
    Queue.objects.filter(id=queue.id).update(webhook_secret="rotated-secret-0123456789")
    publish_one("HOOK.Q")

    queue_deliver(queue_id=queue.id)

    first, second = hook.received
    assert verified(first, SECRET)
    assert verified(second, "rotated-secret-0123456789")
    assert not verified(second, SECRET)


# --- the queue's timeout ---------------------------------------------------------


def test_a_receiver_slower_than_the_queue_timeout_is_retried_then_dead_lettered(hook):
    hook.delay = 1.0
    queue = queue_create(
        name="HOOK.Q",
        consumer=hook.url,
        webhook_timeout=0.3,
        retry_limit=1,
        retry_backoff_seconds=0,
    )
    message_id = publish_one("HOOK.Q")

    assert queue_deliver(queue_id=queue.id).retried == 1
    message = Message.objects.get(id=message_id)
    assert message.state == S.TO_BE_DELIVERED
    assert "ReadTimeout" in message.last_error

    assert queue_deliver(queue_id=queue.id).dead_lettered == 1
    message = Message.objects.get(id=message_id)
    assert message.queue.name == "SYSTEM.DEAD.LETTER.QUEUE"
    assert (message.dead_letter or {})["reason"] == "handler_error"
    assert len(hook.received) == 2


def test_each_queue_waits_as_long_as_its_own_timeout(make_hook):
    slow = make_hook()
    slow.delay = 0.6
    patient = queue_create(name="PATIENT.Q", consumer=slow.url, webhook_timeout=3)
    hasty = queue_create(name="HASTY.Q", consumer=slow.url, webhook_timeout=0.2)
    patient_id, hasty_id = publish_one("PATIENT.Q"), publish_one("HASTY.Q")

    queue_deliver(queue_id=hasty.id)
    queue_deliver(queue_id=patient.id)

    assert Message.objects.get(id=patient_id).state == S.DELIVERED
    assert Message.objects.get(id=hasty_id).state == S.TO_BE_DELIVERED
    assert "ReadTimeout" in Message.objects.get(id=hasty_id).last_error


@pytest.mark.slow
def test_celery_workers_sign_with_the_secret_and_keep_to_the_timeout(make_hook, start_workers):
    signed, slow = make_hook(), make_hook()
    slow.delay = 2.0
    queue_create(name="SIGNED.Q", consumer=signed.url, webhook_secret=SECRET)
    queue_create(name="SLOW.Q", consumer=slow.url, webhook_timeout=0.5, retry_limit=0)
    start_workers(concurrency=2)

    signed_id, slow_id = publish_one("SIGNED.Q"), publish_one("SLOW.Q")

    wait_until(
        lambda: Message.objects.get(id=signed_id).state == S.DELIVERED,
        timeout=30,
        what="the signed delivery",
    )
    [request] = signed.received
    assert verified(request, SECRET)
    dead = on_the_dead_letter_queue(slow_id, what="the slow delivery dead-lettered")
    header = dead.dead_letter or {}
    assert header["reason"] == "handler_error"
    assert "ReadTimeout" in header["error"]


# --- the settings through the API --------------------------------------------------

QUEUES = "/api/v1/queues/"


def test_the_api_takes_a_secret_and_never_returns_it(admin_api, hook):
    created = admin_api.post(
        QUEUES,
        {"name": "HOOK.Q", "consumer": hook.url, "webhook_secret": SECRET, "webhook_timeout": 2.5},
        format="json",
    )

    assert created.status_code == 201, created.json()
    answers = [
        created,
        admin_api.get(f"{QUEUES}HOOK.Q/"),
        admin_api.get(QUEUES),
        admin_api.patch(f"{QUEUES}HOOK.Q/", {"batch_size": 5}, format="json"),
    ]
    for answer in answers:
        assert SECRET not in answer.content.decode()
    body = created.json()
    assert "webhook_secret" not in body
    assert (body["webhook_signed"], body["webhook_timeout"]) == (True, 2.5)
    assert Queue.objects.get(name="HOOK.Q").webhook_secret == SECRET

    cleared = admin_api.patch(f"{QUEUES}HOOK.Q/", {"webhook_secret": ""}, format="json")

    assert cleared.json()["webhook_signed"] is False
    assert Queue.objects.get(name="HOOK.Q").webhook_secret == ""


def test_no_audit_event_holds_the_secret(admin_api, hook):
    admin_api.post(QUEUES, {"name": "HOOK.Q", "consumer": hook.url}, format="json")
    admin_api.patch(f"{QUEUES}HOOK.Q/", {"webhook_secret": SECRET}, format="json")

    event = AuditEvent.objects.get(action="queue_update")

    assert event.details["changed"] == ["webhook_secret"]
    events = json.dumps(list(AuditEvent.objects.values()), default=str)
    assert SECRET not in events


@pytest.mark.parametrize("value", [0, -1, 0.05, 300.5, "Infinity", "NaN", "soon", "", None, True])
def test_the_api_refuses_a_bad_timeout_beside_the_field(admin_api, hook, value):
    queue_create(name="HOOK.Q", consumer=hook.url)

    response = admin_api.patch(f"{QUEUES}HOOK.Q/", {"webhook_timeout": value}, format="json")

    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert "webhook_timeout" in response.json()["field_errors"]
    assert Queue.objects.get(name="HOOK.Q").webhook_timeout == 10.0


@pytest.mark.parametrize("secret", ["short", "s" * 257])
def test_the_api_refuses_a_secret_too_short_or_too_long(admin_api, hook, secret):
    response = admin_api.post(
        QUEUES, {"name": "HOOK.Q", "consumer": hook.url, "webhook_secret": secret}, format="json"
    )

    assert response.status_code == 400
    assert "webhook_secret" in response.json()["field_errors"]
    assert secret not in response.content.decode()


@pytest.mark.parametrize(
    ("secret", "taken"),
    [
        ("", True),
        ("s" * 15, False),
        ("s" * 16, True),
        (" " * 8 + "s" * 8, True),
        ("s" * 256, True),
        ("s" * 257, False),
        ("s" * 16 + "\x00", False),
    ],
    ids=["blank", "15", "16", "spaces", "256", "257", "nul"],
)
def test_the_schema_says_which_secrets_the_api_takes(admin_api, hook, secret, taken):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    stated = schema["components"]["schemas"]["QueueRequest"]["properties"]["webhook_secret"]
    assert "minLength" not in stated
    stated_takes = re.fullmatch(stated["pattern"], secret) and len(secret) <= stated["maxLength"]
    assert bool(stated_takes) is taken

    response = admin_api.post(
        QUEUES, {"name": "HOOK.Q", "consumer": hook.url, "webhook_secret": secret}, format="json"
    )

    assert (response.status_code == 201) is taken, response.content[:300]
    if taken:
        assert Queue.objects.get(name="HOOK.Q").webhook_secret == secret
    else:
        assert "webhook_secret" in response.json()["field_errors"]


# --- the settings through the console ----------------------------------------------

# The settings form as the console's queue tests fill it, for a queue with
# no description and no consumer of its own.
SETTINGS = {**QUEUE_SETTINGS_FORM, "description": "", "consumer": ""}


@pytest.fixture
def hook_queue(hook: WebhookServer) -> Queue:
    return queue_create(name="HOOK.Q", consumer=hook.url)


def post_settings(user, queue: Queue, **changes: str) -> str:
    data = {**SETTINGS, "consumer": queue.consumer, **changes}
    response = logged_in(user).post(f"/queues/{queue.name}/settings/", data, follow=True)
    return response.content.decode()


def test_an_admin_sets_the_timeout_and_a_secret_that_the_page_never_shows(admin, hook_queue):
    page = post_settings(admin, hook_queue, webhook_timeout="2.5", webhook_secret=SECRET)

    hook_queue.refresh_from_db()
    assert (hook_queue.webhook_timeout, hook_queue.webhook_secret) == (2.5, SECRET)
    assert "Settings of HOOK.Q saved." in page
    assert "A secret is set" in page
    assert SECRET not in page
    assert SECRET not in logged_in(admin).get("/queues/HOOK.Q/").content.decode()


def test_a_blank_secret_keeps_the_current_one_and_clearing_removes_it(admin, hook_queue):
    hook_queue.webhook_secret = SECRET
    hook_queue.save()

    post_settings(admin, hook_queue, batch_size="7", webhook_secret="")
    hook_queue.refresh_from_db()
    assert (hook_queue.batch_size, hook_queue.webhook_secret) == (7, SECRET)

    page = post_settings(admin, hook_queue, clear_webhook_secret="on")
    hook_queue.refresh_from_db()
    assert hook_queue.webhook_secret == ""
    assert "No secret is set" in page


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "greater than or equal to 0.1"),
        ("-2", "greater than or equal to 0.1"),
        ("301", "less than or equal to 300"),
        ("soon", "Enter a number"),
        ("", "This field is required"),
    ],
)
def test_a_bad_timeout_is_shown_beside_the_field_and_the_typed_secret_is_not_echoed(
    admin, hook_queue, value, message
):
    page = post_settings(admin, hook_queue, webhook_timeout=value, webhook_secret=SECRET)

    assert message in error_beside(page, "webhook_timeout")
    assert SECRET not in page
    hook_queue.refresh_from_db()
    assert (hook_queue.webhook_timeout, hook_queue.webhook_secret) == (10.0, "")


def test_a_bad_secret_is_shown_beside_its_field(admin, hook_queue):
    short = post_settings(admin, hook_queue, webhook_secret="tiny-secret")
    both = post_settings(admin, hook_queue, webhook_secret=SECRET, clear_webhook_secret="on")

    assert "at least 16 characters" in error_beside(short, "webhook_secret")
    assert "tiny-secret" not in short
    assert "not both" in error_beside(both, "clear_webhook_secret")
    hook_queue.refresh_from_db()
    assert hook_queue.webhook_secret == ""


def test_a_viewer_sees_whether_a_secret_is_set_but_never_the_secret(viewer, hook_queue):
    hook_queue.webhook_secret = SECRET
    hook_queue.save()

    page = logged_in(viewer).get("/queues/HOOK.Q/").content.decode()

    assert "set (webhook POSTs are signed)" in page
    assert SECRET not in page
