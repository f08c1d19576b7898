from datetime import timedelta

import pytest
from django.utils import timezone

from broker.models import Message
from tests.support.messages import quarantined

pytestmark = pytest.mark.django_db


def test_it_gets_a_message_with_its_payload(viewer_api, orders, publish):
    [message_id] = publish(orders, payload=b'{"order": 1}')

    response = viewer_api.get(f"/api/v1/messages/{message_id}/")

    assert response.status_code == 200
    body = response.json()
    assert body["id"] == message_id
    assert body["queue"] == "ORDERS.IN"
    assert body["state"] == "TBDL"
    assert body["payload"] == '{"order": 1}'
    assert body["payload_encoding"] == "string"
    assert body["dead_letter"] is None
    assert (body["crash_count"], body["timeout_count"]) == (0, 0)
    assert (body["replay_job_id"], body["replay_source_id"]) == (None, None)


def test_a_replayed_copy_names_its_job_and_source(viewer_api, orders, publish):
    source, copy = publish(orders, 2)
    Message.objects.filter(id=copy).update(replay_job_id=7, replay_source_id=source)

    body = viewer_api.get(f"/api/v1/messages/{copy}/").json()

    assert (body["replay_job_id"], body["replay_source_id"]) == (7, source)


def test_an_unknown_message_is_404(viewer_api, db):
    response = viewer_api.get("/api/v1/messages/424242/")

    assert response.status_code == 404
    assert response.json()["code"] == "message_not_found"


def test_it_lists_newest_first_with_cursor_pagination(viewer_api, orders, publish):
    ids = publish(orders, 25)

    first = viewer_api.get("/api/v1/queues/ORDERS.IN/messages/?page_size=10").json()
    second = viewer_api.get(first["next"]).json()
    third = viewer_api.get(second["next"]).json()

    seen = [m["id"] for page in (first, second, third) for m in page["results"]]
    assert seen == sorted(ids, reverse=True)
    assert third["next"] is None
    assert "payload" not in first["results"][0]
    assert first["results"][0]["payload_bytes"] == 5


def test_it_filters_by_state(viewer_api, orders, publish):
    ids = publish(orders, 6)
    quarantined(ids[:2])

    body = viewer_api.get("/api/v1/queues/ORDERS.IN/messages/?state=NDLV").json()

    assert sorted(m["id"] for m in body["results"]) == ids[:2]


def test_it_filters_by_time(viewer_api, orders, publish):
    old = publish(orders, 2)
    Message.objects.filter(id__in=old).update(created_at=timezone.now() - timedelta(days=2))
    recent = publish(orders, 3)
    since = (timezone.now() - timedelta(days=1)).isoformat()

    body = viewer_api.get("/api/v1/queues/ORDERS.IN/messages/", {"created_after": since}).json()

    assert sorted(m["id"] for m in body["results"]) == recent


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=DONE", "state"),
        ("created_after=yesterday", "created_after"),
        ("page_size=x", "page_size"),
        ("page_size=0", "page_size"),
        ("page_size=-5", "page_size"),
        ("page_size=501", "page_size"),
    ],
)
def test_bad_filters_are_field_errors(viewer_api, orders, query, field):
    response = viewer_api.get(f"/api/v1/queues/ORDERS.IN/messages/?{query}")

    assert response.status_code == 400
    assert field in response.json()["field_errors"]


def test_a_bad_cursor_is_404_json(viewer_api, orders):
    response = viewer_api.get("/api/v1/queues/ORDERS.IN/messages/?cursor=garbage")

    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
