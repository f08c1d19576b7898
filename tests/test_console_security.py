"""Every console POST needs its CSRF token and the right role."""

from __future__ import annotations

import pytest
from django.test import Client

from broker.services.publish import NewMessage, messages_publish
from broker.services.transitions.blacklist import messages_quarantine

pytestmark = pytest.mark.django_db
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


@pytest.fixture
def paths(orders) -> list[str]:
    [message_id] = messages_publish(queue_name="ORDERS.IN", messages=[NewMessage(payload=b"x")])
    messages_quarantine(reasons={message_id: "crashed"})
    return [
        "/topics/new/",
        "/subscriptions/new/",
        "/queues/ORDERS.IN/limits/",
        "/queues/ORDERS.IN/settings/",
        "/queues/ORDERS.IN/pause/",
        "/queues/ORDERS.IN/purge/",
        f"/messages/{message_id}/release/",
        f"/messages/{message_id}/fail/",
        f"/messages/{message_id}/purge/",
        f"/messages/{message_id}/resubmit/",
        "/blacklist/bulk/",
        f"/dead-letters/{DLQ}/rules/",
        f"/dead-letters/{DLQ}/rules/rollback/",
        f"/dead-letters/{DLQ}/apply/",
        f"/dead-letters/{DLQ}/messages/{message_id}/discard/",
        "/logout/",
    ]


def test_every_post_without_the_csrf_token_is_refused(admin, paths):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin)

    refused = {path: client.post(path, {"confirmation": "ORDERS.IN"}).status_code for path in paths}

    assert refused == dict.fromkeys(paths, 403)


def test_a_viewer_posts_nothing(viewer, paths):
    client = Client()
    client.force_login(viewer)

    allowed = {path for path in paths if client.post(path).status_code != 403}

    # Viewers may check a rules table (it changes nothing) and log out.
    assert allowed == {f"/dead-letters/{DLQ}/rules/", "/logout/"}


def test_a_blank_rules_table_is_an_error_beside_the_editor(admin, db):
    client = Client()
    client.force_login(admin)

    html = client.post(
        f"/dead-letters/{DLQ}/rules/", {"text": "", "intent": "check"}
    ).content.decode()

    assert 'id="id_text-error">This field is required.<' in html
