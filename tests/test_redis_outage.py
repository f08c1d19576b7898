"""Redis gone: the API and the console carry on without what Redis gives
them (the API's rate count, the wake-ups) or answer 503 with a stable code,
never 500; what they commit stays committed and nothing is half-written.
Seen from outside, under load, in tests/test_outages.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.test import RequestFactory, override_settings
from rest_framework.test import APIClient

from broker.models import BulkJob, Message, MessageState, Queue, ReplayJob, ReplayJobStatus
from console.api.errors import exception_handler
from console.middleware import RefusalMiddleware
from rig.processes import RedisServer
from tests.support.messages import dead_lettered

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


@pytest.fixture
def redis_gone(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The cache and the wake-ups on the test's own Redis, which is then
    stopped: started again at the end."""
    location = redis_server.url.removesuffix("/0") + "/1"
    with override_settings(
        CACHES={"default": {**settings.CACHES["default"], "LOCATION": location}}
    ):
        cache.set("reachable", 1)  # the cache really is that Redis, until now
        redis_server.stop()
        yield redis_server
        redis_server.start()


def test_a_publish_a_replay_a_bulk_job_and_a_sign_in_complete_without_redis(
    redis_gone: RedisServer, operator_api: APIClient, client: Any, orders: Queue
) -> None:
    """Each is answered as with Redis up: the publish is stored (the
    periodic dispatch delivers it once Redis is back), the jobs are queued
    (run again once it is back), the operator signed in."""
    dead = dead_lettered(orders, 2)

    published = operator_api.post(
        "/api/v1/queues/ORDERS.IN/messages/",
        {"messages": [{"payload": "while redis is down"}]},
        format="json",
    )
    replay = operator_api.post(
        "/api/v1/replay-jobs/", {"source": "dead_letter", "source_queue": DLQ}, format="json"
    )
    bulk = operator_api.post(
        "/api/v1/messages/bulk/", {"action": "fail", "ids": [dead[0]]}, format="json"
    )
    signed_in = client.post("/login/", {"username": "oscar", "password": "oscar-password-1"})

    assert published.status_code == 201, published.content
    [stored] = published.json()["ids"]
    assert Message.objects.get(id=stored).state == MessageState.TO_BE_DELIVERED
    assert replay.status_code == 201, replay.content
    assert ReplayJob.objects.get(id=replay.json()["id"]).status == ReplayJobStatus.QUEUED
    assert bulk.status_code in (201, 202), bulk.content
    assert BulkJob.objects.filter(id=bulk.json()["id"]).exists()
    assert (signed_in.status_code, signed_in.url) == (302, "/")


def test_each_read_of_the_console_and_the_api_answers_without_redis(
    redis_gone: RedisServer, operator_api: APIClient, client: Any, operator: Any, orders: Queue
) -> None:
    client.force_login(operator)
    for path in ("/", "/queues/ORDERS.IN/", "/messages/", "/blacklist/", "/replay/"):
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.status_code)
    for path in ("/api/v1/queues/", "/api/v1/queues/ORDERS.IN/", "/api/v1/messages/"):
        answer = operator_api.get(path)
        assert answer.status_code == 200, (path, answer.status_code, answer.content[:300])


def what_the_cache_raises() -> Exception:
    try:
        cache.get("anything")
    except Exception as error:  # what it is, is what the test reads
        return error
    raise AssertionError("the cache answered")


@pytest.mark.parametrize(
    ("path", "content_type"), [("/queues/X/", "text/html"), ("/api/v1/x/", "application/json")]
)
def test_whatever_else_needs_redis_answers_503_redis_unavailable(
    redis_gone: RedisServer, viewer: Any, path: str, content_type: str
) -> None:
    """The net under every other path: a view of the console or the API that
    meets Redis's absence uncaught answers 503 with the code, not 500."""
    request = RequestFactory().get(path)
    request.user = viewer
    middleware = RefusalMiddleware(lambda request: None)  # type: ignore[arg-type, return-value]

    response = middleware.process_exception(request, what_the_cache_raises())

    assert response is not None
    assert (response.status_code, response["Retry-After"]) == (503, "2")
    assert response["Content-Type"].startswith(content_type)
    if content_type == "application/json":
        assert json.loads(response.content)["code"] == "redis_unavailable"
    else:
        assert 'data-code="redis_unavailable"' in response.content.decode()


def test_the_api_answers_a_view_that_needs_redis_with_503_redis_unavailable(
    redis_gone: RedisServer,
) -> None:
    response = exception_handler(what_the_cache_raises(), {})

    assert response is not None
    assert (response.status_code, response["Retry-After"]) == (503, "2")
    assert response.data["code"] == "redis_unavailable"
