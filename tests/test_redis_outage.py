"""Redis gone: the API and the console carry on without what Redis gives
them (the API's rate count, the wake-ups) or answer 503 with a stable code,
never 500; what they commit stays committed and nothing is half-written.
Seen from outside, under load, in tests/test_outages.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from django.db.models.functions import Now
from django.test import RequestFactory, override_settings
from rest_framework.test import APIClient

from broker.models import (
    BulkJob,
    BulkJobStatus,
    Message,
    MessageState,
    Queue,
    ReplayJob,
    ReplayJobStatus,
)
from console.api.errors import exception_handler
from console.middleware import RefusalMiddleware
from rig.processes import RedisServer, Workers, wait_until
from tests.support.messages import blacklisted, dead_lettered
from workers.tasks import replay_job, start_jobs

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


@pytest.fixture
def redis_cache(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The cache on the test's own Redis too (database 1)."""
    location = redis_server.url.removesuffix("/0") + "/1"
    with override_settings(
        CACHES={"default": {**settings.CACHES["default"], "LOCATION": location}}
    ):
        yield redis_server


def test_a_bulk_job_whose_start_redis_refused_runs_once_redis_is_back(
    redis_cache: RedisServer,
    start_workers: Callable[..., Workers],
    operator_api: APIClient,
    orders: Queue,
) -> None:
    """Redis down for the submission: the job is queued and its start lost.
    Redis back, the start-jobs duty sends it again and the job runs."""
    ids = blacklisted(orders, 30)
    redis_cache.stop()

    submitted = operator_api.post(
        "/api/v1/messages/bulk/", {"action": "fail", "ids": ids}, format="json"
    )

    assert submitted.status_code in (201, 202), submitted.content
    job = BulkJob.objects.get(id=submitted.json()["id"])
    assert (job.status, job.start_sent_at) == (BulkJobStatus.QUEUED, None)
    redis_cache.start()
    workers = start_workers(concurrency=1, LAZARETTO_JOB_START_INTERVAL_SECONDS="0.5")
    wait_until(
        lambda: BulkJob.objects.filter(id=job.id, status=BulkJobStatus.DONE).exists(),
        timeout=30,
        what=f"the job to run; control log:\n{workers.log('control')[-2000:]}",
    )
    assert Message.objects.filter(id__in=ids, state=MessageState.FAILED).count() == 30
    assert f"bulk job {job.id}: start sent again" in workers.log("control")


def test_the_start_of_a_replay_job_redis_refused_is_sent_again_once_it_is_back(
    redis_cache: RedisServer, operator_api: APIClient, orders: Queue
) -> None:
    dead_lettered(orders, 2)
    redis_cache.stop()
    submitted = operator_api.post(
        "/api/v1/replay-jobs/", {"source": "dead_letter", "source_queue": DLQ}, format="json"
    )
    assert submitted.status_code == 201, submitted.content
    job_id = submitted.json()["id"]
    start_jobs()  # Redis still down: nothing sent, nothing lost
    assert ReplayJob.objects.get(id=job_id).start_sent_at is None
    redis_cache.start()
    ReplayJob.objects.filter(id=job_id).update(created_at=Now() - timedelta(seconds=3))

    start_jobs()

    job = ReplayJob.objects.get(id=job_id)
    assert (job.status, job.start_sent_at is not None) == (ReplayJobStatus.QUEUED, True)
    assert [task_of(sent) for sent in pipeline_tasks(redis_cache)] == [
        ("lazaretto.replay_job", [job_id])
    ]
    start_jobs()  # sent already, not yet started: not sent again
    assert len(pipeline_tasks(redis_cache)) == 1


def test_a_replay_start_that_arrives_twice_launches_no_second_driver(
    operator_api: APIClient, orders: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead_lettered(orders, 1)
    job_id = operator_api.post(
        "/api/v1/replay-jobs/", {"source": "dead_letter", "source_queue": DLQ}, format="json"
    ).json()["id"]
    launched: list[int] = []
    monkeypatch.setattr("workers.tasks.replay_job_launch", launched.append)
    ReplayJob.objects.filter(id=job_id).update(status=ReplayJobStatus.RUNNING)

    replay_job(job_id)

    assert launched == []


def pipeline_tasks(redis_server: RedisServer) -> list[dict[str, Any]]:
    """The tasks waiting on the pipeline queue (kombu's Redis list)."""
    waiting: list[bytes] = redis.Redis.from_url(redis_server.url).lrange("pipeline", 0, -1)  # type: ignore[assignment]
    return [json.loads(raw) for raw in waiting]


def task_of(sent: dict[str, Any]) -> tuple[str, list[Any]]:
    args, _kwargs, _embed = json.loads(base64.b64decode(sent["body"]))
    return sent["headers"]["task"], args


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
