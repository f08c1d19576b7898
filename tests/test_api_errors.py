"""Broker errors as API answers: every NotFound, whatever its class, is 404
with its own stable code."""

from __future__ import annotations

import pytest
from rest_framework.response import Response

from broker import errors
from console.api.errors import exception_handler


class WidgetNotFound(errors.NotFound):
    """A NotFound that no status table lists."""

    code = "widget_not_found"


def answer(error: errors.BrokerError) -> Response:
    response = exception_handler(error, {})
    assert response is not None
    return response


def test_a_not_found_the_status_table_does_not_list_is_still_404_with_its_code():
    response = answer(WidgetNotFound("There is no widget 3."))

    assert response.status_code == 404
    assert response.data == {"code": "widget_not_found", "detail": "There is no widget 3."}


def test_an_unknown_bulk_job_is_404_bulk_job_not_found():
    response = answer(errors.BulkJobNotFound("There is no job 7."))

    assert (response.status_code, response.data["code"]) == (404, "bulk_job_not_found")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.QueueNotFound, "queue_not_found"),
        (errors.MessageNotFound, "message_not_found"),
        (errors.TopicNotFound, "topic_not_found"),
        (errors.SubscriptionNotFound, "subscription_not_found"),
        (errors.RuleTableNotFound, "rule_table_not_found"),
        (errors.BulkJobNotFound, "bulk_job_not_found"),
    ],
)
def test_each_not_found_error_is_a_not_found_and_keeps_its_code(error, code):
    response = answer(error("gone"))

    assert issubclass(error, errors.NotFound)
    assert (response.status_code, response.data["code"]) == (404, code)


def test_other_errors_keep_their_status():
    assert answer(errors.QueueInUse("busy")).status_code == 409
    assert answer(errors.BrokerError("odd")).status_code == 400


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/api/v1/queues/NOPE/", "queue_not_found"),
        ("/api/v1/queues/NOPE/messages/", "queue_not_found"),
        ("/api/v1/messages/999999/", "message_not_found"),
        ("/api/v1/topics/NOPE/", "topic_not_found"),
        ("/api/v1/subscriptions/NOPE/", "subscription_not_found"),
        ("/api/v1/rule-tables/999999/", "rule_table_not_found"),
    ],
)
def test_unknown_things_are_404_with_their_code(viewer_api, path, code):
    response = viewer_api.get(path)

    assert response.status_code == 404
    assert response.json()["code"] == code
